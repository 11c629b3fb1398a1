// One run's part of the conversation: AG-UI chunks → DOM.
//
// A RunView owns a <section> of the transcript and renders each chunk of the run's log
// once, by offset (renderedOffsets() lists the offsets the views on the page rendered, in
// order, so tests can check that nothing is shown twice or skipped). Agent text goes through the
// markdown renderer (never innerHTML); everything else is textContent.
//
// Unknown event types and CUSTOM names are not shown inline: they are counted in a
// collapsed "other agent events" list at the end of the run, so new event kinds from the
// translators degrade to something inspectable instead of bare names in the chat.

import { ApiError, answerApproval } from './api.js'
import { announce, el, duration } from './dom.js'
import { renderMarkdown } from './markdown.js'
import { beginWindow, drawMessages } from './snapshot.js'

// section.run → its RunView: a view goes with its section, and nothing else holds it.
const VIEWS = new WeakMap()

/** The offsets rendered by the runs shown under `root`, in order (what the tests check). */
export function renderedOffsets (root) {
  return [...root.querySelectorAll('section.run')].flatMap((s) => [...(VIEWS.get(s)?.seen ?? [])])
}

/** The last `n` characters or so of `text` on one line, starting at a word ("…" when cut). */
function tail (text, n = 240) {
  const t = text.replace(/\s+/g, ' ').trim()
  if (t.length <= n) return t
  const cut = t.slice(-n)
  const space = cut.indexOf(' ')
  return `…${space >= 0 && space < 40 ? cut.slice(space + 1) : cut}`
}

// Plain sentences for the error codes a run ends with.
const ERROR_SENTENCES = {
  cancelled: 'The run was stopped.',
  run_input_missing: 'The run could not continue: its input was never stored.',
  journal_replay_diverged: 'The agent\'s output changed when it was replayed after a host change, so the run was stopped.',
  turn_failed: 'The agent\'s turn failed.',
  error_max_turns: 'The agent stopped after reaching its maximum number of turns.',
  error_during_execution: 'The agent hit an error while working.'
}

// CUSTOM events that are shown in the chat, by name.
const CANCEL_REASONS = {
  user: 'you pressed Stop',
  reaped: 'nobody watched it for too long (reaper)',
  'interrupted-by-new-run': 'a new message interrupted it',
  'client-disconnected': 'its client left',
  'start-abandoned': 'its start was never finished'
}

/** A readable message out of an error text that may be a JSON blob (Codex errors are). */
export function readableError (message) {
  if (typeof message !== 'string') return ''
  const t = message.trim()
  if (t.startsWith('{')) {
    try {
      const obj = JSON.parse(t)
      const inner = obj?.error?.message ?? obj?.message ?? obj?.detail
      if (typeof inner === 'string' && inner) return inner
    } catch { /* not JSON: shown as is */ }
  }
  return t
}

/** The sentence shown for a RUN_ERROR (or a record's error): "<sentence> (code: X)". */
export function errorSentence (message, code) {
  const known = code ? ERROR_SENTENCES[code] : null
  const detail = readableError(message)
  let text = known ?? (detail || 'The run failed.')
  // A cancel's message ("run cancelled (user)") says nothing the sentence does not.
  if (known && detail && code !== 'cancelled' && detail !== code && !known.includes(detail)) text += ` ${detail}`
  return code ? `${text} (code: ${code})` : text
}

function promptOf (messages) {
  const users = (messages ?? []).filter((m) => m.role === 'user')
  const last = users[users.length - 1]
  if (!last) return ''
  if (typeof last.content === 'string') return last.content
  if (Array.isArray(last.content)) return last.content.map((p) => p.text ?? '').join('')
  return ''
}

function chunkTime (chunk) {
  return typeof chunk.timestamp === 'number' ? chunk.timestamp / 1000 : Date.now() / 1000
}

function pretty (raw) {
  try { return JSON.stringify(JSON.parse(raw), null, 2) } catch { return raw }
}

function contentText (content) {
  if (typeof content === 'string') return content
  if (Array.isArray(content)) return content.map((p) => (typeof p === 'string' ? p : p.text ?? JSON.stringify(p))).join('')
  return JSON.stringify(content, null, 2)
}

export class RunView {
  /**
   * @param {HTMLElement} container where the run's section goes
   * @param {string} runId
   */
  constructor (container, runId) {
    this.runId = runId
    this.section = el('section', 'run')
    this.section.dataset.runId = runId
    this.body = el('div', 'run-body')
    this.footer = el('div', 'run-footer')
    this.section.append(this.body, this.footer)
    container.append(this.section)
    VIEWS.set(this.section, this)
    this.seen = new Set() // offsets rendered, in order (a Set keeps insertion order)
    this.lastOffset = '-1'
    this.ended = false
    this.messages = new Map() // messageId → {box, text}
    this.reasoning = new Map() // messageId → {box, text}
    this.tools = new Map() // toolCallId → card
    this.subagents = new Map() // subagentRunId → body element
    this.fences = [] // [{epoch, offset, label}] takeover markers not yet placed
    this.marked = new Set() // epochs marked
    this.byOffset = [] // [[offsetNumber, element]] elements in the order they were created
    this.others = null
    this.dirty = new Set()
    this.flushTimer = null
    this.backlog = false // true while a closed log is read: no durations then
    this.approvals = new Map() // approvalId → card
  }

  /** Render the chunk stored at `offset` (null: not log data, e.g. a gap answer). */
  add (offset, chunk) {
    if (offset !== null) {
      if (this.seen.has(offset)) return
      this.seen.add(offset)
      this.lastOffset = offset
      this.placeFences(Number(offset))
    }
    this.current = offset === null ? null : Number(offset)
    this.render(chunk)
  }

  // The element a chunk's output goes into: its subagent's box, or the run body.
  scope (chunk) {
    return (chunk.subagentRunId && this.subagents.get(chunk.subagentRunId)) || this.into || this.body
  }

  /** Start over, empty (a join from the snapshot that was cut inside it and is read again). */
  reset () {
    this.body.replaceChildren()
    for (const m of [this.messages, this.reasoning, this.tools, this.subagents, this.approvals]) m.clear()
    this.byOffset = []
    this.dirty.clear()
    this.window = null
  }

  append (parent, node) {
    parent.append(node)
    if (this.current !== null && parent === this.body) this.byOffset.push([this.current, node])
    return node
  }

  render (c) {
    switch (c.type) {
      case 'TEXT_MESSAGE_START':
        this.message(c.messageId, c.role ?? 'assistant', c)
        break
      case 'TEXT_MESSAGE_CONTENT':
      case 'TEXT_MESSAGE_CHUNK':
        this.appendText(this.message(c.messageId ?? `${this.runId}-text`, c.role ?? 'assistant', c), c.delta ?? '')
        break
      case 'REASONING_START':
      case 'REASONING_MESSAGE_START':
      case 'THINKING_START':
      case 'THINKING_TEXT_MESSAGE_START':
        this.thought(c.messageId ?? `${this.runId}-thinking`, c)
        break
      case 'REASONING_MESSAGE_CONTENT':
      case 'REASONING_MESSAGE_CHUNK':
      case 'THINKING_TEXT_MESSAGE_CONTENT':
        this.appendText(this.thought(c.messageId ?? `${this.runId}-thinking`, c), c.delta ?? '')
        break
      case 'REASONING_END':
      case 'REASONING_MESSAGE_END':
      case 'THINKING_END':
      case 'THINKING_TEXT_MESSAGE_END': {
        const r = this.reasoning.get(c.messageId ?? `${this.runId}-thinking`)
        if (r) { r.done = true; this.markDirty(r) }
        break
      }
      case 'TOOL_CALL_START':
        this.tool(c.toolCallId, c.toolCallName, c)
        break
      case 'TOOL_CALL_ARGS': {
        const t = this.tool(c.toolCallId, null, c)
        t.args += c.delta ?? ''
        t.argsEl.textContent = t.args
        t.preview.textContent = t.args.replace(/\s+/g, ' ').slice(0, 120)
        break
      }
      case 'TOOL_CALL_END': {
        const t = this.tool(c.toolCallId, null, c)
        t.argsEl.textContent = pretty(t.args)
        break
      }
      case 'TOOL_CALL_RESULT':
        this.toolResult(c)
        break
      case 'SUBAGENT_STARTED':
        this.subagent(c)
        break
      case 'SUBAGENT_FINISHED':
      case 'SUBAGENT_ERROR': {
        const box = this.subagents.get(c.subagentRunId)
        if (box) {
          const card = box.closest('.subagent')
          card.dataset.state = c.type === 'SUBAGENT_ERROR' ? 'error' : 'done'
          card.querySelector('.sub-state').textContent = c.type === 'SUBAGENT_ERROR' ? 'failed' : 'done'
        }
        break
      }
      case 'RUN_ERROR':
        this.runError(c)
        break
      case 'RUN_FINISHED':
        this.ended = true
        this.closeApprovals()
        if (Array.isArray(c.usage) && !this.usageShown) this.usage({ usage: c.usage })
        break
      case 'CUSTOM':
        this.custom(c)
        break
      case 'TEXT_MESSAGE_END':
        this.announceMessage(c.messageId)
        break
      case 'MESSAGES_SNAPSHOT': // a join from the snapshot (snapshot.js)
        drawMessages(this, c.messages ?? [], this.window?.messagesOmitted ?? 0)
        break
      case 'ACTIVITY_SNAPSHOT':
        if (c.activityType === 'approval') this.approval(c.content ?? {}, c)
        else if (c.activityType === 'approval_answer') this.approvalAnswered(c.content ?? {})
        else this.other(c.type, c)
        break
      case 'RUN_STARTED':
      case 'STEP_STARTED':
      case 'STEP_FINISHED':
        break
      default:
        this.other(c.type, c)
    }
  }

  // --- messages and reasoning -------------------------------------------------------

  message (id, role, chunk) {
    let m = this.messages.get(id)
    if (!m) {
      const box = el('div', `msg ${role === 'user' ? 'user' : 'assistant'}`)
      box.dataset.messageId = id
      const text = el('div', 'text md')
      box.append(text)
      this.append(this.scope(chunk), box)
      m = { box, textEl: text, text: '', markdown: true, role }
      this.messages.set(id, m)
    }
    return m
  }

  thought (id, chunk) {
    let r = this.reasoning.get(id)
    if (!r) {
      const box = el('details', 'reasoning')
      const summary = el('summary')
      const label = el('span', 'label', 'Thinking')
      const preview = el('span', 'preview')
      summary.append(label, preview)
      const text = el('div', 'text')
      box.append(summary, text)
      this.append(this.scope(chunk), box)
      r = { box, textEl: text, text: '', label, preview, done: false, markdown: false }
      this.reasoning.set(id, r)
    }
    return r
  }

  // A finished message is read out once, whole (live only: a closed log read from its
  // start is not news).
  announceMessage (id) {
    const m = this.messages.get(id)
    if (!m || this.backlog || !m.text.trim()) return
    announce(`${m.role === 'user' ? 'You' : 'Agent'}: ${m.text.trim().slice(0, 500)}`)
  }

  appendText (m, delta) {
    m.text += delta
    this.markDirty(m)
  }

  // Text is re-rendered at most every 50 ms, not on every delta.
  markDirty (m) {
    this.dirty.add(m)
    if (this.flushTimer === null) this.flushTimer = setTimeout(() => this.flush(), 50)
  }

  flush () {
    clearTimeout(this.flushTimer)
    this.flushTimer = null
    for (const m of this.dirty) {
      if (m.markdown) {
        m.textEl.replaceChildren(renderMarkdown(m.text))
      } else {
        m.textEl.textContent = m.text
        const words = m.text.trim() ? m.text.trim().split(/\s+/).length : 0
        m.label.textContent = m.done ? `Thought · ${words} words` : 'Thinking…'
        m.preview.textContent = m.done ? '' : tail(m.text)
      }
    }
    this.dirty.clear()
  }

  // --- tools and subagents -------------------------------------------------------------

  tool (id, name, chunk) {
    let t = this.tools.get(id)
    if (!t) {
      const card = el('details', 'tool')
      card.dataset.toolCallId = id
      card.dataset.state = 'running'
      const summary = el('summary')
      const nameEl = el('span', 'tool-name', name ?? 'tool')
      const preview = el('span', 'tool-preview')
      const state = el('span', 'tool-state', 'running…')
      summary.append(nameEl, preview, state)
      const argsEl = el('pre', 'tool-args')
      const resultEl = el('pre', 'tool-result')
      const subs = el('div', 'tool-subagents')
      card.append(summary, el('div', 'tool-label', 'Arguments'), argsEl, subs)
      this.append(this.scope(chunk), card)
      t = { card, nameEl, preview, state, argsEl, resultEl, subs, args: '', started: chunkTime(chunk) }
      this.tools.set(id, t)
    } else if (name) {
      t.nameEl.textContent = name
    }
    return t
  }

  toolResult (c) {
    const t = this.tool(c.toolCallId, null, c)
    const isError = c.metadata?.isError === true || c.isError === true
    t.card.dataset.state = isError ? 'error' : 'done'
    if (!t.resultEl.isConnected) t.card.append(el('div', 'tool-label', isError ? 'Error' : 'Result'), t.resultEl)
    t.resultEl.textContent = contentText(c.content)
    const took = chunkTime(c) - t.started
    // Chunks carry no time of their own: a duration is only known when the call was seen
    // live. A read of a closed log (however slow) or a catch-up burst is not a duration.
    const shown = !this.backlog && took >= 0.1 ? ` · ${duration(took)}` : ''
    t.state.textContent = (isError ? 'error' : 'done') + shown
  }

  subagent (c) {
    const id = c.parentToolCallId ?? c.subagentRunId
    const parent = this.tools.get(id) ?? this.tool(id, null, c)
    const card = el('div', 'subagent')
    card.dataset.state = 'running'
    const head = el('div', 'sub-head')
    head.append(el('span', 'sub-name', `Subagent ${c.name ?? ''}`.trim()),
      el('span', 'sub-desc', c.description ?? ''), el('span', 'sub-state', 'working…'))
    const body = el('div', 'sub-body')
    card.append(head, body)
    parent.subs.append(card)
    this.subagents.set(c.subagentRunId, body)
  }

  // --- approvals (docs/hitl.md) ----------------------------------------------------------

  /** The agent asks before a tool: a card with Approve / Deny, in place (after the tool call). */
  approval (v, chunk) {
    const id = v.approvalId
    if (!id || this.approvals.has(id)) return
    const card = el('div', 'approval')
    card.dataset.approvalId = id
    card.dataset.state = 'pending'
    card.setAttribute('role', 'group')
    card.setAttribute('aria-label', `Approval for ${v.toolName ?? 'a tool'}`)
    const head = el('div', 'approval-head', `The agent asks to run ${v.toolName ?? 'a tool'}`)
    const input = el('pre', 'approval-input', JSON.stringify(v.input ?? {}, null, 2))
    const reason = el('input', 'approval-reason')
    reason.type = 'text'
    reason.placeholder = 'Reason (optional, shown to the agent)'
    reason.setAttribute('aria-label', 'Reason for the answer')
    const approve = el('button', 'primary approve', 'Approve')
    const deny = el('button', 'danger deny', 'Deny')
    approve.type = deny.type = 'button'
    const status = el('div', 'approval-status', 'Waiting for your answer')
    status.setAttribute('role', 'status')
    const row = el('div', 'approval-actions')
    row.append(reason, approve, deny)
    card.append(head, input, row, status)
    const answer = async (approved) => {
      approve.disabled = deny.disabled = true
      status.textContent = 'Sending…'
      try {
        const stored = await answerApproval(this.runId, id, approved, reason.value.trim())
        this.showAnswer(card, stored)
      } catch (err) {
        if (err instanceof ApiError && err.body.approval) {
          this.showAnswer(card, err.body.approval, true)
        } else {
          approve.disabled = deny.disabled = false
          status.textContent = `Not sent: ${err.message}${err.reason ? ` (${err.reason})` : ''}`
        }
      }
    }
    approve.addEventListener('click', () => answer(true))
    deny.addEventListener('click', () => answer(false))
    const tool = v.toolCallId ? this.tools.get(v.toolCallId) : null
    if (tool && !tool.resultEl.isConnected) {
      // The tool does not run until it is answered: its card says so, not "running…".
      tool.card.dataset.state = 'awaiting'
      tool.state.textContent = 'awaiting approval'
      card.tool = tool
    }
    if (tool && tool.card.parentElement) {
      tool.card.after(card)
      if (this.current !== null) this.byOffset.push([this.current, card])
    } else {
      this.append(this.scope(chunk), card)
    }
    this.approvals.set(id, card)
    if (!this.backlog) announce(`The agent asks to run ${v.toolName ?? 'a tool'}: approve or deny`)
  }

  /** The answer as the agent got it (from the log), or as stored (from the API). */
  showAnswer (card, a, first = false) {
    if (card.dataset.state === 'answered' && !first) return
    const approved = a.approved === true || a.decision === 'allow'
    card.dataset.state = 'answered'
    card.dataset.decision = approved ? 'allow' : 'deny'
    for (const b of card.querySelectorAll('button, input')) b.disabled = true
    const by = a.answeredBy === 'expired' ? ' (nobody answered in time)' : ''
    const why = a.message && a.answeredBy !== 'expired' ? `: ${a.message}` : ''
    card.querySelector('.approval-status').textContent =
      `${first ? 'Already answered: ' : ''}${approved ? 'Approved' : 'Denied'}${by}${why}`
    const tool = card.tool
    if (tool && tool.card.dataset.state === 'awaiting') { // its result, when it comes, says the rest
      tool.card.dataset.state = 'running'
      tool.state.textContent = approved ? 'running…' : 'denied'
    }
  }

  /** The run ended: a request still unanswered can no longer be answered. */
  closeApprovals () {
    for (const card of this.pendingApprovals()) {
      card.dataset.state = 'closed'
      for (const b of card.querySelectorAll('button, input')) b.disabled = true
      card.querySelector('.approval-status').textContent = 'The run ended before an answer.'
      if (card.tool?.card.dataset.state === 'awaiting') {
        card.tool.card.dataset.state = 'closed'
        card.tool.state.textContent = 'not run'
      }
    }
  }

  approvalAnswered (v) {
    const card = this.approvals.get(v.approvalId)
    if (card) this.showAnswer(card, v)
  }

  /** Pending approvals as the run's record lists them (a page opened while it waits). */
  pendingApprovals () {
    return [...this.approvals.values()].filter((c) => c.dataset.state === 'pending')
  }

  // --- ends, notices, usage --------------------------------------------------------------

  runError (c) {
    this.ended = true
    this.closeApprovals()
    this.errorShown = true
    const cls = c.code === 'cancelled' ? 'run-error cancelled' : 'run-error'
    const box = this.append(this.body, el('div', cls, errorSentence(c.message, c.code)))
    box.setAttribute('role', 'alert')
    if (Array.isArray(c.usage) && !this.usageShown) this.usage({ usage: c.usage })
  }

  /** A small inline note in plain words (takeover, cancel confirmation, gap, log notices). */
  note (text, cls = '') {
    return this.append(this.body, el('div', `note ${cls}`.trim(), text))
  }

  custom (c) {
    const v = c.value ?? {}
    switch (c.name) {
      case 'snapshot.window':
        beginWindow(this, v)
        break
      case 'run.accepted': {
        if (this.window) break // the snapshot's messages showed the prompt
        const prompt = promptOf(v.messages)
        if (prompt) {
          const box = el('div', 'msg user')
          box.append(el('div', 'text', prompt))
          this.append(this.body, box)
        }
        break
      }
      case 'run.cancelled': {
        const why = CANCEL_REASONS[v.reason] ?? v.reason ?? 'requested'
        const parts = [`Stopped because ${why}.`]
        if (v.processGone === true) parts.push('The agent process is gone.')
        if (v.sandboxDestroyed === true) parts.push('Its sandbox was removed.')
        this.note(parts.join(' '), 'cancel')
        break
      }
      case 'stream.gap':
        this.note(`Earlier output of this run is no longer stored; showing what is kept (from offset ${v.earliestOffset}).`, 'gap')
        break
      case 'claude.result':
      case 'codex.usage':
        this.usage(v)
        break
      case 'approval-requested': // the TanStack-shaped twin of the approval activity
        break
      case 'claude.init':
        if (v.model) this.note(`${v.model}${v.claude_code_version ? ` · Claude Code ${v.claude_code_version}` : ''}`, 'init')
        break
      // The named notices of docs/translation.md a reader cares about, in plain words.
      case 'agent.compaction':
        if (v.phase === 'started') this.note('The agent is compacting its context…', 'notice')
        else if (v.phase === 'boundary') this.note(`Context compacted${v.preTokens ? ` (${v.preTokens} tokens before)` : ''}.`, 'notice')
        else if (v.error) this.note(`Compaction failed: ${v.error}`, 'notice')
        break
      case 'agent.rate_limit':
        if (v.status && v.status !== 'allowed') {
          const until = typeof v.resetsAt === 'number' ? ` until ${new Date(v.resetsAt * 1000).toLocaleTimeString()}` : ''
          this.note(`Rate limit: ${v.status === 'rejected' ? 'requests refused' : 'close to the limit'}${until}.`, 'notice')
        }
        break
      // Per-turn figures and stop reasons: the run's totals are shown at its end.
      case 'turn.usage':
      case 'claude.stop_reason':
      case 'claude.thinking_tokens':
        break
      default:
        this.other(c.name, c)
    }
  }

  usage (v) {
    let tokensIn = 0; let tokensOut = 0
    const u = v.usage
    if (Array.isArray(u)) {
      for (const x of u) { tokensIn += (x.inputTokens ?? 0) + (x.cachedInputTokens ?? 0) + (x.cacheWriteInputTokens ?? 0); tokensOut += x.outputTokens ?? 0 }
    } else if (u && typeof u === 'object') {
      tokensIn = (u.input_tokens ?? 0) + (u.cache_read_input_tokens ?? 0) + (u.cache_creation_input_tokens ?? 0)
      tokensOut = u.output_tokens ?? 0
    }
    const parts = []
    if (tokensIn || tokensOut) parts.push(`${tokensIn.toLocaleString()} tokens in, ${tokensOut.toLocaleString()} out`)
    if (typeof v.total_cost_usd === 'number') parts.push(`$${v.total_cost_usd.toFixed(4)}`)
    if (typeof v.num_turns === 'number') parts.push(`${v.num_turns} turn${v.num_turns === 1 ? '' : 's'}`)
    if (typeof v.duration_ms === 'number') parts.push(duration(v.duration_ms / 1000))
    if (!parts.length) return
    this.usageShown = true
    let box = this.footer.querySelector('.usage')
    if (!box) { box = el('div', 'usage'); this.footer.prepend(box) }
    box.textContent = `Usage: ${parts.join(' · ')}`
  }

  other (name, chunk) {
    if (!this.others) {
      this.others = el('details', 'others')
      this.othersSummary = el('summary')
      this.othersList = el('ul')
      this.others.append(this.othersSummary, this.othersList)
      this.footer.append(this.others)
      this.otherCount = 0
    }
    this.otherCount++
    this.othersSummary.textContent = `${this.otherCount} other agent event${this.otherCount === 1 ? '' : 's'}`
    const li = el('li')
    li.append(el('code', null, name ?? 'event'), el('span', null, ` ${JSON.stringify(chunk.value ?? chunk).slice(0, 300)}`))
    this.othersList.append(li)
  }

  // --- takeovers ------------------------------------------------------------------------

  /**
   * Mark where a later epoch took the run over: a fence at `offset` (the log offset of
   * the new claim's fence). Placed before the first element rendered after it; a fence
   * past everything rendered waits for the next chunk.
   */
  takeover (epoch, offset, host) {
    if (epoch <= 1 || this.marked.has(epoch)) return
    this.marked.add(epoch)
    const label = `Continued on ${host ?? 'another host'}, epoch ${epoch}`
    const at = Number(offset)
    const after = this.byOffset.find(([o]) => o > at)
    if (after) {
      after[1].before(this.marker(label, epoch))
    } else {
      this.fences.push({ at, label, epoch })
      this.fences.sort((a, b) => a.at - b.at)
    }
  }

  marker (label, epoch) {
    const m = el('div', 'note takeover', label)
    m.dataset.epoch = String(epoch)
    return m
  }

  placeFences (offset) {
    while (this.fences.length && this.fences[0].at < offset) {
      const f = this.fences.shift()
      this.append(this.body, this.marker(f.label, f.epoch))
    }
  }

  /** Show the run's final state under it (from its record). */
  setOutcome (text, state) {
    let box = this.footer.querySelector('.outcome')
    if (!box) { box = el('div', 'outcome'); this.footer.append(box) }
    box.dataset.state = state
    box.textContent = text
  }
}
