// Joins from a snapshot with the stock clients, against a baton gateway.
//
// - AG-UI: HttpAgent (@ag-ui/client, unchanged: its SSE parser, event verifier and default
//   event application) reads the run's log joined from the start and from the snapshot; its
//   fetch is the only thing swapped, turning the agent's POST into the gateway's GET join.
// - TanStack: fetchServerSentEvents(...).joinRun(runId) on `/api/chat` and on
//   `/api/chat?snapshot=1` (joinRun always asks for offset=-1; the URL opts in), each chunk
//   stream applied by @tanstack/ai-client's StreamProcessor.
//
// Env: BATON_GATEWAY_URL, BATON_RUN_ID. Prints one JSON line:
// {agui: {full, snapshot}, tanstack: {full, snapshot}, chunks: {full, snapshot}} (messages; chunk counts).
import { HttpAgent } from '@ag-ui/client'
import { fetchServerSentEvents, StreamProcessor } from '@tanstack/ai-client'

const base = process.env.BATON_GATEWAY_URL
const runId = process.env.BATON_RUN_ID

async function agui(offset) {
  const url = `${base}/api/chat?runId=${encodeURIComponent(runId)}&offset=${offset}`
  const agent = new HttpAgent({
    url,
    fetch: (_u, init) => fetch(url, { method: 'GET', headers: { Accept: 'text/event-stream' }, signal: init?.signal }),
  })
  await agent.runAgent({ runId })
  return agent.messages
}

async function tanstack(path) {
  const conn = fetchServerSentEvents(`${base}${path}`)
  const processor = new StreamProcessor()
  let n = 0
  for await (const chunk of conn.joinRun(runId)) {
    n += 1
    processor.processChunk(chunk)
  }
  return [processor.getMessages(), n]
}

const [tFull, nFull] = await tanstack('/api/chat')
const [tSnap, nSnap] = await tanstack('/api/chat?snapshot=1')
const out = {
  ok: true,
  agui: { full: await agui('-1'), snapshot: await agui('snapshot') },
  tanstack: { full: tFull, snapshot: tSnap },
  chunks: { full: nFull, snapshot: nSnap },
}
console.log(JSON.stringify(out))
