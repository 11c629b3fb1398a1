// The operator view: hosts (live, and dead ones whose runs have not moved yet), runs by
// status, recent takeovers (when, from, cause, stall) and reaps, and one run's
// timeline (epochs, hosts, detaches, chunk rate). Read-only; refreshed every few seconds.
// Every value comes from GET /api/ops/overview and /api/ops/timeline, as the caller's
// tenant may see them.

import { $, el, clock, duration, everyVisible, relative, bindApiKey, trackHeaderHeight } from './dom.js'
import { enc, getJSON } from './api.js'

const REFRESH_MS = 3000
const SVG = 'http://www.w3.org/2000/svg'

function stateOf (r) {
  if (r.status === 'running') return r.cancelRequested ? 'stopping' : r.detachedSince ? 'detached' : 'running'
  return r.status
}

// When the reaper acts on a detached run, and a client's keep (keptUntil: it holds off the
// reaper until then should the run be detached, read or not now).
function reaperCell (r) {
  const parts = []
  if (r.reapAt) parts.push(`${clock(r.reapAt)} (${relative(r.reapAt)})`)
  if (r.keptUntil) parts.push(`kept until ${clock(r.keptUntil)}`)
  return parts.length ? parts.join(' · ') : '—'
}

function runLink (runId) {
  const a = el('a', 'run-link', runId)
  a.href = `/ops?run=${enc(runId)}`
  a.addEventListener('click', (ev) => {
    if (ev.metaKey || ev.ctrlKey || ev.button !== 0) return
    ev.preventDefault()
    history.pushState({}, '', a.href)
    showTimeline(runId)
    $('timeline-section').scrollIntoView({ block: 'start' })
  })
  return a
}

function threadLink (threadId) {
  const a = el('a', null, threadId)
  a.href = `/?thread=${enc(threadId)}`
  return a
}

function cell (content) {
  const td = el('td')
  if (content instanceof Node) td.append(content)
  else td.textContent = content ?? ''
  return td
}

function badge (state) { return el('span', `badge ${state}`, state) }

function fillTable (id, rows, empty) {
  const body = $(id).querySelector('tbody')
  if (!rows.length) {
    const td = el('td', 'empty', empty)
    td.colSpan = $(id).querySelectorAll('th').length
    const tr = el('tr')
    tr.append(td)
    body.replaceChildren(tr)
    return
  }
  body.replaceChildren(...rows.map((row) => {
    // A row is its cells, or {cells, cls} to mark it (a dead host, a run that lost its host).
    const tr = el('tr', Array.isArray(row) ? null : row.cls)
    tr.append(...(Array.isArray(row) ? row : row.cells).map(cell))
    return tr
  }))
}

function loadBar (load, capacity) {
  const wrap = el('div', 'load')
  const bar = el('div', 'bar')
  const fill = el('div', 'fill')
  const frac = capacity > 0 ? Math.min(load / capacity, 1) : 0
  fill.style.width = `${Math.round(frac * 100)}%`
  if (frac >= 0.9) fill.dataset.level = 'high'
  bar.append(fill)
  wrap.append(bar, el('span', null, capacity > 0 ? `${load} / ${capacity}` : `${load} / no limit`))
  return wrap
}

// Why a claim moved (Takeover.cause): crash, drain, session lost (a zombie), or other.
const CAUSES = { crash: 'crash', drain: 'drain', 'session-lost': 'session lost (zombie)' }

function causeBadge (cause) {
  if (!cause) return el('span', 'badge', 'not known yet')
  const b = el('span', `badge ${CAUSES[cause] ? cause : 'other'}`, CAUSES[cause] ?? 'other')
  b.title = cause
  return b
}

function deadState (h) {
  const wrap = el('span')
  wrap.append(badge('dead'))
  if (h.cause) wrap.append(' ', causeBadge(h.cause))
  if (h.lostAt) wrap.append(` since ${clock(h.lostAt)} (${relative(h.lostAt)})`)
  return wrap
}

function hostLost () {
  const b = el('span', 'badge host-lost', 'host lost')
  b.title = 'its host is dead: waiting to move to another host'
  return b
}

async function refresh () {
  let o
  try {
    o = await getJSON('/api/ops/overview')
  } catch (err) {
    $('updated').textContent = err.status === 401 ? 'Enter an API key to see this view.' : `Not updated: ${err.message}`
    return
  }
  $('updated').textContent = `Updated ${clock(Date.now() / 1000)} · ${o.runsSeen} recent runs looked at`
  fillTable('hosts', [
    ...o.hosts.map((h) => [
      el('strong', null, h.hostId), loadBar(h.load, h.capacity), h.address, badge(h.draining ? 'draining' : 'serving')
    ]),
    ...(o.deadHosts ?? []).map((h) => ({
      cls: 'dead-host',
      cells: [el('strong', null, h.hostId), `${h.runs.length} run${h.runs.length === 1 ? '' : 's'} not moved yet`, '—',
        deadState(h)]
    }))
  ], 'No host.')
  const chips = Object.entries(o.runsByStatus).sort()
  $('by-status').replaceChildren(...(chips.length
    ? chips.map(([s, n]) => { const c = el('span', `chip badge ${s}`); c.append(el('strong', null, n), ` ${s}`); return c })
    : [el('span', 'empty', 'No runs yet.')]))
  fillTable('live', o.live.map((r) => ({
    cls: r.hostDead ? 'host-lost' : null,
    cells: [
      runLink(r.runId), threadLink(r.threadId), r.hostDead ? hostLost() : badge(stateOf(r)),
      r.hostDead ? `${r.driverHost} (dead)` : r.driverHost ?? '—', String(r.epoch),
      r.detachedSince ? `${clock(r.detachedSince)} (${relative(r.detachedSince)})` : '—',
      reaperCell(r)
    ]
  })), 'No live run.')
  fillTable('takeovers', o.takeovers.map((r) => {
    const t = r.takeover ?? {}
    const at = t.claimedAt ?? t.lostAt
    return [
      runLink(r.runId), threadLink(r.threadId), badge(stateOf(r)), at ? `${clock(at)} (${relative(at)})` : '—',
      t.fromHost ?? '—', t.toHost ?? (t.fromEpoch === r.epoch ? 'not yet' : r.driverHost ?? '—'), causeBadge(t.cause),
      t.stall !== null && t.stall !== undefined ? duration(t.stall) : '—', String(r.epoch)
    ]
  }), 'No takeover among the recent runs.')
  fillTable('reaps', o.reaps.map((r) => [
    runLink(r.runId), threadLink(r.threadId), badge(stateOf(r)), clock(r.detachedSince), clock(r.finishedAt)
  ]), 'No reaped run among the recent runs.')
}

// --- one run's timeline ---------------------------------------------------------------------

function sparkline (rate) {
  const w = 600; const h = 90
  const svg = document.createElementNS(SVG, 'svg')
  svg.setAttribute('viewBox', `0 0 ${w} ${h}`)
  svg.setAttribute('class', 'spark')
  svg.setAttribute('role', 'img')
  const max = Math.max(...rate.map((p) => p.perSecond), 1)
  const t0 = rate[0].at; const t1 = rate[rate.length - 1].at
  const span = Math.max(t1 - t0, 1e-3)
  svg.setAttribute('aria-label', `chunk rate, peak ${max} chunks per second`)
  const pts = rate.map((p) => `${((p.at - t0) / span) * (w - 10) + 5},${h - 16 - (p.perSecond / max) * (h - 32)}`)
  const line = document.createElementNS(SVG, 'polyline')
  line.setAttribute('points', pts.join(' '))
  svg.append(line)
  const label = document.createElementNS(SVG, 'text')
  label.setAttribute('x', '6'); label.setAttribute('y', '12')
  label.textContent = `peak ${max} chunks/s`
  svg.append(label)
  // The time axis: when the sampled chunks start and end.
  for (const [x, anchor, t] of [[6, 'start', t0], [w - 6, 'end', t1]]) {
    const tick = document.createElementNS(SVG, 'text')
    tick.setAttribute('x', String(x)); tick.setAttribute('y', String(h - 2))
    tick.setAttribute('text-anchor', anchor)
    tick.textContent = clock(t)
    svg.append(tick)
  }
  return svg
}

function epochBar (tl) {
  const end = tl.close?.at ?? Date.now() / 1000
  const start = tl.epochs[0]?.at ?? tl.run.startedAt ?? end
  const span = Math.max(end - start, 1e-3)
  const bar = el('div', 'epochs')
  tl.epochs.forEach((f, i) => {
    const next = tl.epochs[i + 1]?.at ?? end
    const seg = el('div', 'epoch-seg')
    seg.dataset.epoch = String(f.epoch)
    seg.style.flexGrow = String(Math.max((next - (f.at ?? start)) / span, 0.02))
    const last = i === tl.epochs.length - 1
    seg.textContent = `epoch ${f.epoch}${last && tl.run.driverHost ? ` · ${tl.run.driverHost}` : ''}`
    seg.title = `from ${clock(f.at)} for ${duration(next - f.at)}`
    bar.append(seg)
  })
  return bar
}

function takenFrom (t, epoch) {
  if (!t || t.fromEpoch !== epoch - 1) return ''
  const cause = t.cause ? `; cause: ${CAUSES[t.cause] ?? 'other'}` : ''
  return ` from ${t.fromHost ?? '?'}${cause}${t.stall !== null ? `; stalled ${duration(t.stall)}` : ''}`
}

// The run whose timeline is shown: a retry for another run, asked before, gives up.
let timelineRun = null

async function showTimeline (runId) {
  timelineRun = runId
  $('timeline-run').value = runId
  const box = $('timeline')
  let tl
  try {
    tl = await getJSON(`/api/ops/timeline?runId=${enc(runId)}`)
  } catch (err) {
    if (timelineRun !== runId) return
    // 503: the log or the coordinator did not answer in time (a loaded gateway): asked
    // again, as the overview is at its next refresh. Any other error stays on the page.
    const again = err.status === 503
    box.replaceChildren(el('p', 'note error', `No timeline: ${err.message}${again ? '; trying again' : ''}`))
    if (again) setTimeout(() => { if (timelineRun === runId) showTimeline(runId) }, REFRESH_MS)
    return
  }
  if (timelineRun !== runId) return
  const r = tl.run
  const head = el('p', 'timeline-head')
  head.append(badge(stateOf(r)), ` ${r.runId} · thread `, threadLink(r.threadId),
    ` · ${tl.chunks} chunks · ${tl.epochs.length} epoch${tl.epochs.length === 1 ? '' : 's'}`)
  const events = []
  tl.epochs.forEach((f, i) => events.push([f.at, i === 0
    ? `epoch ${f.epoch}: claimed and fenced at offset ${f.offset}`
    : `epoch ${f.epoch}: taken over${takenFrom(r.takeover, f.epoch)}, fence at offset ${f.offset}${i === tl.epochs.length - 1 && r.driverHost ? ` (host ${r.driverHost})` : ''}`]))
  if (r.detachedSince) events.push([r.detachedSince, `detached: no reader since then${r.reapAt ? `; reaper acts at ${clock(r.reapAt)}` : ''}`])
  if (r.cancelRequested) events.push([r.finishedAt ?? null, 'cancel requested'])
  if (tl.close) events.push([tl.close.at, `log closed: ${tl.close.status}${tl.close.errorCode ? ` (${tl.close.errorCode})` : ''}`])
  events.sort((a, b) => (a[0] ?? Infinity) - (b[0] ?? Infinity))
  const list = el('ol', 'events')
  for (const [at, text] of events) {
    const li = el('li')
    li.append(el('time', null, at ? clock(at) : '—'), ` ${text}`)
    list.append(li)
  }
  const parts = [head, epochBar(tl), list]
  parts.push(tl.rate.length >= 2 ? sparkline(tl.rate) : el('p', 'note', 'Too few chunks for a rate.'))
  box.replaceChildren(...parts)
}

function init () {
  trackHeaderHeight(document.querySelector('.top'))
  bindApiKey($('api-key'), () => { refresh(); const run = new URLSearchParams(location.search).get('run'); if (run) showTimeline(run) })
  $('timeline-form').addEventListener('submit', (ev) => {
    ev.preventDefault()
    const runId = $('timeline-run').value.trim()
    if (!runId) return
    history.pushState({}, '', `/ops?run=${enc(runId)}`)
    showTimeline(runId)
  })
  window.addEventListener('popstate', () => {
    const run = new URLSearchParams(location.search).get('run')
    if (run) showTimeline(run)
  })
  everyVisible(REFRESH_MS, refresh)
  const run = new URLSearchParams(location.search).get('run')
  return Promise.all([refresh(), run ? showTimeline(run) : null])
}

window.__batonReady = init()
