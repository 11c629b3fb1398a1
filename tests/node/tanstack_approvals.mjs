// A tool approval with the real TanStack AI client (@tanstack/ai-client, unchanged), in Node:
// a ChatClient sends a message to a claude-code run whose stand-in asks before a Bash command.
// The client's stream processor turns baton's `CUSTOM approval-requested` chunk into its own
// approval state (the tool-call part in state `approval-requested`, with the approval id) and
// emits its approval event; the answer goes to baton's endpoint (POST
// /api/runs/{runId}/approvals/{approvalId}), as docs/hitl.md says a TanStack page answers; the
// same stream then goes on to the tool's result and the end of the run.
//
// Env: BATON_GATEWAY_URL, BATON_API_KEY. Prints one JSON line; exits 1 on failure.
import { ChatClient, fetchServerSentEvents } from '@tanstack/ai-client'

const base = process.env.BATON_GATEWAY_URL
const auth = { Authorization: `Bearer ${process.env.BATON_API_KEY}` }
const results = {}

function fail (msg, extra = {}) {
  console.log(JSON.stringify({ ok: false, error: msg, ...results, ...extra }))
  process.exit(1)
}
process.on('uncaughtException', (err) => fail(`uncaught: ${err?.message ?? err}`))
process.on('unhandledRejection', (err) => fail(`unhandled: ${err?.message ?? err}`))

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
async function waitFor (cond, what, timeoutMs = 60000, detail = () => ({})) {
  const deadline = Date.now() + timeoutMs
  while (!cond()) {
    if (Date.now() > deadline) fail(`timed out waiting for ${what}`, detail())
    await sleep(50)
  }
}

const threadId = `ts-approval-${Date.now()}`
const client = new ChatClient({
  connection: fetchServerSentEvents(`${base}/api/chat`, {
    headers: auth, body: { agent: { kind: 'claude-code', approvals: true } }
  }),
  threadId
})
const toolParts = () => client.getMessages().flatMap((m) => m.parts.filter((p) => p.type === 'tool-call'))
const shape = () => client.getMessages().map((m) => ({ role: m.role, parts: m.parts.map((p) => [p.type, p.state, p.approval]) }))

const sending = client.sendMessage('run echo from tanstack')
await waitFor(() => toolParts().some((p) => p.state === 'approval-requested'), 'the approval state', 60000, () => ({ shape: shape() }))
const asked = toolParts().find((p) => p.state === 'approval-requested')
results.asked = { name: asked.name, approval: asked.approval, state: asked.state }
if (asked.name !== 'Bash' || !asked.approval?.id) fail('the tool-call part carries no approval id')

// Find the run (the client minted its id) and answer through baton's endpoint.
const active = await (await fetch(`${base}/api/chat/active?threadId=${encodeURIComponent(threadId)}`, { headers: auth })).json()
const answer = await fetch(`${base}/api/runs/${encodeURIComponent(active.runId)}/approvals/${encodeURIComponent(asked.approval.id)}`, {
  method: 'POST', headers: { ...auth, 'Content-Type': 'application/json' }, body: JSON.stringify({ approved: true })
})
results.answer = { status: answer.status, body: await answer.json() }
if (answer.status !== 200) fail('the answer was refused')
await sending
await waitFor(() => !client.getIsLoading(), 'the end of the stream')
const parts = toolParts()
results.end = { parts: parts.map((p) => ({ state: p.state, output: p.output })), shape: shape() }
const answered = client.getMessages().flatMap((m) => m.parts).filter((p) => p.type === 'tool-result')
results.toolResults = answered.map((p) => p.content)
if (parts.length !== 1) fail('the tool call is not there once')
if (!answered.some((p) => String(p.content).includes('from tanstack'))) fail('the approved command\'s result did not reach the client')
console.log(JSON.stringify({ ok: true, runId: active.runId, ...results }))
