// A `StreamDurability` (the sink @tanstack/ai's durable responses write a chat run to) kept in
// a Durable Streams server: our own stand-in for `@tanstack/ai-durable-stream`'s
// `durableStream(request, { server, streamPrefix })`, which is not published on npm.
//
// It keeps that adapter's wire contract, so a server that serves this serves it too:
//   - one JSON-mode stream per run at `${server}/streams/${encodeURIComponent(prefix + "/" + runId)}`
//     (the "/" between prefix and run id travels percent-encoded, as `%2F`);
//   - created with PUT (`Content-Type: application/json`), appended with POSTs of JSON arrays of
//     `{ v: 1, seq, chunk }` records under `Producer-Id`/`-Epoch`/`-Seq`, closed with a POST
//     carrying `Stream-Closed: true`;
//   - read live over SSE from a protocol offset.
// The protocol calls go through @durable-streams/client: `DurableStream.create`, an
// `IdempotentProducer` (appends and the close, exactly once), and `stream()` (reads).
//
// An offset handed to @tanstack/ai (an SSE `id:`) is `<protocol offset>~<seq>`: read the stream
// from the protocol offset, skip the records up to `seq`. The protocol offset is at or before
// record `seq` (where its appended batch starts, or where the read that found it started), so a
// resume never starts after the record that follows.
import { DurableStream, IdempotentProducer, stream } from "@durable-streams/client"
import { resolveResumeRunId } from "@tanstack/ai"

const SEP = "~"

function cursor(protocolOffset, seq) {
  return `${protocolOffset}${SEP}${seq}`
}

function parseCursor(offset) {
  if (offset === "-1" || offset === "now") return { from: offset, seq: 0 }
  const at = offset.lastIndexOf(SEP)
  const seq = Number(offset.slice(at + 1))
  if (at <= 0 || !Number.isSafeInteger(seq) || seq < 1) throw new Error(`not an offset of this adapter: ${offset}`)
  return { from: offset.slice(0, at), seq }
}

/** The URL of a run's stream: as the unpublished adapter names it. */
export function runStreamUrl(server, prefix, runId) {
  return `${server.replace(/\/+$/, "")}/streams/${encodeURIComponent(`${prefix}/${runId}`)}`
}

/**
 * @param {Request} request - the chat request: its run id is `X-Run-Id` or `?runId` (a new one
 *   if neither), its resume offset `Last-Event-ID` or `?offset`.
 * @param {{ server: string, streamPrefix?: string }} options
 * @returns {import("@tanstack/ai").StreamDurability}
 */
export function dsDurability(request, { server, streamPrefix = "runs" }) {
  let resume = request.headers.get("Last-Event-ID")
  if (resume === null) {
    try {
      resume = new URL(request.url).searchParams.get("offset")
    } catch {
      resume = null
    }
  }
  const runId = resolveResumeRunId(request) ?? crypto.randomUUID()
  if (resume !== null) parseCursor(resume)
  const url = runStreamUrl(server, streamPrefix, runId)

  // The tail after the last write, from the server's `Stream-Next-Offset`: where the next
  // appended batch starts. Seen on the responses the client gets (PUT, producer POSTs).
  let tail = null
  const observe = async (input, init) => {
    const response = await fetch(input, init)
    const next = response.headers.get("Stream-Next-Offset")
    if (response.ok && next) tail = next
    return response
  }
  let handle = null
  let producer = null
  let producerError = null
  let nextSeq = 1
  const ensureCreated = async () => {
    if (producer) return
    handle = await DurableStream.create({ url, contentType: "application/json", fetch: observe })
    producer = new IdempotentProducer(handle, `tanstack-${runId}`, {
      fetch: observe, lingerMs: 0, maxInFlight: 1, onError: (err) => { producerError ??= err },
    })
  }

  return {
    runId,
    url,
    resumeFrom: () => resume,
    async append(chunks) {
      if (chunks.length === 0) return []
      await ensureCreated()
      const start = tail
      const records = chunks.map((chunk) => ({ v: 1, seq: nextSeq++, chunk }))
      for (const record of records) producer.append(JSON.stringify(record))
      await producer.flush()  // one POST: the batch, under the producer's next Producer-Seq
      if (producerError) throw producerError
      return records.map((r) => cursor(start, r.seq))
    },
    async close() {
      await ensureCreated()
      await producer.close()  // POST Stream-Closed: true (with the producer's headers)
      if (producerError) throw producerError
    },
    async *read(offset, signal) {
      const { from, seq } = parseCursor(offset)
      // Each record's offset names this read's start: exact enough (the record is after it),
      // and the client's item stream (which ends when the stream is closed) gives no batch
      // boundaries. (Its `subscribeJson` does, but its session is marked closed before the
      // last batch reaches the subscriber, and a bare close reaches no subscriber at all.)
      const res = await stream({ url, offset: from, live: "sse", json: true, signal })
      let delivered = seq
      try {
        for await (const record of res.jsonStream()) {
          if (signal?.aborted) return
          if (record.seq <= delivered) continue
          delivered = record.seq
          yield { offset: cursor(from, record.seq), chunk: record.chunk }
        }
      } finally {
        res.cancel()
      }
    },
    async snapshot() {
      let res
      try {
        res = await stream({ url, offset: "-1", live: false, json: true })
      } catch (err) {
        if (err?.status === 404) return []
        throw err
      }
      const items = await res.json()
      return items.map((r) => ({ offset: cursor("-1", r.seq), chunk: r.chunk }))
    },
  }
}
