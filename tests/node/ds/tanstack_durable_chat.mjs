// A TanStack AI durable chat whose durability log is a Durable Stream on DS_SERVER (baton's
// `<gateway>/ds`, or the protocol's reference server): @tanstack/ai's own
// `toServerSentEventsResponse(chat(...), { durability })` and `resumeServerSentEventsResponse`
// serve the chat from a node:http server; the sink is ./ds_durability.mjs (our stand-in for the
// unpublished `@tanstack/ai-durable-stream`, same wire contract). The model is scripted.
//
// What a user checks, asserted here (exit 1 and {"ok": false, ...} when not):
//   1. a client that reads the whole chat gets the model's chunks exactly once, in order;
//   2. a client that disconnects mid-stream and resumes with its last event id (Last-Event-ID,
//      then again with `?offset=`) gets exactly the rest, while the model was never re-run;
//   3. a late joiner (`?offset=-1`) gets everything;
//   4. the run's stream is closed and, read afterwards with @durable-streams/client from -1,
//      holds exactly the chunks the clients got.
// Prints {"ok": true, "runs": [{"runId", "url", "chunks"}...]} for the Python side to re-read.
import assert from "node:assert/strict"
import http from "node:http"
import { chat, resumeServerSentEventsResponse, toServerSentEventsResponse, RUN_ACCEPTED_EVENT } from "@tanstack/ai"
import { stream } from "@durable-streams/client"
import { dsDurability } from "./ds_durability.mjs"

const server = process.env.DS_SERVER
const DELTAS = Array.from({ length: 24 }, (_, i) => `w${i} `)
const PACE_MS = 5
const GATE_AT = 16  // the model waits for `gate` before this delta: the run is surely still open

let modelCalls = 0
let gate = Promise.resolve()

/** A text adapter that plays a fixed script, paced so a client can leave in the middle. */
const scripted = {
  kind: "text", name: "scripted", model: "scripted-1",
  async *chatStream() {
    modelCalls += 1
    const t = Date.now()
    yield { type: "RUN_STARTED", runId: "model-run", threadId: "thread-1", model: "scripted-1", timestamp: t }
    yield { type: "TEXT_MESSAGE_START", messageId: "m1", role: "assistant", model: "scripted-1", timestamp: t }
    for (const [i, delta] of DELTAS.entries()) {
      if (i === GATE_AT) await gate
      await new Promise((r) => setTimeout(r, PACE_MS))
      yield { type: "TEXT_MESSAGE_CONTENT", messageId: "m1", delta, model: "scripted-1", timestamp: Date.now() }
    }
    yield { type: "TEXT_MESSAGE_END", messageId: "m1", model: "scripted-1", timestamp: Date.now() }
    yield { type: "RUN_FINISHED", runId: "model-run", threadId: "thread-1", finishReason: "stop", model: "scripted-1", timestamp: Date.now() }
  },
  async structuredOutput() { throw new Error("not scripted") },
}

/** What a client sees of a chunk, as a short label (the test's expected sequence). */
const label = (c) => c.type === "TEXT_MESSAGE_CONTENT" ? `text:${c.delta}` : c.type === "CUSTOM" ? `custom:${c.name}` : c.type
const EXPECTED = [`custom:${RUN_ACCEPTED_EVENT}`, "RUN_STARTED", "TEXT_MESSAGE_START",
  ...DELTAS.map((d) => `text:${d}`), "TEXT_MESSAGE_END", "RUN_FINISHED"]

// The chat endpoint: POST starts a run (the client names it with ?runId), GET resumes one.
const sinks = new Map()
async function handle(request) {
  const adapter = dsDurability(request, { server, streamPrefix: "chat" })
  sinks.set(adapter.runId, adapter)
  if (request.method === "POST") {
    const messages = (await request.json()).messages
    // batch 4: chunks reach the log (and the client) four at a time, mid-run.
    return toServerSentEventsResponse(chat({ adapter: scripted, messages }), { durability: { adapter, batch: 4 } })
  }
  return resumeServerSentEventsResponse({ adapter })
}

const app = http.createServer(async (req, res) => {
  const body = req.method === "POST" ? Buffer.concat(await req.toArray()) : undefined
  const request = new Request(`http://${req.headers.host}${req.url}`, { method: req.method, headers: req.headers, body })
  const response = await handle(request)
  res.writeHead(response.status, Object.fromEntries(response.headers))
  if (!response.body) return res.end()
  const reader = response.body.getReader()
  res.on("close", () => { if (!res.writableFinished) reader.cancel().catch(() => {}) })  // the client left
  for (;;) {
    const { done, value } = await reader.read().catch(() => ({ done: true }))  // cancelled: over
    if (done) break
    res.write(value)
  }
  res.end()
})
await new Promise((r) => app.listen(0, "127.0.0.1", r))
const base = `http://127.0.0.1:${app.address().port}`

/** Read a chat response as SSE events ({id, chunk}); stop (disconnect) after `limit` events. */
async function readChat(path, init = {}, limit = Infinity) {
  const ac = new AbortController()
  const response = await fetch(`${base}${path}`, { ...init, signal: ac.signal })
  if (response.status !== 200) assert.fail(`${path}: ${response.status} ${await response.text()}`)
  const events = []
  const decoder = new TextDecoder()
  let buf = ""
  let id
  try {
    for await (const bytes of response.body) {
      buf += decoder.decode(bytes, { stream: true })
      let cut
      while ((cut = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, cut)
        buf = buf.slice(cut + 1)
        if (line.startsWith("id: ")) id = line.slice(4)
        else if (line.startsWith("data: ")) {
          events.push({ id, chunk: JSON.parse(line.slice(6)) })
          id = undefined
          if (events.length >= limit) {
            ac.abort()
            return events
          }
        }
      }
    }
  } catch (err) {
    if (!ac.signal.aborted) throw err
  }
  return events
}

const labels = (events) => events.map((e) => label(e.chunk))
const post = { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ messages: [{ role: "user", content: "hi" }] }) }
const runs = []
const tag = crypto.randomUUID().slice(0, 8)  // run ids unique to this invocation
const WHOLE = `whole-${tag}`, RESUMED = `resumed-${tag}`

async function storedRun(runId) {
  const res = await stream({ url: sinks.get(runId).url, offset: "-1", live: false, json: true })
  const records = await res.json()
  return { records, closed: res.streamClosed }
}

try {
  // 1. One client reads a whole run.
  const whole = await readChat(`/chat?runId=${WHOLE}`, post)
  assert.deepEqual(labels(whole), EXPECTED)
  assert.ok(whole.every((e) => e.id), "every event carries a resumable id")
  assert.equal(new Set(whole.map((e) => e.id)).size, whole.length)

  // 2. A client leaves after 7 events, resumes with Last-Event-ID, leaves again, resumes with
  //    ?offset=. The model is held before its 17th delta until then, so both resumes happen
  //    while the run is still being written (the stream is open).
  let release
  gate = new Promise((r) => { release = r })
  const first = await readChat(`/chat?runId=${RESUMED}`, post, 7)
  assert.deepEqual(labels(first), EXPECTED.slice(0, 7))
  const head = await fetch(sinks.get(RESUMED).url, { method: "HEAD" })
  assert.equal(head.status, 200)
  assert.equal(head.headers.get("Stream-Closed"), null, "the run is still open when the client resumes")
  const second = await readChat(`/chat?runId=${RESUMED}`, { headers: { "Last-Event-ID": first.at(-1).id } }, 9)
  assert.deepEqual(labels(second), EXPECTED.slice(7, 16))
  release()
  const rest = await readChat(`/chat?runId=${RESUMED}&offset=${encodeURIComponent(second.at(-1).id)}`)
  assert.deepEqual(labels(rest), EXPECTED.slice(16))
  assert.equal(modelCalls, 2, "resuming replays the log: the model ran once per run")

  // 3. A late joiner reads the finished run from the start.
  const joined = await readChat(`/chat?runId=${RESUMED}&offset=-1`)
  assert.deepEqual(joined.map((e) => e.chunk), [...first, ...second, ...rest].map((e) => e.chunk))

  // 4. The streams are closed and hold what the clients got, once each, in order.
  for (const [runId, got] of [[WHOLE, whole], [RESUMED, [...first, ...second, ...rest]]]) {
    const { records, closed } = await storedRun(runId)
    assert.equal(closed, true, `${runId}: stream closed`)
    assert.deepEqual(records.map((r) => r.seq), got.map((_, i) => i + 1))
    assert.deepEqual(records.map((r) => r.chunk), got.map((e) => e.chunk))
    runs.push({ runId, url: sinks.get(runId).url, chunks: got.map((e) => e.chunk) })
  }
  console.log(JSON.stringify({ ok: true, runs }))
} catch (err) {
  console.log(JSON.stringify({ ok: false, error: String(err?.stack ?? err) }))
  process.exitCode = 1
} finally {
  app.closeAllConnections()
  app.close()
}
