// The gateway's HTTP API as the pages use it: JSON reads, the chat start/join streams, cancel.

import { apiKey } from './dom.js'

/** An HTTP error answer: `status`, the body's `reason` (e.g. THREAD_BUSY) and fields. */
export class ApiError extends Error {
  constructor (status, body) {
    super(body?.error ?? `HTTP ${status}`)
    this.status = status
    this.reason = body?.reason ?? null
    this.body = body ?? {}
  }
}

export function headers (extra = {}) {
  const key = apiKey()
  return key ? { Authorization: `Bearer ${key}`, ...extra } : extra
}

async function check (resp) {
  if (resp.ok) return resp
  const body = await resp.json().catch(() => ({}))
  throw new ApiError(resp.status, body)
}

/** GET a JSON resource (throws ApiError). */
export async function getJSON (path, signal) {
  const resp = await check(await fetch(path, { headers: headers(), signal }))
  return resp.json()
}

export const enc = encodeURIComponent

/** POST /api/chat/cancel {runId} (202: requested). */
export async function cancelRun (runId) {
  await check(await fetch('/api/chat/cancel', {
    method: 'POST',
    headers: headers({ 'Content-Type': 'application/json' }),
    body: JSON.stringify({ runId })
  }))
}

/**
 * Start a run: POST /api/chat with the AG-UI input; resolves to the SSE response.
 * `history`: the thread's saved messages, sent before the new one (a coding session's
 * transcript then keeps every turn); `workspace`: the thread's workspace, on its first run only.
 */
export async function startRun ({ threadId, runId, prompt, agent, history = [], workspace = null }, signal) {
  const body = {
    threadId,
    runId,
    messages: [...history, { id: `${runId}-user`, role: 'user', content: prompt }],
    ...(agent ? { agent } : {}),
    ...(workspace ? { workspace } : {})
  }
  return check(await fetch('/api/chat', {
    method: 'POST',
    signal,
    headers: headers({ 'Content-Type': 'application/json', 'X-Run-Id': runId, Accept: 'text/event-stream' }),
    body: JSON.stringify(body)
  }))
}

/**
 * Queue a message behind the thread's running run: POST /api/chat with multitask "enqueue".
 * Resolves to {runId, threadId, status: "queued", position}, or {status: "started"} when the
 * thread was idle (the run started at once; its stream is left to be joined).
 */
export async function queueRun ({ threadId, runId, prompt, agent, history = [] }) {
  const body = {
    threadId, runId, multitask: 'enqueue',
    messages: [...history, { id: `${runId}-user`, role: 'user', content: prompt }],
    ...(agent ? { agent } : {})
  }
  const controller = new AbortController()
  const resp = await check(await fetch('/api/chat', {
    method: 'POST', signal: controller.signal,
    headers: headers({ 'Content-Type': 'application/json', 'X-Run-Id': runId, Accept: 'text/event-stream' }),
    body: JSON.stringify(body)
  }))
  if (resp.status === 202) return resp.json()
  controller.abort() // a stream: the run started; the page follows it as the thread's active run
  return { runId, threadId, status: 'started' }
}

/** DELETE /api/threads/{threadId}/queue/{runId}: the queued run never starts. */
export async function cancelQueued (threadId, runId) {
  await check(await fetch(`/api/threads/${enc(threadId)}/queue/${enc(runId)}`, { method: 'DELETE', headers: headers() }))
}

/** POST /api/threads/{threadId}/fork {runId} → {threadId, forkedFrom, messages} (throws ApiError). */
export async function forkThread (threadId, runId) {
  const resp = await check(await fetch(`/api/threads/${enc(threadId)}/fork`, {
    method: 'POST',
    headers: headers({ 'Content-Type': 'application/json' }),
    body: JSON.stringify({ runId })
  }))
  return resp.json()
}

/**
 * Answer a tool approval: POST /api/runs/{runId}/approvals/{approvalId} → the stored approval.
 * Throws ApiError (409 APPROVAL_ALREADY_ANSWERED carries the first answer in `body.approval`).
 */
export async function answerApproval (runId, approvalId, approved, message) {
  const resp = await check(await fetch(`/api/runs/${enc(runId)}/approvals/${enc(approvalId)}`, {
    method: 'POST',
    headers: headers({ 'Content-Type': 'application/json' }),
    body: JSON.stringify(message ? { approved, message } : { approved })
  }))
  return (await resp.json()).approval
}

/** Send a message into a run's running turn: POST /api/runs/{runId}/messages → {runId, inputId}. */
export async function steerRun (runId, content) {
  const resp = await check(await fetch(`/api/runs/${enc(runId)}/messages`, {
    method: 'POST',
    headers: headers({ 'Content-Type': 'application/json' }),
    body: JSON.stringify({ content, id: `msg-${crypto.randomUUID()}` })
  }))
  return resp.json()
}

/**
 * Join a run's log strictly after `offset` ('-1': from the start; 'snapshot': from its latest
 * snapshot, with `messages` only its newest that many messages); resolves to the SSE response.
 */
export async function joinRun (runId, offset, signal, messages = 0) {
  const newest = offset === 'snapshot' && messages ? `&messages=${messages}` : ''
  return check(await fetch(`/api/chat?runId=${enc(runId)}&offset=${enc(offset)}${newest}`, {
    headers: headers({ Accept: 'text/event-stream' }), signal
  }))
}

/**
 * Read an SSE response. Yields {offset, chunk} for each event (offset null for an event
 * with no id, e.g. a `stream.gap` answer) and {notice: {reason, message}} for a
 * `: notice` comment (not log data). Returns true when the log's end (the `: end`
 * comment) was read, false when the stream dropped before it.
 */
export async function * readSSE (response) {
  // 204: nothing after this offset and the log is closed (an EventSource is told to stop).
  if (response.status === 204 || !response.body) return true
  const reader = response.body.getReader()
  const decoder = new TextDecoder()
  let buf = ''
  let id = null
  let data = []
  try {
    for (;;) {
      const { value, done } = await reader.read()
      if (done) return false
      buf += decoder.decode(value, { stream: true })
      let nl
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl).replace(/\r$/, '')
        buf = buf.slice(nl + 1)
        if (line === '') {
          if (data.length) {
            yield { offset: id, chunk: JSON.parse(data.join('\n')) }
          }
          id = null; data = []
        } else if (line.startsWith(':')) {
          const comment = line.slice(1).trim()
          if (comment === 'end') return true
          const m = /^notice (\S+) ?(.*)$/.exec(comment)
          if (m) yield { notice: { reason: m[1], message: m[2] } }
        } else if (line.startsWith('id:')) {
          id = line.slice(3).trimStart()
        } else if (line.startsWith('data:')) {
          data.push(line.slice(5).replace(/^ /, ''))
        }
      }
    }
  } finally {
    reader.cancel().catch(() => {})
  }
}
