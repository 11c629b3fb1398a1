// A run kept longer than the default detached TTL on the chat page (Chromium): its run info
// says "kept until <clock>" (the keptUntil a client asked for, POST /api/runs/{runId}/keep).
//
// Env: BATON_GATEWAY_URL, BATON_API_KEY, BATON_THREAD (a thread whose running run was kept by
// the Python test), BATON_KEPT_UNTIL (its keptUntil, Unix seconds).
// Prints one JSON line {ok, ...}.
import { check, main, newContext, newPage, noProblems, open, results, shot } from './page_lib.mjs'

const thread = process.env.BATON_THREAD
const keptUntil = Number(process.env.BATON_KEPT_UNTIL)

await main(async (browser) => {
  const context = await newContext(browser)
  const page = await newPage(context)
  await open(page, `/?thread=${encodeURIComponent(thread)}`)
  await page.waitForFunction(() => document.getElementById('run-info').textContent.includes('kept until'),
    null, { timeout: 30000 })
  const info = await page.textContent('#run-info')
  // The same clock the page shows everywhere (dom.js clock: the browser's local time).
  const want = await page.evaluate((s) => new Date(s * 1000).toLocaleTimeString([], { hour12: false }), keptUntil)
  results.info = info
  check(info.includes(`kept until ${want}`), 'the run info does not say until when the run is kept', { info, want })
  await shot(page, 'chat-kept')
  noProblems(page, 'kept run')
})
