// A run joined from its snapshot's newest messages (docs/api.md "Joining from a snapshot").
//
// The page joins a run it opens (live, or closed with more than N messages) with
// `offset=snapshot&messages=N`: a `CUSTOM snapshot.window`
// event says how many older messages were left out and the cursor that pages them, then
// `MESSAGES_SNAPSHOT` holds the newest N messages, then every chunk after the snapshot
// follows as usual. The messages are drawn with the run view's own parts (text, tool cards,
// reasoning), so they look as the chunks would have drawn them; the older ones load into a
// box above them as the reader scrolls up (GET /api/runs/{id}/messages?before=cursor), the
// page scrolled by the box's height so what the reader saw stays put.

import { enc, getJSON } from './api.js'
import { el } from './dom.js'

/** Messages a join asks for, and an older page holds. */
export const MESSAGES_PER_PAGE = 50

function text (content) {
  if (typeof content === 'string') return content
  if (Array.isArray(content)) return content.map((p) => (typeof p === 'string' ? p : p.text ?? '')).join('')
  return ''
}

function pretty (raw) {
  try { return JSON.stringify(JSON.parse(raw), null, 2) } catch { return raw }
}

/**
 * Draw `messages` (AG-UI messages of the snapshot, from position `first`) into the view,
 * under `into` (null: the run's body). Of the run's input only its last message, the prompt,
 * is shown (the thread's earlier turns are shown by their own runs).
 */
export function drawMessages (view, messages, first, into = null) {
  const inputs = view.window?.inputMessages ?? 0
  const saved = [view.into, view.backlog]
  view.into = into
  view.backlog = true // no durations, no announcements: this is history
  try {
    messages.forEach((m, i) => {
      const at = first + i
      if (at < inputs) {
        if (at === inputs - 1 && m.role === 'user') {
          const box = el('div', 'msg user')
          box.append(el('div', 'text', text(m.content)))
          view.append(into ?? view.body, box)
        }
        return
      }
      const scope = { subagentRunId: m.subagentRunId }
      switch (m.role) {
        case 'user':
        case 'assistant': {
          if (typeof m.content === 'string' && m.content) view.appendText(view.message(m.id, m.role, scope), m.content)
          for (const call of m.toolCalls ?? []) {
            const t = view.tool(call.id, call.function?.name ?? 'tool', scope)
            if (into && t.card.parentElement !== into) into.append(t.card) // a result drawn first, below
            t.args = call.function?.arguments ?? ''
            t.argsEl.textContent = pretty(t.args)
            t.preview.textContent = t.args.replace(/\s+/g, ' ').slice(0, 120)
          }
          break
        }
        case 'reasoning': {
          const r = view.thought(m.id, scope)
          r.done = true
          view.appendText(r, text(m.content))
          break
        }
        case 'tool':
          view.toolResult({ toolCallId: m.toolCallId, content: m.content, metadata: m.metadata, subagentRunId: m.subagentRunId })
          break
        case 'activity':
          if (m.activityType === 'approval') view.approval(m.content ?? {}, scope)
          else if (m.activityType === 'approval_answer') view.approvalAnswered(m.content ?? {})
          break
        default:
          view.other(`message: ${m.role}`, { value: m })
      }
    })
  } finally {
    [view.into, view.backlog] = saved
  }
  view.flush()
}

/**
 * A `snapshot.window` event: remember it (the messages that follow start at its
 * `messagesOmitted`), and put a marker for the older messages at the top of the run. A
 * second window (a rejoin that was cut inside the snapshot) starts the run's view over.
 */
export function beginWindow (view, value) {
  if (view.window) view.reset()
  view.window = value
  if (!value.messagesOmitted || !value.cursor) return
  const box = el('div', 'older-messages')
  const button = el('button', 'secondary')
  button.type = 'button'
  box.append(button)
  view.body.prepend(box)
  let left = value.messagesOmitted
  let cursor = value.cursor
  const label = () => { button.textContent = `Show ${left} earlier message${left === 1 ? '' : 's'} of this run` }
  label()
  let loading = false
  const observer = new IntersectionObserver((entries) => { if (entries.some((e) => e.isIntersecting)) load() })
  async function load () {
    if (loading || !cursor || !box.isConnected) return
    loading = true
    button.disabled = true
    button.textContent = 'Loading earlier messages…'
    try {
      const page = await getJSON(`/api/runs/${enc(view.runId)}/messages?limit=${MESSAGES_PER_PAGE}&before=${enc(cursor)}`)
      const holder = el('div', 'older-page')
      // Scrolled by what the page grew above the reader, not the holder's height: a tool card the
      // window drew for its result moves up into the holder with its call, adding no height.
      // Measured on the run's last element, which never moves into the holder (rounded up: a
      // fraction of a pixel too far keeps what the reader saw in view, never above it).
      const last = view.body.lastElementChild
      const was = last.getBoundingClientRect().top
      box.after(holder)
      drawMessages(view, page.messages, page.firstIndex, holder)
      window.scrollBy(0, Math.ceil(last.getBoundingClientRect().top - was))
      left = page.firstIndex
      cursor = page.nextCursor
    } catch (err) {
      view.note(`Earlier messages of this run cannot be read: ${err.message}`, 'error')
    }
    loading = false
    button.disabled = false
    if (cursor) label()
    else {
      // The marker goes: what is below it moves up by its height, so the page scrolls up as much
      // (the reader keeps their place).
      observer.disconnect()
      const h = box.offsetHeight
      box.remove()
      window.scrollBy(0, -h)
    }
  }
  button.addEventListener('click', load)
  // Watched after the snapshot's messages are drawn (the marker is in view until then).
  setTimeout(() => { if (box.isConnected) observer.observe(box) }, 0)
}
