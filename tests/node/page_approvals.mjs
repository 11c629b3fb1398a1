// Tool approvals on the chat page (Debian chromium via playwright-core), with the stand-in
// `claude` asking before each Bash command (agent option approvals: true):
// 1. the request shows in place as a card (tool, command, Approve / Deny) and the run's pill
//    says "awaiting approval"; a second tab on the thread shows the same card; a reload too;
// 2. Approve in the first tab: the card says Approved, the second tab's card turns answered
//    without a click (from the answer in the log), the command's output appears, the run ends;
// 3. the thread's next turn: Deny with a reason: the card says "Denied: <reason>" and the tool
//    card shows the denial as its error.
import { check, main, newContext, newPage, noProblems, open, results, send, shot, waitState } from './page_lib.mjs'

const SPEC = { kind: 'claude-code', approvals: true }

const card = (page, runId) => page.evaluate((id) => {
  const c = document.querySelector(`section.run[data-run-id="${CSS.escape(id)}"] .approval`)
  if (!c) return null
  return {
    id: c.dataset.approvalId,
    state: c.dataset.state,
    decision: c.dataset.decision ?? null,
    head: c.querySelector('.approval-head').textContent,
    input: c.querySelector('.approval-input').textContent,
    status: c.querySelector('.approval-status').textContent,
    enabled: !c.querySelector('button.approve').disabled && !c.querySelector('button.deny').disabled
  }
}, runId)

const waitCard = (page, runId, state) => page.waitForFunction(([id, s]) =>
  document.querySelector(`section.run[data-run-id="${CSS.escape(id)}"] .approval[data-state="${s}"]`), [runId, state],
{ timeout: 60000 })

const toolResults = (page, runId) => page.evaluate((id) =>
  [...document.querySelectorAll(`section.run[data-run-id="${CSS.escape(id)}"] .tool-result`)].map((e) => e.textContent), runId)

await main(async (browser) => {
  const context = await newContext(browser)
  const page = await newPage(context)
  await open(page, '/')

  // --- 1. the request, in place, in every tab -------------------------------------------------
  const run1 = await send(page, SPEC, 'run echo from the page')
  await waitCard(page, run1, 'pending')
  const asked = await card(page, run1)
  check(asked.head.includes('Bash') && asked.input.includes('echo from the page') && asked.enabled,
    'the approval card does not show the tool and command with its buttons', asked)
  await page.waitForFunction(() => document.getElementById('run-state').textContent === 'awaiting approval',
    null, { timeout: 15000 })
  await shot(page, 'approval-pending')
  const thread = new URL(page.url()).searchParams.get('thread')

  const other = await newPage(context)
  await open(other, `/?thread=${encodeURIComponent(thread)}`)
  await waitCard(other, run1, 'pending')
  await page.reload()
  await page.evaluate(() => window.__batonReady)
  await waitCard(page, run1, 'pending')
  const reloaded = await card(page, run1)
  check(reloaded.id === asked.id && reloaded.enabled, 'after a reload the card is not there to answer', reloaded)

  // --- 2. approve in one tab, the other follows --------------------------------------------
  await page.click(`section.run[data-run-id="${run1}"] .approval button.approve`)
  await waitCard(page, run1, 'answered')
  await waitCard(other, run1, 'answered')
  const approved = await card(page, run1)
  const seen = await card(other, run1)
  check(approved.decision === 'allow' && approved.status.startsWith('Approved'), 'the card does not say Approved', approved)
  check(seen.decision === 'allow' && !seen.enabled, 'the second tab does not show the answer', seen)
  await waitState(page, 'completed')
  const out1 = await toolResults(page, run1)
  check(out1.includes('from the page'), 'the approved command\'s output is not shown', { out1 })
  await shot(page, 'approval-answered')

  // --- 3. deny with a reason -----------------------------------------------------------------
  const run2 = await send(page, SPEC, 'run echo never')
  await waitCard(page, run2, 'pending')
  await page.fill(`section.run[data-run-id="${run2}"] .approval .approval-reason`, 'not today')
  await page.click(`section.run[data-run-id="${run2}"] .approval button.deny`)
  await waitCard(page, run2, 'answered')
  const denied = await card(page, run2)
  check(denied.decision === 'deny' && denied.status === 'Denied: not today', 'the card does not say the denial', denied)
  await waitState(page, 'completed')
  const out2 = await toolResults(page, run2)
  check(out2.includes('not today'), 'the denial is not the tool\'s result', { out2 })
  await shot(page, 'approval-denied')
  noProblems(page, 'approvals')
  noProblems(other, 'approvals, second tab')
  results.approvals = { thread, run1, run2, approval: asked.id }

  // --- 4. a busy thread: queue two messages, cancel one, the other runs next -----------------
  await page.click('#new-thread')
  const busyRun = await send(page, { kind: 'claude-code' }, 'say busy\nsleep 12\nsay still busy')
  await page.waitForFunction(() => document.querySelectorAll('.run-body > .msg.assistant').length >= 1)
  for (const prompt of ['say queued one', 'say queued two']) {
    await page.fill('#prompt', prompt)
    await page.keyboard.press('Enter')
    await page.waitForSelector('#busy:not([hidden]) button.enqueue')
    await page.click('#busy button.enqueue')
    await page.waitForFunction((p) => [...document.querySelectorAll('#queue-list .queued-prompt')]
      .some((e) => e.textContent === p), prompt)
  }
  const queued = await page.evaluate(() => [...document.querySelectorAll('#queue-list li')].map((li) => ({
    runId: li.dataset.runId, text: li.textContent })))
  check(queued.length === 2 && queued[0].text.includes('1.') && queued[1].text.includes('queued two'),
    'the queue does not list the two messages in order', queued)
  await shot(page, 'queue-two')
  await page.click(`#queue-list li[data-run-id="${queued[1].runId}"] button`)
  await page.waitForFunction(() => document.querySelectorAll('#queue-list li').length === 1)
  // The running run ends; the page follows the queued one, which answers, and the queue empties.
  await page.waitForFunction((id) => document.querySelector(`section.run[data-run-id="${CSS.escape(id)}"]`),
    queued[0].runId, { timeout: 60000 })
  await waitState(page, 'completed')
  const next = await page.evaluate((id) => document.querySelector(`section.run[data-run-id="${CSS.escape(id)}"]`)
    .textContent, queued[0].runId)
  check(next.includes('queued one') && await page.isHidden('#queue'), 'the queued run did not run next', { next })
  check(!(await page.evaluate((id) => !!document.querySelector(`section.run[data-run-id="${CSS.escape(id)}"]`),
    queued[1].runId)), 'the cancelled queued run ran')
  await shot(page, 'queue-ran')
  results.queue = { busyRun, ran: queued[0].runId, cancelled: queued[1].runId }
})
