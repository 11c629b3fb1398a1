// Minimal tests of @tanstack/ai-client (0.33.2) alone, no baton: two ways a page reloaded
// mid-run shows another chat than an undisturbed run, both in ChatClient's rejoin
// (resumeInFlightRun), and what a server can send so that neither happens.
//
// Each case feeds one run's chunks to ChatClients through the client's own `stream` adapter:
// `live` sends the prompt and streams the chunks; a reload is a new ChatClient whose
// `joinRun` replays the same chunks from the start, as any durable server does.
//
// 1. Server persistence (`persistence: true`), a run that STARTS WITH REASONING: the
//    hydration answers the prompt and `activeRun`. resumeInFlightRun drops the trailing
//    assistant message at the replay's first REJOIN_REBUILD_TRIGGERS chunk
//    (TEXT_MESSAGE_START); reasoning is no trigger, so by then the trailing assistant message
//    is the one the replay itself built from the reasoning: the thinking part and the first
//    text message ("part 0. ") are lost (2 messages instead of 3).
// 2. Client persistence (a storage adapter: localStorage in a browser, a Map here), a run
//    of text messages each followed by a tool call: the page stored the finished messages;
//    the rejoin drops only the trailing one, and the replay's TEXT_MESSAGE_START of a stored
//    message finds it (StreamProcessor "Case 2") with fresh stream state, so its text after
//    the stored tool-result part is pushed as a new text part: "part 0. " twice.
// 3. The same replays preceded by one MESSAGES_SNAPSHOT of the run's input (the messages
//    before the run): a rebuild trigger that resets the stream state and replaces the
//    messages, so the replay rebuilds the run once, and both reloads equal the live run.
//
// Prints {ok, ...}; `ok` means both bugs are exactly as pinned and the snapshot cures both.
import { ChatClient, stream } from '@tanstack/ai-client'

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const text = (id, delta) => [
  { type: 'TEXT_MESSAGE_START', messageId: id, role: 'assistant' },
  { type: 'TEXT_MESSAGE_CONTENT', messageId: id, delta },
  { type: 'TEXT_MESSAGE_END', messageId: id }]
const tool = (id, parent) => [
  { type: 'TOOL_CALL_START', toolCallId: id, toolCallName: 'Bash', parentMessageId: parent },
  { type: 'TOOL_CALL_ARGS', toolCallId: id, delta: '{"a":1}' },
  { type: 'TOOL_CALL_END', toolCallId: id },
  { type: 'TOOL_CALL_RESULT', toolCallId: id, messageId: `${id}:r`, content: 'ok' }]
const reasoning = [
  { type: 'REASONING_START', messageId: 'r0' },
  { type: 'REASONING_MESSAGE_START', messageId: 'r0', role: 'reasoning' },
  { type: 'REASONING_MESSAGE_CONTENT', messageId: 'r0', delta: 'Let me think.' },
  { type: 'REASONING_MESSAGE_END', messageId: 'r0' },
  { type: 'REASONING_END', messageId: 'r0' }]
const run = (body) => [{ type: 'RUN_STARTED', threadId: 't', runId: 'run-1' }, ...body,
  { type: 'RUN_FINISHED', threadId: 't', runId: 'run-1' }]
const SNAPSHOT = { type: 'MESSAGES_SNAPSHOT', messages: [{ id: 'u1', role: 'user', content: 'go' }] }
const view = (messages) => JSON.stringify(messages.map((m) => ({ role: m.role, parts: m.parts.map((p) => [p.type, p.content ?? p.id]) })))

async function live (chunks) {
  const client = new ChatClient({ connection: stream(async function * () { yield * chunks }) })
  await client.sendMessage('go')
  return view(client.getMessages())
}

async function rejoined (options, replay) {
  let joined = false
  const client = new ChatClient({ threadId: 't', ...options(async function * () { joined = true; yield * replay }) })
  client.attach()
  const deadline = Date.now() + 10000
  while (!(joined && !client.getIsLoading())) {
    if (Date.now() > deadline) throw new Error('the rejoin never ended')
    await sleep(5)
  }
  const out = view(client.getMessages())
  client.detach?.()
  return out
}

// 1. Server persistence: the hydration is the prompt and the active run.
const serverPersistence = (joinRun) => ({
  persistence: true,
  connection: stream(async function * () {}, {
    hydrate: async () => ({ messages: [{ id: 'u1', role: 'user', parts: [{ type: 'text', content: 'go' }] }], activeRun: { runId: 'run-1' } }),
    joinRun,
  }),
})
const thinking = run([...reasoning, ...text('m0', 'part 0. '), ...text('m1', 'part 1. ')])
const server = {
  live: await live(thinking),
  reloaded: await rejoined(serverPersistence, thinking),
  withSnapshot: await rejoined(serverPersistence, [SNAPSHOT, ...thinking]),
}
server.bug = server.reloaded === JSON.stringify([
  { role: 'user', parts: [['text', 'go']] }, { role: 'assistant', parts: [['text', 'part 1. ']] }])

// 2. Client persistence: the first page streamed `cut` chunks, stored them, and went away
// (its connection can join, so the client stores the run to rejoin).
function memoryStorage () {
  const map = new Map()
  return { resume: () => [...map.values()].some((v) => JSON.parse(v).resume), getItem: (id) => (map.has(id) ? JSON.parse(map.get(id)) : null), setItem: (id, v) => { map.set(id, JSON.stringify(v)) }, removeItem: (id) => { map.delete(id) } }
}
const tools = run(Array.from({ length: 4 }, (_, i) => [...text(`m${i}`, `part ${i}. `), ...tool(`t${i}`, `m${i}`)]).flat())
const want = await live(tools)
const client = { live: want, rejoins: 0, duplicatedAt: [], withSnapshotDiffers: [] }
for (let cut = 1; cut < tools.length; cut++) {
  for (const snapshot of [false, true]) {
    const storage = memoryStorage()
    const page = new ChatClient({ threadId: 't', persistence: storage, connection: stream(async function * () { yield * tools.slice(0, cut); await new Promise(() => {}) }, { joinRun: async function * () {} }) })
    void page.sendMessage('go')
    const stored = Date.now() + 2000
    while (!storage.resume() && Date.now() < stored) await sleep(5)
    await sleep(20) // the page goes away a moment after its last chunk
    if (!storage.resume()) continue // it stored no run to rejoin (cut before RUN_STARTED)
    const got = await rejoined((joinRun) => ({ persistence: storage, connection: stream(async function * () {}, { joinRun }) }),
      snapshot ? [SNAPSHOT, ...tools] : tools)
    client.rejoins += 1
    if (got !== want) (snapshot ? client.withSnapshotDiffers : client.duplicatedAt).push({ cut, got })
  }
}
// Which cuts double depends on when the page stored (the client persists asynchronously),
// so: every differing rejoin only added text parts (a duplicate, never a loss), the first
// message's text doubled after its tool result (and so each stored message's but the last).
const texts = (v) => JSON.parse(v).flatMap((m) => m.parts.filter(([t]) => t === 'text').map(([, c]) => c))
const onlyAdded = ({ got }) => texts(want).every((t) => texts(got).includes(t)) && texts(got).length > texts(want).length
const doubledFirst = ({ got }) => JSON.stringify(JSON.parse(got)[1]) === JSON.stringify(
  { role: 'assistant', parts: [['text', 'part 0. '], ['tool-call', 't0'], ['tool-result', 'ok'], ['text', 'part 0. ']] })
client.bug = client.duplicatedAt.length > 0 && client.duplicatedAt.every((d) => onlyAdded(d) && doubledFirst(d))

const ok = server.bug && server.withSnapshot === server.live && client.bug && client.withSnapshotDiffers.length === 0
console.log(JSON.stringify({ ok, server, client: { ...client, duplicatedAt: client.duplicatedAt.map((d) => process.env.FULL ? d : d.cut) } }))
process.exit(ok ? 0 : 1)
