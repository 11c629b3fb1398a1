// A run kept longer than the default detached TTL on the chat page (Chromium): its run info
// says "kept until <clock>" (the keptUntil a client asked for, POST /api/runs/{runId}/keep),
// and so does its row of the operator view's live runs, beside when the reaper acts.
//
// Env: BATON_GATEWAY_URL, BATON_API_KEY, BATON_THREAD (a thread whose running run was kept by
// the Python test), BATON_RUN (that run), BATON_KEPT_UNTIL (its keptUntil, Unix seconds).
// Prints one JSON line {ok, ...}.
import { check, main, newContext, newPage, noProblems, open, results, shot } from './page_lib.mjs'

const thread = process.env.BATON_THREAD
const run = process.env.BATON_RUN
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

  const ops = await newPage(context)
  await open(ops, '/ops')
  await ops.waitForFunction((id) => [...document.querySelectorAll('#live tbody tr')]
    .some((tr) => tr.children[0].textContent === id), run, { timeout: 30000 })
  const row = await ops.evaluate((id) => [...document.querySelectorAll('#live tbody tr')]
    .map((tr) => [...tr.children].map((td) => td.textContent)).find((c) => c[0] === id), run)
  results.opsRow = row
  check(row[6].includes(`kept until ${want}`), 'the operator view does not say until when the run is kept', { row, want })
  await shot(ops, 'ops-kept')
  noProblems(ops, 'operator page, kept run')
})
