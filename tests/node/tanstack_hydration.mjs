// Hydration equals the live client, with @tanstack/ai-client (ChatClient, unchanged) against
// a baton gateway. For each thread of BATON_THREADS (JSON: [{"thread", "journals": [...]}]):
// 1. a ChatClient (fetchServerSentEvents, persistence: true) sends one prompt per journal,
//    each a replay run of that journal, and keeps what it built live;
// 2. a second ChatClient on the same thread (the page reloaded) hydrates: its messages must
//    equal the live ones, message for message and part for part (an id the live client made
//    up at random, `msg-<ms>-<random>`, matches any id);
// 3. with `history: {pageSize}` the reloaded client first shows the newest page only, and
//    `loadOlderMessages` until none is left gives the same messages again.
// Env: BATON_GATEWAY_URL, BATON_THREADS, BATON_PAGE (page size, default 2).
// Prints one JSON line {ok, threads: {<thread>: {live, hydrated, pages}}}; exits 1 on a mismatch.
import { ChatClient, fetchServerSentEvents } from '@tanstack/ai-client'

const url = `${process.env.BATON_GATEWAY_URL}/api/chat`
const threads = JSON.parse(process.env.BATON_THREADS)
const pageSize = Number(process.env.BATON_PAGE ?? '2')
const results = {}

function fail (msg, extra = {}) {
  console.log(JSON.stringify({ ok: false, error: msg, ...extra }))
  process.exit(1)
}
// A run that ends in RUN_ERROR (a corpus journal that failed) surfaces as the client's
// error, sometimes as a rejection nobody awaits: recorded, not a failure of this check.
const rejections = []
process.on('unhandledRejection', (err) => { rejections.push(String(err?.message ?? err)) })

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
async function waitFor (cond, what, timeoutMs = 30000) {
  const deadline = Date.now() + timeoutMs
  while (!cond()) {
    if (Date.now() > deadline) fail(`timed out waiting for ${what}`)
    await sleep(20)
  }
}

const plain = (messages) => JSON.parse(JSON.stringify(messages.map(({ createdAt, ...rest }) => rest)))
const GENERATED = /^msg-\d+-[a-z0-9]+$/
function firstDiff (live, got) {
  for (let i = 0; i < Math.max(live.length, got.length); i++) {
    if (!same([live[i]].filter(Boolean), [got[i]].filter(Boolean))) return { index: i, live: live[i], got: got[i], lengths: [live.length, got.length] }
  }
  return null
}
function same (live, got) {
  if (live.length !== got.length) return false
  return live.every((m, i) => JSON.stringify({ ...m, id: GENERATED.test(m.id) ? got[i].id : m.id }) === JSON.stringify(got[i]))
}

async function reloaded (thread, options = {}) {
  let hydrations = 0
  const fetchClient = (input, init) => { if (String(input).includes('threadId=')) hydrations += 1; return fetch(input, init) }
  const client = new ChatClient({ connection: fetchServerSentEvents(url, { fetchClient }), threadId: thread, persistence: true, ...options })
  client.attach()
  await waitFor(() => hydrations > 0 && client.getMessages().length > 0, 'the hydration')
  return client
}

for (const { thread, journals } of threads) {
  let turn = 0
  const errors = []
  const connection = fetchServerSentEvents(url, () => ({ body: { agent: { kind: 'replay', journal: journals[turn], speed: 0 } } }))
  const client = new ChatClient({ connection, threadId: thread, persistence: true })
  for (turn = 0; turn < journals.length; turn++) {
    // A journal whose run ends in RUN_ERROR rejects the send; the client keeps what it built.
    try { await client.sendMessage(`turn ${turn}`) } catch (err) { errors.push(String(err?.message ?? err)) }
  }
  const live = plain(client.getMessages())
  client.detach?.()

  const whole = await reloaded(thread)
  const hydrated = plain(whole.getMessages())
  whole.detach?.()
  if (!same(live, hydrated)) fail('the hydration differs from the live client', { thread, diff: firstDiff(live, hydrated) })

  const paged = await reloaded(thread, { history: { pageSize } })
  const first = plain(paged.getMessages())
  if (first.length !== Math.min(pageSize, live.length) || !same(live.slice(-first.length), first)) {
    fail('the first page is not the newest messages', { thread, first, live })
  }
  let pages = 1
  while (paged.getHasOlderMessages()) {
    await paged.loadOlderMessages()
    pages += 1
    if (pages > live.length + 1) fail('paging never ends', { thread })
  }
  const all = plain(paged.getMessages())
  paged.detach?.()
  if (!same(live, all)) fail('the pages put together differ from the live client', { thread, diff: firstDiff(live, all) })
  results[thread] = { messages: live.length, parts: live.map((m) => m.parts.length), pages, errors }
}
console.log(JSON.stringify({ ok: true, threads: results, rejections }))
