// Coding sessions on the chat page (docs/api.md "Workspaces"): the repository a claude-code
// or codex thread works in, the fork of a thread at one of its runs, and the conversation a
// forked thread starts with.
//
// A thread keeps the workspace of its first run. So the repository field is editable only on
// a new thread (no run yet, not a fork) and goes with that thread's first POST only; after
// that it shows the thread's workspace read-only (GET /api/threads/{id}/runs gives it: names,
// never secrets). A fork is a new thread with no run until its first message, which the
// gateway's threads list (built from runs) does not show yet: the page remembers the forks it
// made (localStorage) and lists them until the gateway does.

import { $, el, announce, clock } from './dom.js'
import { ApiError, forkThread } from './api.js'
import { renderMarkdown } from './markdown.js'

/** Agent kinds whose threads are coding sessions (one workspace, one agent session). */
export const SESSION_KINDS = new Set(['claude-code', 'codex'])
const ENDED = new Set(['completed', 'failed', 'aborted'])
const FORKS_KEY = 'baton.forks'
const MAX_FORKS = 20

// --- the open thread ----------------------------------------------------------------------

/**
 * What the page knows of a thread's session, from GET /api/threads/{id}/runs (null: a new
 * thread): {runs: count, workspace: spec|null, forkedFrom: {threadId, runId, messages}|null}.
 */
export function threadInfo (listing) {
  if (!listing) return { runs: 0, workspace: null, forkedFrom: null }
  const runs = listing.runs ?? []
  return {
    runs: runs.length,
    workspace: listing.workspace ?? runs.find((r) => r.workspace)?.workspace ?? null,
    forkedFrom: listing.forkedFrom ?? null
  }
}

/** A thread that has neither a run nor a forked history: its workspace is still to choose. */
export const isNewThread = (info) => !info || (info.runs === 0 && !info.forkedFrom)

// --- the repository field -------------------------------------------------------------------

const draft = { where: '', ref: '', setup: '' } // what the user typed for a new thread

const HINTS = {
  edit: 'Cloned for this thread when you send; every later message continues in the same workspace. ' +
    'An absolute path (/…) names a directory on the hosts instead (inside BATON_WORKSPACE_DIRS).',
  fixed: 'This thread keeps this workspace: each message continues in it. To try something else, fork a run or start a new thread.',
  none: 'This thread has no repository: its runs work in an empty directory. Start a new thread to work on one.'
}

/**
 * Show the repository field for the open thread (`info`, see threadInfo) and the chosen
 * agent kind: editable on a new coding-session thread, read-only once the thread has a
 * workspace, hidden for other agents on threads without one.
 */
export function showWorkspaceField (info, kind) {
  const box = $('workspace')
  const ws = info?.workspace ?? null
  const hasWs = ws && (ws.git || ws.dir)
  const session = SESSION_KINDS.has(kind)
  let mode = null
  if (isNewThread(info)) mode = session ? 'edit' : null
  else if (hasWs) mode = 'fixed'
  else if (session) mode = 'none'
  box.hidden = mode === null
  if (mode === null) return
  if (box.dataset.mode !== mode || mode === 'fixed') clearWorkspaceError()
  box.dataset.mode = mode
  $('ws-fields').hidden = mode === 'none'
  const fixed = mode === 'fixed'
  for (const id of ['ws-git', 'ws-ref', 'ws-setup']) $(id).readOnly = fixed
  if (fixed) {
    $('ws-git').value = ws.git ?? ws.dir ?? ''
    $('ws-ref').value = ws.ref ?? ''
    $('ws-ref').placeholder = ws.git ? 'default branch' : ''
    $('ws-setup').value = (ws.setup ?? []).join('\n')
    $('ws-setup-box').hidden = !(ws.setup ?? []).length
  } else if (mode === 'edit') {
    $('ws-git').value = draft.where
    $('ws-ref').value = draft.ref
    $('ws-ref').placeholder = 'default branch'
    $('ws-setup').value = draft.setup
    $('ws-setup-box').hidden = false
  }
  $('ws-hint').textContent = HINTS[mode]
}

/** Keep what the user types in the editable field (restored on the next new thread). */
export function bindWorkspaceField () {
  const keep = () => {
    if ($('workspace').dataset.mode !== 'edit') return
    draft.where = $('ws-git').value
    draft.ref = $('ws-ref').value
    draft.setup = $('ws-setup').value
    clearWorkspaceError()
  }
  for (const id of ['ws-git', 'ws-ref', 'ws-setup']) $(id).addEventListener('input', keep)
}

/**
 * The workspace the editable field names for the thread's first run: {git, ref?, setup?}, or
 * {dir, setup?} for an absolute path; null when the field is not editable or left empty.
 */
export function workspaceToSend () {
  const box = $('workspace')
  if (box.hidden || box.dataset.mode !== 'edit') return null
  const where = $('ws-git').value.trim()
  if (!where) return null
  const ref = $('ws-ref').value.trim()
  const ws = where.startsWith('/') ? { dir: where } : { git: where, ...(ref ? { ref } : {}) }
  const setup = $('ws-setup').value.split('\n').map((s) => s.trim()).filter(Boolean)
  if (setup.length) ws.setup = setup
  return ws
}

/**
 * Show a refused workspace (a 400 whose `field` is `workspace…`) beside the field, marking the
 * input at fault; returns false for any other error (shown where the caller shows errors).
 */
export function showWorkspaceError (err) {
  const field = String(err instanceof ApiError ? err.body?.field ?? '' : '')
  if (!field.startsWith('workspace')) return false
  const box = $('ws-error')
  box.textContent = `Not sent: ${err.message}`
  box.hidden = false
  $('workspace').hidden = false
  let input = $('ws-git')
  if (field.startsWith('workspace.ref')) input = $('ws-ref')
  if (field.startsWith('workspace.setup')) { $('ws-setup-box').open = true; input = $('ws-setup') }
  input.setAttribute('aria-invalid', 'true')
  input.focus()
  return true
}

export function clearWorkspaceError () {
  $('ws-error').hidden = true
  $('ws-error').textContent = ''
  for (const id of ['ws-git', 'ws-ref', 'ws-setup']) $(id).removeAttribute('aria-invalid')
}

// --- forks ------------------------------------------------------------------------------------

/**
 * Offer "Fork from here" under an ended run of a coding session (`rec`: the run's record).
 * `onForked(threadId)` opens the new thread; a refusal (400 `runId`: the run left no
 * workspace; 409) is said beside the button.
 */
export function offerFork (view, rec, onForked) {
  if (!rec || !SESSION_KINDS.has(rec.agent) || !ENDED.has(rec.status) || view.footer.querySelector('.fork')) return
  const btn = el('button', 'fork', 'Fork from here')
  btn.type = 'button'
  btn.title = 'Start a new thread whose workspace and agent session begin where this run left them'
  btn.addEventListener('click', async () => {
    btn.disabled = true
    view.footer.querySelector('.fork-error')?.remove()
    try {
      const forked = await forkThread(rec.threadId, rec.runId)
      rememberFork(forked)
      announce(`Forked into a new thread, ${forked.threadId}`)
      onForked(forked.threadId)
    } catch (err) {
      btn.disabled = false
      const box = el('span', 'fork-error', `Fork refused: ${err.message}${err.reason ? ` (${err.reason})` : ''}`)
      box.setAttribute('role', 'alert')
      btn.after(box)
    }
  })
  view.footer.append(btn)
}

function storedForks () {
  try {
    const list = JSON.parse(localStorage.getItem(FORKS_KEY) ?? '[]')
    return Array.isArray(list) ? list.filter((f) => typeof f?.threadId === 'string') : []
  } catch { return [] }
}

function saveForks (list) { localStorage.setItem(FORKS_KEY, JSON.stringify(list.slice(0, MAX_FORKS))) }

function rememberFork (forked) {
  const list = storedForks().filter((f) => f.threadId !== forked.threadId)
  list.unshift({ threadId: forked.threadId, from: forked.forkedFrom?.threadId ?? null, at: Date.now() / 1000 })
  saveForks(list)
}

/** Drop a remembered fork (it was deleted, or cannot be read). */
export function forgetFork (threadId) {
  saveForks(storedForks().filter((f) => f.threadId !== threadId))
}

/**
 * The forks this browser made that the gateway's threads list (`listed`: a Set of thread
 * ids) does not show yet, newest first: [{threadId, from, at}]. Listed ones are forgotten.
 */
export function pendingForks (listed) {
  const all = storedForks()
  const pending = all.filter((f) => !listed.has(f.threadId))
  if (pending.length !== all.length) saveForks(pending)
  return pending
}

/** The threads-list entry of a fork with no run yet. */
export function forkListItem (f) {
  const a = el('a')
  a.href = `/?thread=${encodeURIComponent(f.threadId)}`
  a.dataset.threadId = f.threadId
  a.append(el('span', 'thread-name', f.threadId), el('span', 'badge forked', 'forked'),
    el('span', 'thread-meta', `no runs yet · ${clock(f.at)}${f.from ? ` · from ${f.from}` : ''}`))
  return a
}

// --- a fork's history ------------------------------------------------------------------------

function textOf (content) {
  if (typeof content === 'string') return content
  if (Array.isArray(content)) return content.map((p) => (typeof p === 'string' ? p : p?.text ?? '')).join('')
  return ''
}

/**
 * Render the conversation a forked thread started with (`messages`: its first saved AG-UI
 * messages) in a section of its own before the thread's runs, under a note naming where it
 * was forked from. Text as in a run (agent text through the markdown renderer), tool calls
 * as closed cards with their results.
 */
export function renderForkHistory (container, messages, forkedFrom) {
  const section = el('section', 'history')
  section.setAttribute('aria-label', 'The conversation before the fork')
  const origin = el('div', 'note fork-origin')
  const link = el('a', null, forkedFrom.threadId)
  link.href = `/?thread=${encodeURIComponent(forkedFrom.threadId)}`
  origin.append('Forked from thread ', link, ' at run ', el('code', null, forkedFrom.runId),
    messages.length ? '. The conversation up to there:' : '.')
  section.append(origin)
  const cards = new Map()
  for (const m of messages) {
    if (m.role === 'user') {
      section.append(el('div', 'msg user', textOf(m.content)))
    } else if (m.role === 'assistant') {
      const text = textOf(m.content)
      if (text.trim()) {
        const box = el('div', 'msg assistant')
        const body = el('div', 'text md')
        body.append(renderMarkdown(text))
        box.append(body)
        section.append(box)
      }
      for (const call of m.toolCalls ?? []) {
        const card = el('details', 'tool')
        card.dataset.state = 'done'
        const summary = el('summary')
        const args = call.function?.arguments ?? ''
        summary.append(el('span', 'tool-name', call.function?.name ?? 'tool'),
          el('span', 'tool-preview', args.replace(/\s+/g, ' ').slice(0, 120)))
        card.append(summary, el('div', 'tool-label', 'Arguments'), el('pre', 'tool-args', args))
        section.append(card)
        cards.set(call.id, card)
      }
    } else if (m.role === 'tool') {
      const card = cards.get(m.toolCallId)
      if (card) card.append(el('div', 'tool-label', 'Result'), el('pre', 'tool-result', textOf(m.content)))
    }
  }
  container.append(section)
  return section
}
