// Reads a baton run's delivery log as a Durable Stream with @durable-streams/client
// (live, from the start) until the stream closes. Prints {"progress": n} after each batch,
// then {"ok": true, "items": [...], "closed": bool}. Env: BATON_DS_URL, BATON_DS_LIVE, BATON_DS_OFFSET.
import { stream } from "@durable-streams/client"

const url = process.env.BATON_DS_URL
const live = process.env.BATON_DS_LIVE || "sse"
const offset = process.env.BATON_DS_OFFSET || "-1"  // "snapshot": from the latest snapshot
const items = []
try {
  const res = await stream({ url, offset, live })
  for await (const item of res.jsonStream()) {
    items.push(item)
    console.log(JSON.stringify({ progress: items.length }))
  }
  console.log(JSON.stringify({ ok: true, items, closed: res.streamClosed, offset: res.offset }))
} catch (err) {
  console.log(JSON.stringify({ ok: false, error: String(err), items }))
  process.exit(1)
}
