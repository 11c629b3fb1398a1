// The real TanStack AI client (@tanstack/ai-client, unchanged) against a baton gateway.
//
// 1. connect(): POST /api/chat through fetchServerSentEvents; the connection is cut after a
//    few events (a fetch whose body errors), so the client must reconnect on its own with
//    Last-Event-ID and de-duplicate nothing: the gateway resends strictly after the offset.
// 2. joinRun(runId): GET ?runId&offset=-1, the whole log.
// Both chunk lists must equal the delivery log read raw afterwards, each chunk once.
//
// Env: BATON_GATEWAY_URL, BATON_JOURNAL (relative replay journal), BATON_REPLAY_DELAY.
// Prints one JSON line with what it saw; exits 1 on any mismatch.
import { fetchServerSentEvents } from '@tanstack/ai-client'

const base = process.env.BATON_GATEWAY_URL
const journal = process.env.BATON_JOURNAL ?? 'claude-stream-json/slow.jsonl'
const delay = Number(process.env.BATON_REPLAY_DELAY ?? '0.05')
const dropAfterEvents = Number(process.env.BATON_DROP_AFTER ?? '4')
const url = `${base}/api/chat`

function fail(msg, extra = {}) {
  console.log(JSON.stringify({ ok: false, error: msg, ...extra }))
  process.exit(1)
}

// A fetch whose first response body errors after `dropAfterEvents` SSE events: a lost
// connection in the middle of a run.
function droppingFetch() {
  let calls = 0
  const seen = { calls: 0, lastEventIds: [] }
  const f = async (input, init = {}) => {
    calls += 1
    seen.calls = calls
    const headers = init.headers ?? {}
    seen.lastEventIds.push(headers['Last-Event-ID'] ?? null)
    const resp = await fetch(input, init)
    if (calls !== 1 || !resp.body) return resp
    const reader = resp.body.getReader()
    let events = 0
    const body = new ReadableStream({
      async pull(controller) {
        if (events >= dropAfterEvents) {
          await reader.cancel()
          controller.error(new TypeError('connection lost (test)'))
          return
        }
        const { value, done } = await reader.read()
        if (done) { controller.close(); return }
        const text = new TextDecoder().decode(value)
        events += (text.match(/\n\n/g) ?? []).length
        controller.enqueue(value)
      },
    })
    return new Response(body, { status: resp.status, headers: resp.headers })
  }
  return { f, seen }
}

async function rawLog(runId) {
  const resp = await fetch(`${url}?runId=${encodeURIComponent(runId)}&offset=-1`)
  const text = await resp.text()
  const out = []
  for (const block of text.split('\n\n')) {
    const lines = block.split('\n')
    const id = lines.find((l) => l.startsWith('id: '))
    const data = lines.find((l) => l.startsWith('data: '))
    if (id && data) out.push({ id: id.slice(4), chunk: JSON.parse(data.slice(6)) })
  }
  if (!text.endsWith(': end\n\n')) fail('raw log did not end with the end marker')
  return out
}

// The client rewrites a chunk's `usage` into its own shape (restoreInboundUsage), so usage
// is left out of the comparison; every other field must be byte-for-byte the log's.
function comparable(chunk) {
  if (chunk === undefined) return undefined
  const { usage, ...rest } = chunk
  return rest
}

function same(a, b) {
  return JSON.stringify(comparable(a)) === JSON.stringify(comparable(b))
}

function firstDiff(a, b) {
  for (let i = 0; i < Math.max(a.length, b.length); i++) {
    if (!same(a[i], b[i])) return { index: i, got: a[i], want: b[i] }
  }
  return null
}

const threadId = `node-thread-${Date.now()}`
const runId = `node-run-${Date.now()}`
const { f, seen } = droppingFetch()
const conn = fetchServerSentEvents(url, {
  fetchClient: f,
  body: { agent: { kind: 'replay', journal, speed: 1, delay } },
  reconnect: { delayMs: 50, maxAttempts: 20 },
})

const streamed = []
const messages = [{ id: 'u1', role: 'user', parts: [{ type: 'text', content: 'go' }] }]
for await (const chunk of conn.connect(messages, undefined, new AbortController().signal, { threadId, runId })) {
  streamed.push(chunk)
}

const joined = []
for await (const chunk of conn.joinRun(runId)) joined.push(chunk)

const log = await rawLog(runId)
const logChunks = log.map((e) => e.chunk)
const types = streamed.map((c) => c.type)
if (seen.calls < 2) fail('the client never reconnected', { calls: seen.calls })
if (seen.lastEventIds[0] !== null || !seen.lastEventIds[1]) fail('reconnect did not carry Last-Event-ID', seen)
if (streamed.length !== logChunks.length || firstDiff(streamed, logChunks)) fail('streamed chunks differ from the log', { diff: firstDiff(streamed, logChunks), n: [streamed.length, logChunks.length] })
if (joined.length !== logChunks.length || firstDiff(joined, logChunks)) fail('joined chunks differ from the log', { diff: firstDiff(joined, logChunks) })
if (types[types.length - 1] !== 'RUN_FINISHED') fail('the run did not finish', { types })
console.log(JSON.stringify({
  ok: true, runId, threadId, calls: seen.calls, lastEventIds: seen.lastEventIds,
  streamed: streamed.length, joined: joined.length, log: log.length,
  text: streamed.filter((c) => c.type === 'TEXT_MESSAGE_CONTENT').map((c) => c.delta).join(''),
}))
