// First render of a run joined from its snapshot's newest messages, on the chat page in
// Chromium (bench/long_run.py): the page's own RunView (gateway/static/js/transcript.js)
// draws the chunks of `GET /api/chat?offset=snapshot&messages=N` as the page does; the time
// runs from the request until the MESSAGES_SNAPSHOT event's messages are drawn and a frame
// was painted. Also: when the event arrived whole, and how long its JSON.parse and drawing took.
//
// Env: BATON_GATEWAY_URL, BATON_RUN, BATON_MESSAGES (N), BATON_ROUNDS (joins, each in a fresh page).
// Prints one JSON line {ok, rounds: [{firstRenderMs, deliveredMs, parseMs, drawMs, messages, bytes}]}.
import { chromium } from 'playwright-core'

const base = process.env.BATON_GATEWAY_URL
const runId = process.env.BATON_RUN
const messages = Number(process.env.BATON_MESSAGES ?? '50')
const rounds = Number(process.env.BATON_ROUNDS ?? '3')

const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking']
})
const out = { ok: true, rounds: [] }
try {
  for (let r = 0; r < rounds; r++) {
    const page = await browser.newPage({ viewport: { width: 1280, height: 860 } })
    await page.goto(`${base}/`) // the chat page: its styles, its modules
    await page.evaluate(() => window.__batonReady)
    out.rounds.push(await page.evaluate(async ({ runId, messages }) => {
      const { RunView } = await import('/static/js/transcript.js')
      const holder = document.getElementById('transcript')
      const view = new RunView(holder, runId)
      const began = performance.now()
      const ctl = new AbortController()
      const res = await fetch(`/api/chat?runId=${encodeURIComponent(runId)}&offset=snapshot&messages=${messages}`,
        { headers: { Accept: 'text/event-stream' }, signal: ctl.signal })
      const reader = res.body.getReader()
      const dec = new TextDecoder()
      let buf = ''
      let bytes = 0
      let done = null
      while (!done) {
        const { value, done: end } = await reader.read()
        if (end) break
        bytes += value.length
        buf += dec.decode(value, { stream: true })
        let cut
        while (!done && (cut = buf.indexOf('\n\n')) >= 0) {
          const frame = buf.slice(0, cut)
          buf = buf.slice(cut + 2)
          let id = null
          const data = []
          for (const line of frame.split('\n')) {
            if (line.startsWith('id: ')) id = line.slice(4)
            else if (line.startsWith('data: ')) data.push(line.slice(6))
          }
          if (!data.length) continue
          const delivered = performance.now()
          const chunk = JSON.parse(data.join('\n'))
          const parsed = performance.now()
          view.add(id, chunk)
          if (chunk.type === 'MESSAGES_SNAPSHOT') {
            view.flush()
            void document.body.offsetHeight // layout now, as a paint would
            const drawn = performance.now()
            await new Promise((resolve) => requestAnimationFrame(() => resolve()))
            done = {
              firstRenderMs: performance.now() - began,
              deliveredMs: delivered - began,
              parseMs: parsed - delivered,
              drawMs: drawn - parsed,
              messages: (chunk.messages ?? []).length,
              shown: holder.querySelectorAll('.msg, details.tool').length,
              bytes
            }
          }
        }
      }
      ctl.abort()
      return done
    }, { runId, messages }))
    await page.close()
  }
} catch (err) {
  out.ok = false
  out.error = String(err?.stack ?? err)
} finally {
  await browser.close()
}
console.log(JSON.stringify(out))
