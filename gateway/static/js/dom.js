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
