// Small DOM and formatting helpers shared by the chat and the operator page.
//
// Everything here builds nodes with textContent: nothing from the network is ever parsed
// as HTML.

/** document.getElementById. */
export const $ = (id) => document.getElementById(id)

/** A new element with an optional class and text. */
export function el (tag, cls, text) {
  const e = document.createElement(tag)
  if (cls) e.className = cls
  if (text !== undefined && text !== null) e.textContent = String(text)
  return e
}

/** A clock time (seconds since the epoch → "14:03:07"), or '' for null. */
export function clock (seconds) {
  if (seconds === null || seconds === undefined) return ''
  return new Date(seconds * 1000).toLocaleTimeString([], { hour12: false })
}

/** "12 s", "3 min 4 s", "2 h 5 min". */
export function duration (seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return ''
  if (seconds < 10) return `${seconds.toFixed(1)} s`
  if (seconds < 60) return `${Math.round(seconds)} s`
  const m = Math.floor(seconds / 60)
  if (m < 60) return `${m} min ${Math.round(seconds % 60)} s`
  return `${Math.floor(m / 60)} h ${m % 60} min`
}

/** "in 3 min" / "5 s ago" relative to now. */
export function relative (seconds) {
  if (seconds === null || seconds === undefined) return ''
  const d = seconds - Date.now() / 1000
  return d >= 0 ? `in ${duration(d)}` : `${duration(-d)} ago`
}

/**
 * Tell screen readers `text` through the page's polite status region (#announce): a
 * finished message or a new run state, never a streaming delta.
 */
export function announce (text) {
  const box = document.getElementById('announce')
  if (box && text) box.textContent = text
}

/** Resolve once the page is visible (at once when it is), or when `signal` aborts. */
export function whenVisible (signal) {
  if (!document.hidden || signal?.aborted) return Promise.resolve()
  return new Promise((resolve) => {
    const check = () => {
      if (document.hidden && !signal?.aborted) return
      document.removeEventListener('visibilitychange', check)
      signal?.removeEventListener('abort', check)
      resolve()
    }
    document.addEventListener('visibilitychange', check)
    signal?.addEventListener('abort', check)
  })
}

/**
 * Run `fn` every `ms` while the page is visible: a hidden tab polls nothing, and a tab
 * shown again runs `fn` at once, then every `ms`.
 */
export function everyVisible (ms, fn) {
  let timer = null
  const tick = () => {
    timer = null
    if (document.hidden) return
    fn()
    timer = setTimeout(tick, ms)
  }
  document.addEventListener('visibilitychange', () => {
    if (document.hidden) {
      clearTimeout(timer)
      timer = null
    } else if (timer === null) {
      tick()
    }
  })
  timer = setTimeout(tick, ms)
}

/**
 * Keep the CSS variable --top-h equal to the sticky header's height, so what sticks under
 * it (the run bar, the sidebar) sits right below it however the header wraps.
 */
export function trackHeaderHeight (header) {
  const set = () => document.documentElement.style.setProperty('--top-h', `${header.offsetHeight}px`)
  new ResizeObserver(set).observe(header)
  set()
}

/** The API key the user typed (kept in localStorage). */
export function apiKey () { return localStorage.getItem('baton.apiKey') ?? '' }

/** Wire an <input> to the stored API key; `onChange` runs after it changes. */
export function bindApiKey (input, onChange) {
  input.value = apiKey()
  input.addEventListener('change', () => {
    localStorage.setItem('baton.apiKey', input.value.trim())
    onChange()
  })
}
