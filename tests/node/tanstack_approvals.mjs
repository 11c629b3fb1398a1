// A tool approval with the real TanStack AI client (@tanstack/ai-client, unchanged), in Node:
// a ChatClient sends a message to a claude-code run whose stand-in asks before a Bash command.
//
// 1. The client's stream processor turns baton's `CUSTOM approval-requested` chunk into its
//    own approval state (the tool-call part in state `approval-requested`, with the approval
//    id) and emits its approval event (`tools:approval:requested`, counted on the client's
//    devtools bridge), each exactly once. The answer goes to baton's endpoint (POST
//    /api/runs/{runId}/approvals/{approvalId}), as docs/hitl.md says a TanStack page answers;
//    the same stream then goes on to the tool's result and the end of the run, and the client
//    sends nothing more.
// 2. TanStack's own answer, `addToolApprovalResponse`, on another thread: it marks the part
//    `approval-responded` in the client alone; baton's run still waits (nothing reached it);
//    answered through baton's endpoint, the stream ends and the client then POSTs a
//    continuation: a new run on the thread (what it does after any answered tool call).
//
// Env: BATON_GATEWAY_URL, BATON_API_KEY. Prints one JSON line; exits 1 on failure.
import { ChatClient, fetchServerSentEvents } from '@tanstack/ai-client'
import { createChatDevtoolsBridge } from '@tanstack/ai-client/devtools'

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
  while (!(await cond())) {
    if (Date.now() > deadline) fail(`timed out waiting for ${what}`, detail())
    await sleep(50)
  }
}

// Every request the clients make to /api/chat (a continuation is a second POST).
const posts = []
const realFetch = globalThis.fetch
globalThis.fetch = (input, init = {}) => {
  const url = String(input instanceof Request ? input.url : input)
  if ((init.method ?? 'GET') === 'POST' && new URL(url).pathname === '/api/chat') {
    const body = JSON.parse(init.body ?? '{}')
    posts.push({ threadId: body.threadId, runId: body.runId ?? null, messages: (body.messages ?? []).length })
  }
  return realFetch(input, init)
}
const api = (p, init = {}) => realFetch(`${base}${p}`, { ...init, headers: { ...auth, ...(init.headers ?? {}) } })

/** A stock ChatClient on a new thread, with counters of what it shows about approvals. */
function newClient (name) {
  const threadId = `ts-${name}-${Date.now()}`
  const seen = { approvalEvents: [], askChunks: 0, partStates: [] }
  const client = new ChatClient({
    connection: fetchServerSentEvents(`${base}/api/chat`, {
      headers: auth, body: { agent: { kind: 'claude-code', approvals: true } }
    }),
    threadId,
    onChunk: (c) => { if (c.type === 'CUSTOM' && c.name === 'approval-requested') seen.askChunks++ },
    onMessagesChange: (messages) => {
      const part = messages.flatMap((m) => m.parts).find((p) => p.type === 'tool-call')
      if (part && seen.partStates.at(-1) !== part.state) seen.partStates.push(part.state)
    },
    // The client's own approval event (what its devtools show), counted where it is emitted.
    devtoolsBridgeFactory: (options) => {
      const bridge = createChatDevtoolsBridge(options)
      const emit = bridge.events.approvalRequested.bind(bridge.events)
      bridge.events.approvalRequested = (streamId, messageId, toolCallId, toolName, input, approvalId, ...rest) => {
        seen.approvalEvents.push({ toolCallId, toolName, input, approvalId })
        return emit(streamId, messageId, toolCallId, toolName, input, approvalId, ...rest)
      }
      return bridge
    }
  })
  const toolParts = () => client.getMessages().flatMap((m) => m.parts.filter((p) => p.type === 'tool-call'))
  const shape = () => client.getMessages().map((m) => ({ role: m.role, parts: m.parts.map((p) => [p.type, p.state, p.approval]) }))
  return { client, threadId, seen, toolParts, shape }
}

async function activeRun (threadId) {
  return (await (await api(`/api/chat/active?threadId=${encodeURIComponent(threadId)}`)).json()).runId ?? null
}
async function answer (runId, approvalId, approved) {
  const r = await api(`/api/runs/${encodeURIComponent(runId)}/approvals/${encodeURIComponent(approvalId)}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ approved })
  })
  return { status: r.status, body: await r.json() }
}
const view = async (runId) => (await api(`/api/runs/${encodeURIComponent(runId)}`)).json()

// --- 1. the request, once; answered at baton's endpoint; the stream goes on -----------------
{
  const { client, threadId, seen, toolParts, shape } = newClient('approval')
  const sending = client.sendMessage('run echo from tanstack')
  await waitFor(() => toolParts().some((p) => p.state === 'approval-requested'), 'the approval state', 60000, () => ({ shape: shape() }))
  const asked = toolParts().find((p) => p.state === 'approval-requested')
  results.asked = { name: asked.name, approval: asked.approval, state: asked.state }
  if (asked.name !== 'Bash' || !asked.approval?.id) fail('the tool-call part carries no approval id')

  const runId = await activeRun(threadId) // the client minted the run id; the thread names it
  results.runId = runId
  results.answer = await answer(runId, asked.approval.id, true)
  if (results.answer.status !== 200) fail('the answer was refused')
  await sending
  await waitFor(() => !client.getIsLoading(), 'the end of the stream')
  const parts = toolParts()
  const answered = client.getMessages().flatMap((m) => m.parts).filter((p) => p.type === 'tool-result')
  results.end = { parts: parts.map((p) => ({ state: p.state, output: p.output })), shape: shape() }
  results.toolResults = answered.map((p) => p.content)
  results.seen = seen
  if (parts.length !== 1) fail('the tool call is not there once')
  if (!answered.some((p) => String(p.content).includes('from tanstack'))) fail('the approved command\'s result did not reach the client')
  if (seen.askChunks !== 1) fail('the client did not get the request exactly once')
  const ev = seen.approvalEvents
  if (ev.length !== 1 || ev[0].approvalId !== asked.approval.id || ev[0].toolName !== 'Bash' ||
      !String(ev[0].input?.command).includes('echo from tanstack')) fail('the client did not emit its approval event exactly once')
  if (seen.partStates.filter((s) => s === 'approval-requested').length !== 1) fail('the part entered approval-requested more than once')
  await sleep(1500) // a continuation, if the client sent one, would be a second POST by now
  results.posts1 = posts.filter((p) => p.threadId === threadId)
  if (results.posts1.length !== 1) fail('the client sent more than its message')
}

// --- 2. TanStack's own answer does not reach baton ------------------------------------------
{
  const { client, threadId, toolParts, shape } = newClient('own-answer')
  const sending = client.sendMessage('run echo own answer')
  await waitFor(() => toolParts().some((p) => p.state === 'approval-requested'), 'the approval state (2)', 60000, () => ({ shape: shape() }))
  const asked = toolParts().find((p) => p.state === 'approval-requested')
  const runId = await activeRun(threadId)
  await client.addToolApprovalResponse({ id: asked.approval.id, approved: true })
  const own = results.ownAnswer = { runId, partState: toolParts()[0].state }
  await sleep(2000) // had the client sent the answer anywhere, the agent would have it by now
  const waiting = await view(runId)
  Object.assign(own, {
    awaitingApproval: waiting.awaitingApproval,
    inputs: waiting.inputs.map((i) => ({ state: i.state, decision: i.decision ?? null })),
    postsWhileWaiting: posts.filter((p) => p.threadId === threadId).length
  })
  if (own.partState !== 'approval-responded') fail('addToolApprovalResponse did not mark the part answered')
  if (!waiting.awaitingApproval || waiting.inputs[0]?.state !== 'pending' || own.postsWhileWaiting !== 1) {
    fail('addToolApprovalResponse reached baton')
  }
  // Answered at baton's endpoint, the run ends; the client then sends its continuation (the
  // answer it queued): a second POST with the whole conversation, which is a new run on the
  // thread. Its stand-in reads the same prompt and asks again.
  own.answer = (await answer(runId, asked.approval.id, true)).status
  await waitFor(async () => posts.filter((p) => p.threadId === threadId).length >= 2, 'a continuation', 30000,
    () => ({ posts: posts.filter((p) => p.threadId === threadId) }))
  own.posts = posts.filter((p) => p.threadId === threadId)
  const first = await view(runId)
  own.first = { status: first.status, inputs: first.inputs.map((i) => i.decision) }
  let next = null
  await waitFor(async () => { next = await activeRun(threadId); return next && next !== runId }, 'the continuation run')
  let asks = null
  await waitFor(async () => { asks = await view(next); return asks.awaitingApproval || asks.status !== 'running' },
    'the continuation run to ask or end')
  own.continuation = { runId: next, status: asks.status, awaitingApproval: asks.awaitingApproval,
    asked: asks.inputs.map((i) => i.input?.command) }
  // Not left waiting on the cluster: stop it; the client's stream then ends.
  await api('/api/chat/cancel?wait=true', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ runId: next }) })
  await sending.catch(() => {})
  await waitFor(() => !client.getIsLoading(), 'the end of the continuation stream', 30000, () => ({ shape: shape() }))
}
console.log(JSON.stringify({ ok: true, ...results }))
process.exit(0)
