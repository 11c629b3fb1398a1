// A real browser EventSource (Debian chromium via playwright-core) on a finished run: it
// gets every chunk once, then `: end`; the browser reconnects with Last-Event-ID, the
// gateway answers 204 No Content, and the EventSource stops for good (readyState CLOSED)
// instead of reopening for ever (issue 12 item 4).
//
// The browser asks for gzip, as every browser does: `encodings` says how each answer came.
//
// Env: BATON_GATEWAY_URL, BATON_RUN_ID (a run whose log is closed). Prints one JSON line.
import { chromium } from 'playwright-core'

const base = process.env.BATON_GATEWAY_URL
const runId = process.env.BATON_RUN_ID

const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking'],
})
try {
  const page = await browser.newPage()
  const requests = []
  page.on('request', async (r) => {
    if (r.url().includes('/api/chat?')) requests.push((await r.allHeaders())['last-event-id'] ?? null)
  })
  const encodings = []
  page.on('response', async (r) => {
    if (r.url().includes('/api/chat?')) encodings.push([r.status(), (await r.allHeaders())['content-encoding'] ?? null])
  })
  await page.goto(base)
  const seen = await page.evaluate((id) => new Promise((resolve) => {
    const got = { opens: 0, ids: [], errors: 0 }
    const es = new EventSource(`/api/chat?runId=${encodeURIComponent(id)}&offset=-1`)
    es.onopen = () => { got.opens += 1 }
    es.onmessage = (ev) => { got.ids.push(ev.lastEventId) }
    es.onerror = () => {
      got.errors += 1
      if (es.readyState === EventSource.CLOSED) resolve({ ...got, state: es.readyState })
    }
    setTimeout(() => resolve({ ...got, state: es.readyState, timedOut: true }), 20000)
  }), runId)
  // Any reopen after CLOSED would show as another request: give a reconnect delay's time.
  await page.waitForTimeout(4000)
  console.log(JSON.stringify({ ok: seen.state === 2 && !seen.timedOut, ...seen, requests, encodings }))
} finally {
  await browser.close()
}
