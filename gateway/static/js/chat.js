// The chat page: threads, the conversation of one thread, its live run.
//
// The URL names the thread (`/?thread=<id>`), so a reload or a second tab opens the same
// conversation. Opening a thread reads its newest runs' logs (the user's prompt comes from
// the run's `run.accepted` chunk, so every tab shows it), older runs as the reader scrolls up
// to them, and follows the live one; a dropped stream rejoins strictly after the last offset
// rendered, so nothing is shown twice. A live run opened afresh is joined from its
// snapshot's newest messages (from the start while it has no snapshot), and so is a closed
// run with more messages than a page, their older ones loaded as the reader scrolls up
// (snapshot.js). The run's record (GET /api/runs/{id}) is
// polled while it is live: it gives the state, the driving host and epoch, detach and reap
// times; a higher epoch places a takeover marker where the new claim's fence landed in the log.

import { $, el, announce, clock, duration, everyVisible, relative, bindApiKey, trackHeaderHeight, whenVisible } from './dom.js'
import { ApiError, cancelQueued, cancelRun, enc, getJSON, joinRun, queueRun, readSSE, startRun, steerRun } from './api.js'
import { RunView, errorSentence, renderedOffsets } from './transcript.js'
import { MESSAGES_PER_PAGE } from './snapshot.js'
import {
  SESSION_KINDS, bindWorkspaceField, clearWorkspaceError, forgetFork, forkListItem, isNewThread, offerFork,
  pendingForks, renderForkHistory, showWorkspaceError, showWorkspaceField, threadInfo, workspaceToSend
} from './session.js'

const TERMINAL = new Set(['completed', 'failed', 'aborted'])
const STATE_WORDS = {
  running: 'running',
  detached: 'detached',
  completed: 'completed',
  failed: 'failed',
  aborted: 'stopped',
  interrupted: 'interrupted',
  stopping: 'stopping…',
  awaiting: 'awaiting approval',
  connecting: 'connecting…',
  reconnecting: 'reconnecting…',
  idle: 'idle'
}
const POLL_MS = 1000
const RUNS_PER_PAGE = 10 // runs a thread opens with; older ones load on scroll

const state = {
  threadId: null,
  thread: threadInfo(null), // the open thread's session: {runs, workspace, forkedFrom}
  live: null, // {runId, view, controller, record}
  openSeq: 0
}
window.__baton = state
// For the tests: the offsets the shown runs rendered (tests/node/page_lib.mjs `rendered`).
state.rendered = () => renderedOffsets($('transcript'))

// --- run state shown in the header ------------------------------------------------------

function showState (name, detail) {
  const pill = $('run-state')
  if (pill.dataset.state !== name && name !== 'idle') announce(`Run ${STATE_WORDS[name] ?? name}`)
  pill.dataset.state = name
  pill.textContent = STATE_WORDS[name] ?? name
  if (detail !== undefined) $('run-info').textContent = detail
}

function recordState (rec) {
  if (rec.status === 'running') {
    if (rec.cancelRequested) return 'stopping'
    if (rec.awaitingApproval) return 'awaiting'
    return rec.detachedSince ? 'detached' : 'running'
  }
  return rec.status
}

function recordInfo (rec) {
  const parts = []
  if (rec.driverHost) parts.push(`host ${rec.driverHost}`)
  if (rec.epoch) parts.push(`epoch ${rec.epoch}`)
  if (rec.startedAt) parts.push(`started ${clock(rec.startedAt)}`)
  if (rec.finishedAt && rec.startedAt) parts.push(`took ${duration(rec.finishedAt - rec.startedAt)}`)
  // A finished run keeps the stamp of its last reader leaving; only a live run is "detached".
  if (rec.detachedSince && rec.status === 'running') parts.push(`detached since ${clock(rec.detachedSince)}`)
  // A client asked to keep it while detached (POST /api/runs/{runId}/keep, a join's keepTtl).
  if (rec.keptUntil && rec.status === 'running') parts.push(`kept until ${clock(rec.keptUntil)}`)
  if (rec.reapAt && rec.status === 'running') parts.push(`reaper acts ${relative(rec.reapAt)} (${clock(rec.reapAt)})`)
  return parts.join(' · ')
}

function showRecord (rec) {
  showState(recordState(rec), recordInfo(rec))
  $('run-id').textContent = rec.runId
}

function outcomeText (rec, view) {
  switch (rec.status) {
    case 'completed': return `Completed${rec.finishedAt && rec.startedAt ? ` in ${duration(rec.finishedAt - rec.startedAt)}` : ''}.`
    case 'failed':
      // The log's RUN_ERROR already said why, just above; repeat it only if it is not shown.
      if (view.errorShown) return `Failed${rec.finishedAt ? ` at ${clock(rec.finishedAt)}` : ''}.`
      return `Failed: ${errorSentence(rec.error?.message, rec.error?.code)}`
    case 'aborted': return `Stopped (aborted)${rec.finishedAt ? ` at ${clock(rec.finishedAt)}` : ''}.`
    case 'interrupted': return 'Paused: the agent is waiting for input (interrupted).'
    default: return ''
  }
}

// --- takeovers ---------------------------------------------------------------------------

async function markTakeovers (view, rec) {
  if (!rec || rec.epoch <= 1) return
  try {
    const tl = await getJSON(`/api/ops/timeline?runId=${enc(view.runId)}`)
    const last = tl.epochs.length ? tl.epochs[tl.epochs.length - 1].epoch : 0
    for (const f of tl.epochs) {
      // Only the current (or last) epoch's host is recorded; older ones are named by epoch.
      view.takeover(f.epoch, f.offset, f.epoch === last ? tl.run.driverHost : null)
    }
  } catch (err) {
    console.warn('takeover markers unavailable:', err.message)
  }
}

// --- reading and following runs -------------------------------------------------------------

/**
 * The events a closed run is drawn from: its final snapshot's newest `MESSAGES_PER_PAGE`
 * messages and what follows it when the run has more messages than that (a long run: the
 * older ones load as the reader scrolls up, snapshot.js), else its whole log from the start
 * (a short run is drawn chunk by chunk, its takeover markers where their fences landed).
 * The snapshot join's events before its `snapshot.window` carry no id, so a stream whose
 * first event has one is a plain join and is read as it is.
 */
async function closedEvents (runId, signal) {
  const join = new AbortController()
  const stop = () => join.abort()
  signal?.addEventListener('abort', stop, { once: true })
  if (signal?.aborted) join.abort()
  const it = readSSE(await joinRun(runId, 'snapshot', join.signal, MESSAGES_PER_PAGE))
  const head = []
  for (;;) {
    const { value, done } = await it.next()
    if (done) break
    head.push(value)
    if (value.offset != null) break
    const c = value.chunk
    if (c?.type === 'CUSTOM' && c.name === 'snapshot.window') {
      if (c.value?.messagesOmitted > 0) break
      join.abort()
      await it.return(true).catch(() => {})
      signal?.removeEventListener('abort', stop)
      return readSSE(await joinRun(runId, '-1', signal))
    }
  }
  return (async function * () { yield * head; return yield * it })()
}

/** Read a run whose log is closed, to its end (`closedEvents`). */
async function readClosed (view, rec, signal) {
  const it = await closedEvents(view.runId, signal)
  view.backlog = true
  for (;;) {
    const { value, done } = await it.next()
    if (done) break
    if (value.chunk) view.add(value.offset, value.chunk)
  }
  view.backlog = false
  view.flush()
  if (rec.epoch > 1) await markTakeovers(view, rec)
  view.placeFences(Infinity)
  view.setOutcome(outcomeText(rec, view), rec.status)
  offerFork(view, rec, openFork)
}

const sleep = (ms, signal) => new Promise((resolve) => {
  const t = setTimeout(resolve, ms)
  signal?.addEventListener('abort', () => { clearTimeout(t); resolve() }, { once: true })
})

/**
 * Follow a live run until its log closes: render, reconnect after the last offset on a
 * drop, poll its record. `first` is the response of the POST that started it, if any.
 */
async function follow (view, runId, first = null) {
  const controller = new AbortController()
  const live = { runId, view, controller, record: null, epoch: 0 }
  state.live = live
  $('stop').disabled = false
  $('run-id').textContent = runId
  showState('connecting', '')
  const poll = pollRecord(live)
  let response = first
  let delay = 250
  try {
    while (!controller.signal.aborted) {
      try {
        // A run joined afresh (a reload, a new tab) starts from its snapshot's newest
        // messages; older ones load on scroll (snapshot.js). A rejoin reads on after its offset.
        response = response ?? (view.lastOffset === '-1'
          ? await joinRun(runId, 'snapshot', controller.signal, MESSAGES_PER_PAGE)
          : await joinRun(runId, view.lastOffset, controller.signal))
        showState(live.record ? recordState(live.record) : 'running')
        const it = readSSE(response)
        response = null
        let ended = false
        for (;;) {
          const { value, done } = await it.next()
          if (done) { ended = value; break }
          if (value.notice) {
            $('run-info').textContent = `${value.notice.reason}: ${value.notice.message}`
          } else {
            view.add(value.offset, value.chunk)
            delay = 250
          }
        }
        if (ended) break
      } catch (err) {
        if (controller.signal.aborted) return
        if (err instanceof ApiError && err.status < 500 && err.status !== 409) {
          view.note(`Cannot read this run: ${err.message} (${err.reason ?? err.status})`, 'error')
          return
        }
      }
      showState('reconnecting')
      await sleep(delay, controller.signal)
      delay = Math.min(delay * 2, 4000)
    }
  } finally {
    controller.abort()
    await poll
    view.flush()
    if (state.live === live) {
      state.live = null
      $('stop').disabled = true
      $('busy').hidden = true // a refusal because of this run no longer holds
    }
  }
  // The log closed: show the final record (its status is written right after the close).
  const rec = await finalRecord(runId)
  if (rec) {
    await markTakeovers(view, rec).catch(() => {})
    view.placeFences(Infinity)
    view.setOutcome(outcomeText(rec, view), rec.status)
    offerFork(view, rec, openFork)
    if (state.live === null && view.section.isConnected) showRecord(rec)
  }
  loadThreads()
  if (state.live === null && view.section.isConnected) followQueued(state.threadId)
}

async function pollRecord (live) {
  const signal = live.controller.signal
  while (!signal.aborted) {
    await whenVisible(signal) // a hidden tab does not poll; it asks at once when shown
    if (signal.aborted) return
    try {
      const rec = await getJSON(`/api/runs/${enc(live.runId)}`, signal)
      live.record = rec
      if (state.live === live) showRecord(rec)
      if (rec.epoch > live.epoch) {
        live.epoch = rec.epoch
        if (rec.epoch > 1) await markTakeovers(live.view, rec)
      }
    } catch (err) {
      if (signal.aborted) return
    }
    await sleep(POLL_MS, signal)
  }
}

async function finalRecord (runId) {
  for (let i = 0; i < 40; i++) {
    try {
      const rec = await getJSON(`/api/runs/${enc(runId)}`)
      if (TERMINAL.has(rec.status) || rec.status === 'interrupted') return rec
    } catch (err) {
      if (err instanceof ApiError && err.status === 404) return null
    }
    await sleep(250)
  }
  return null
}

// --- threads -------------------------------------------------------------------------------

function threadFromUrl () {
  return new URLSearchParams(location.search).get('thread') || null
}

function setThreadUrl (threadId, push) {
  const url = threadId ? `/?thread=${enc(threadId)}` : '/'
  if (push) history.pushState({ threadId }, '', url)
  else history.replaceState({ threadId }, '', url)
}

async function openThread (threadId) {
  const seq = ++state.openSeq
  state.live?.controller.abort()
  state.live = null
  state.threadId = threadId
  state.thread = threadInfo(null)
  $('stop').disabled = true
  $('busy').hidden = true
  $('transcript').replaceChildren()
  $('thread-title').textContent = threadId ?? 'New conversation'
  $('run-id').textContent = ''
  showState('idle', threadId ? '' : 'Type a message to start a run.')
  markCurrentThread()
  showWorkspaceField(state.thread, selectedAgent()?.kind)
  $('queue').hidden = true
  if (!threadId) return
  loadQueue()
  let runs
  try {
    const listing = await getJSON(`/api/threads/${enc(threadId)}/runs`)
    runs = listing.runs
    if (seq !== state.openSeq) return
    state.thread = threadInfo(listing)
  } catch (err) {
    $('transcript').append(el('div', 'note error', `This thread cannot be opened: ${err.message}`))
    return
  }
  showWorkspaceField(state.thread, selectedAgent()?.kind)
  if (state.thread.forkedFrom) await showForkHistory(threadId, seq, runs.length)
  if (seq !== state.openSeq) return
  if (!runs.length) {
    if (!state.thread.forkedFrom) forgetFork(threadId) // a fork this page listed that is gone
    showState('idle', state.thread.forkedFrom ? 'Forked: the next message continues from here.' : 'No runs in this thread yet.')
    return
  }
  // A long thread opens with its newest runs; older ones load as the reader scrolls up.
  const watchOlder = runs.length > RUNS_PER_PAGE ? offerOlderRuns(runs.slice(0, -RUNS_PER_PAGE), seq) : null
  await showRuns(runs.slice(-RUNS_PER_PAGE), seq, $('transcript'), true)
  if (seq === state.openSeq) watchOlder?.()
}

/** Render `runs` (oldest first) into `container`: each closed run's log, the live one followed. */
async function showRuns (runs, seq, container, newest) {
  for (const rec of runs) {
    if (seq !== state.openSeq) return
    const view = new RunView(container, rec.runId)
    if (rec.status === 'running') {
      follow(view, rec.runId)
    } else {
      try {
        await readClosed(view, rec, AbortSignal.timeout(20000))
      } catch (err) {
        view.note(`This run's log cannot be read: ${err.message}`, 'error')
      }
      if (newest && seq === state.openSeq && !state.live) showRecord(rec)
    }
  }
}

/**
 * Put an "older runs" marker above the shown runs: once watched (the returned function), when
 * it scrolls into view (or is pressed)
 * the next `RUNS_PER_PAGE` older runs are read into a detached box, which then goes in at
 * once under the marker, the page scrolled by its height so what the reader saw stays put.
 */
function offerOlderRuns (older, seq) {
  const box = el('div', 'older-runs')
  const button = el('button', 'secondary')
  button.type = 'button'
  box.append(button)
  $('transcript').append(box)
  const label = () => { button.textContent = `Show ${older.length} older run${older.length === 1 ? '' : 's'}` }
  label()
  let loading = false
  const observer = new IntersectionObserver((entries) => { if (entries.some((e) => e.isIntersecting)) load() })
  async function load () {
    if (loading || seq !== state.openSeq || !older.length) return
    loading = true
    button.disabled = true
    button.textContent = 'Loading older runs…'
    const page = older.splice(-RUNS_PER_PAGE)
    const holder = el('div', 'older-page')
    await showRuns(page, seq, holder, false)
    if (seq !== state.openSeq) { observer.disconnect(); return }
    box.after(holder)
    window.scrollBy(0, holder.offsetHeight)
    loading = false
    button.disabled = false
    if (older.length) label()
    else { observer.disconnect(); box.remove() }
  }
  button.addEventListener('click', load)
  // Watched once the newest runs are shown (the marker is in view until then).
  return () => { if (box.isConnected) observer.observe(box) }
}

// A fork's first messages came with it, not from its runs: shown from the saved transcript.
async function showForkHistory (threadId, seq, runs) {
  const ff = state.thread.forkedFrom
  let messages
  try {
    messages = (await getJSON(`/api/threads/${enc(threadId)}/messages`)).messages
  } catch (err) {
    if (seq === state.openSeq) $('transcript').append(el('div', 'note error', `The conversation before the fork cannot be read: ${err.message}`))
    return
  }
  if (seq !== state.openSeq) return
  // Before its first run the saved transcript is the fork's history alone.
  // After it, the fork's first `messages` (a head from before that count was kept: none).
  const count = ff.messages || (runs ? 0 : messages.length)
  renderForkHistory($('transcript'), messages.slice(0, count), ff)
}

/** Open a thread just forked (its history loads as any thread's does). */
function openFork (threadId) {
  setThreadUrl(threadId, true)
  loadThreads()
  return openThread(threadId).then(() => $('prompt').focus())
}

function markCurrentThread () {
  for (const a of document.querySelectorAll('#threads a')) {
    if (a.dataset.threadId === state.threadId) a.setAttribute('aria-current', 'page')
    else a.removeAttribute('aria-current')
  }
}

async function loadThreads () {
  let threads
  try {
    threads = (await getJSON('/api/threads')).threads
  } catch (err) {
    $('threads').replaceChildren(el('li', 'note error', err.status === 401 ? 'Enter an API key to see your threads.' : err.message))
    return
  }
  const items = threads.map((t) => {
    const a = el('a')
    a.href = `/?thread=${enc(t.threadId)}`
    a.dataset.threadId = t.threadId
    // A thread whose run waits for the user's answer says so in the list, as the pill does.
    const shown = t.status === 'running' && t.awaitingApproval ? 'awaiting' : t.status
    a.append(el('span', 'thread-name', t.threadId),
      el('span', `badge ${shown}`, STATE_WORDS[shown] ?? shown),
      el('span', 'thread-meta', `${t.runs} run${t.runs === 1 ? '' : 's'} · ${clock(t.startedAt)}`))
    a.addEventListener('click', (ev) => {
      if (ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.button !== 0) return
      ev.preventDefault()
      setThreadUrl(t.threadId, true)
      openThread(t.threadId)
      $('prompt').focus()
    })
    const li = el('li')
    li.append(a)
    return li
  })
  // Forks this browser made that have no run yet (the list above is built from runs).
  for (const f of pendingForks(new Set(threads.map((t) => t.threadId))).reverse()) {
    const a = forkListItem(f)
    a.addEventListener('click', (ev) => {
      if (ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.button !== 0) return
      ev.preventDefault()
      setThreadUrl(f.threadId, true)
      openThread(f.threadId)
      $('prompt').focus()
    })
    const li = el('li')
    li.append(a)
    items.unshift(li)
  }
  $('threads').replaceChildren(...(items.length ? items : [el('li', 'note', 'No threads yet.')]))
  markCurrentThread()
}

// --- send and stop --------------------------------------------------------------------------

function selectedAgent () {
  try { return JSON.parse($('agent').value || 'null') } catch { return null }
}

async function send () {
  const prompt = $('prompt').value.trim()
  if (!prompt) { $('prompt').focus(); return }
  if (!state.threadId) {
    state.threadId = `thread-${crypto.randomUUID().slice(0, 8)}`
    setThreadUrl(state.threadId, true)
    $('thread-title').textContent = state.threadId
  }
  const runId = `run-${crypto.randomUUID()}`
  const agent = selectedAgent()
  const thread = state.thread
  showWorkspaceField(thread, agent?.kind) // the picker may have changed without an event
  const workspace = workspaceToSend() // a new thread's only: a thread keeps its first run's
  $('busy').hidden = true
  clearWorkspaceError()
  $('send').disabled = true
  let response
  try {
    // A coding session's turn carries the thread's saved messages, so its transcript (and a
    // fork of it) holds every turn; a replay run sends the prompt alone, as it always did.
    const history = SESSION_KINDS.has(agent?.kind) && !isNewThread(thread) ? await savedMessages(state.threadId) : []
    response = await startRun({ threadId: state.threadId, runId, prompt, agent, history, workspace })
  } catch (err) {
    $('send').disabled = false
    if (err instanceof ApiError && err.reason === 'THREAD_BUSY') {
      showBusy(err.body.activeRunId)
    } else if (showWorkspaceError(err)) {
      // said beside the repository field
    } else {
      showComposerError(err instanceof ApiError ? errorSentence(err.message, err.reason) : `Could not reach the gateway: ${err.message}`)
    }
    return
  }
  $('send').disabled = false
  $('prompt').value = ''
  if (state.thread === thread) {
    if (isNewThread(thread)) thread.workspace = workspace
    thread.runs++
    showWorkspaceField(thread, agent?.kind)
  }
  const view = new RunView($('transcript'), runId)
  follow(view, runId, response)
  loadThreads()
}

async function savedMessages (threadId) {
  try {
    return (await getJSON(`/api/threads/${enc(threadId)}/messages`)).messages
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) return [] // no transcript saved yet
    throw err
  }
}

function showComposerError (text) {
  const box = $('busy')
  box.replaceChildren(el('span', null, text))
  box.hidden = false
}

// A refused second Send: say why, keep the prompt, offer to send it into the running turn
// (the agent reads it at its next step) or to stop the running run.
function showBusy (activeRunId) {
  const box = $('busy')
  const stopBtn = el('button', 'danger', 'Stop the running run')
  stopBtn.type = 'button'
  stopBtn.addEventListener('click', () => stop(activeRunId))
  const steerBtn = el('button', 'steer', 'Send into the running turn')
  steerBtn.type = 'button'
  steerBtn.addEventListener('click', () => steer(activeRunId))
  const queueBtn = el('button', 'enqueue', 'Queue it for after this run')
  queueBtn.type = 'button'
  queueBtn.addEventListener('click', () => enqueue())
  box.replaceChildren(
    el('span', null, 'Not sent: this thread already has a run in progress. Send it into that run, queue it for after it, or stop it and send again.'),
    steerBtn, queueBtn, stopBtn)
  box.hidden = false
  stopBtn.focus()
  // Follow that run here if this page did not know of it (another tab started it).
  if (activeRunId && state.live?.runId !== activeRunId) {
    const view = new RunView($('transcript'), activeRunId)
    follow(view, activeRunId)
  }
}

async function steer (runId) {
  const content = $('prompt').value.trim()
  if (!runId || !content) return
  try {
    await steerRun(runId, content)
    $('prompt').value = ''
    $('busy').hidden = true
    announce('Sent into the running turn')
  } catch (err) {
    showComposerError(err instanceof ApiError ? errorSentence(err.message, err.reason) : `Could not reach the gateway: ${err.message}`)
  }
}

async function enqueue () {
  const prompt = $('prompt').value.trim()
  const threadId = state.threadId
  if (!prompt || !threadId) return
  const agent = selectedAgent()
  try {
    const history = SESSION_KINDS.has(agent?.kind) ? await savedMessages(threadId) : []
    await queueRun({ threadId, runId: `run-${crypto.randomUUID()}`, prompt, agent, history })
    $('prompt').value = ''
    $('busy').hidden = true
    announce('Queued for after the running run')
  } catch (err) {
    showComposerError(err instanceof ApiError ? errorSentence(err.message, err.reason) : `Could not reach the gateway: ${err.message}`)
  }
  await loadQueue()
}

// The thread's queued runs under the conversation, each with Cancel.
async function loadQueue () {
  const threadId = state.threadId
  const box = $('queue')
  if (!threadId) { box.hidden = true; return [] }
  let queue = []
  try {
    queue = (await getJSON(`/api/threads/${enc(threadId)}/queue`)).queue
  } catch { /* an unknown thread has no queue */ }
  if (threadId !== state.threadId) return queue
  const list = $('queue-list')
  list.replaceChildren(...queue.map((q) => {
    const li = el('li', 'queued')
    li.dataset.runId = q.runId
    const cancel = el('button', 'danger', 'Cancel')
    cancel.type = 'button'
    cancel.addEventListener('click', async () => {
      cancel.disabled = true
      try { await cancelQueued(threadId, q.runId) } catch { /* it started meanwhile */ }
      await loadQueue()
    })
    li.append(el('span', 'queued-pos', `${q.position}.`), el('span', 'queued-prompt', q.prompt), cancel)
    return li
  }))
  box.hidden = queue.length === 0
  return queue
}

// After a run of the thread ended: the queue's next run starts; follow it here. One that
// started and ended between two looks (a quarter second apart; a queued run of a warm thread
// can take less) is no longer queued nor active: it is read from its log, as the runs the
// thread opened with.
async function followQueued (threadId) {
  for (let i = 0; i < 40 && state.threadId === threadId && !state.live; i++) {
    const queue = await loadQueue()
    const active = (await getJSON(`/api/chat/active?threadId=${enc(threadId)}`).catch(() => ({}))).runId
    if (active && !state.live && state.threadId === threadId) {
      follow(new RunView($('transcript'), active), active)
      await loadQueue()
      return
    }
    if (!queue.length) {
      await showUnseenRuns(threadId)
      return
    }
    await sleep(250)
  }
}

// The thread's runs after the newest one shown here (oldest first), shown as they are: each
// closed one from its log, a live one followed.
async function showUnseenRuns (threadId) {
  const seq = state.openSeq
  let runs
  try {
    runs = (await getJSON(`/api/threads/${enc(threadId)}/runs`)).runs
  } catch {
    return
  }
  if (seq !== state.openSeq || state.threadId !== threadId || state.live) return
  const shown = new Set([...$('transcript').querySelectorAll('section.run')].map((s) => s.dataset.runId))
  const last = runs.map((r) => shown.has(r.runId)).lastIndexOf(true)
  if (last < 0) return
  const unseen = runs.slice(last + 1)
  if (unseen.length) await showRuns(unseen, seq, $('transcript'), true)
}

async function stop (runId = state.live?.runId) {
  if (!runId) return
  showState('stopping')
  try {
    await cancelRun(runId)
  } catch (err) {
    showComposerError(`Stop failed: ${err.message}${err.reason ? ` (${err.reason})` : ''}`)
  }
  // The stream ends by itself: run.cancelled, RUN_ERROR cancelled, then the log closes.
}

// Esc stops the thread's live run from anywhere on the page (the composer included), unless
// the key belongs to something else: an IME composition, the agent picker (Esc closes its
// list), a dialog or menu, or a handler that already took it.
function stopOnEscape (ev) {
  if (ev.key !== 'Escape' || !state.live || ev.defaultPrevented || ev.isComposing || ev.repeat) return
  if (ev.target instanceof Element && ev.target.closest('select, dialog, [role="dialog"], [role="menu"], [role="listbox"]')) return
  ev.preventDefault()
  stop()
}

// --- agents ------------------------------------------------------------------------------------

async function loadAgents () {
  let list
  try {
    list = await getJSON('/api/agents')
  } catch {
    return
  }
  const sel = $('agent')
  const saved = localStorage.getItem('baton.agent')
  sel.replaceChildren()
  for (const a of list.agents) {
    const spec = a.kind === 'replay' ? { kind: 'replay', journal: a.journal, speed: 1 } : { kind: a.kind }
    const opt = el('option', null, a.name)
    opt.value = JSON.stringify(spec)
    sel.append(opt)
    // Claude Code can ask before each risky tool (docs/hitl.md): offered as its own choice.
    if (a.kind === 'claude-code') {
      const asking = el('option', null, `${a.name} (ask before tools)`)
      asking.value = JSON.stringify({ kind: a.kind, approvals: true })
      sel.append(asking)
    }
  }
  const values = [...sel.options].map((o) => o.value)
  const dflt = [...sel.options].find((o) => JSON.parse(o.value).kind === list.default)
  if (saved && values.includes(saved)) sel.value = saved
  else if (dflt) sel.value = dflt.value
}

// --- wiring ---------------------------------------------------------------------------------------

// Keep the newest output in view while the reader is at the bottom; leave them be once they
// scroll up to read.
function stickToBottom () {
  let atBottom = true
  const near = () => window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 120
  window.addEventListener('scroll', () => { atBottom = near() }, { passive: true })
  new MutationObserver(() => {
    if (atBottom && !near()) window.scrollTo(0, document.documentElement.scrollHeight)
  }).observe($('transcript'), { childList: true, subtree: true, characterData: true })
}

function init () {
  trackHeaderHeight(document.querySelector('.top'))
  stickToBottom()
  // On a phone the threads list starts folded, so the conversation comes first.
  if (matchMedia('(max-width: 760px)').matches) document.querySelector('.threads-box').open = false
  bindApiKey($('api-key'), () => { loadAgents(); loadThreads(); openThread(state.threadId) })
  $('agent').addEventListener('change', () => {
    localStorage.setItem('baton.agent', $('agent').value)
    showWorkspaceField(state.thread, selectedAgent()?.kind)
  })
  bindWorkspaceField()
  $('new-thread').addEventListener('click', () => {
    setThreadUrl(null, true)
    openThread(null)
    $('prompt').focus()
  })
  $('composer').addEventListener('submit', (ev) => ev.preventDefault())
  $('send').addEventListener('click', () => { send() })
  $('stop').addEventListener('click', () => { stop() })
  $('prompt').addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); send() }
  })
  document.addEventListener('keydown', stopOnEscape)
  window.addEventListener('popstate', () => openThread(threadFromUrl()))
  everyVisible(5000, loadThreads)
  const agents = loadAgents()
  loadThreads()
  return agents.then(() => openThread(threadFromUrl()))
}

window.__batonReady = init()
