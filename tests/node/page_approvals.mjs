// Tool approvals on the chat page (Debian chromium via playwright-core), with the stand-in
// `claude` asking before each Bash command (agent option approvals: true):
// 1. the request shows in place as a card (tool, command, Approve / Deny) and the run's pill
//    says "awaiting approval"; a second tab on the thread shows the same card; a reload too;
// 2. Approve in the first tab: the card says Approved, the second tab's card turns answered
//    without a click (from the answer in the log), the command's output appears, the run ends;
// 3. the thread's next turn: Deny with a reason: the card says "Denied: <reason>" and the tool
//    card shows the denial as its error;
// 4. two tabs answer the same request at once: one answer is stored, both cards show it (the
//    loser's says "Already answered: …" from the 409's body, or the answer itself if the log
//    brought it first);
// 5. a message typed while a turn runs: "Send into the running turn" puts it into the run,
//    where it shows as the user's message and the agent acts on it;
// 6. a busy thread's queue: two queued, one cancelled, the other runs next.
import { check, main, newContext, newPage, noProblems, open, record, results, send, shot, waitState } from './page_lib.mjs'

const SPEC = { kind: 'claude-code', approvals: true }

const card = (page, runId) => page.evaluate((id) => {
  const c = document.querySelector(`section.run[data-run-id="${CSS.escape(id)}"] .approval`)
  if (!c) return null
  const tool = c.previousElementSibling?.matches('.tool') ? c.previousElementSibling : null
  return {
    tool: tool && { name: tool.querySelector('.tool-name').textContent, state: tool.querySelector('.tool-state').textContent },
    buttonsShown: c.querySelector('button.approve').checkVisibility(),
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

const sectionOf = (runId) => `section.run[data-run-id="${runId}"]`
const cardCount = (page, runId) => page.evaluate((sel) => document.querySelectorAll(`${sel} .approval`).length, sectionOf(runId))
const waitPill = (page, text) => page.waitForFunction((t) => document.getElementById('run-state').textContent === t,
  text, { timeout: 15000 })

const toolResults = (page, runId) => page.evaluate((id) =>
  [...document.querySelectorAll(`section.run[data-run-id="${CSS.escape(id)}"] .tool-result`)].map((e) => e.textContent), runId)

await main(async (browser) => {
  const context = await newContext(browser)
  // 409s are part of the story: the tab that lost a race, a Send on a busy thread.
  const page = await newPage(context, { expectStatus: [409] })
  await open(page, '/')

  // --- 1. the request, in place, in every tab -------------------------------------------------
  const offered = await page.evaluate((v) => [...document.getElementById('agent').options].find((o) => o.value === v)?.textContent,
    JSON.stringify(SPEC))
  check(offered === 'claude-code (ask before tools)', 'the agent picker does not offer Claude Code asking before tools', { offered })
  const run1 = await send(page, SPEC, 'run echo from the page')
  await waitCard(page, run1, 'pending')
  const asked = await card(page, run1)
  check(asked.head === 'The agent asks to run Bash' && asked.input.includes('"command": "echo from the page"') &&
    asked.enabled && asked.status === 'Waiting for your answer',
  'the approval card does not show the tool and command with its buttons', asked)
  // In place: right after the tool call it gates, which waits for it (not "running…").
  check(asked.tool?.name === 'Bash' && asked.tool.state === 'awaiting approval' && asked.buttonsShown,
    'the card is not placed after the Bash tool call waiting for it', asked)
  await waitPill(page, 'awaiting approval')
  const thread = new URL(page.url()).searchParams.get('thread')
  await page.waitForFunction((t) => document.querySelector(`#threads a[data-thread-id="${CSS.escape(t)}"] .badge`)
    ?.textContent === 'awaiting approval', thread, { timeout: 15000 })
  await shot(page, 'approval-pending')

  const other = await newPage(context, { expectStatus: [409] })
  await open(other, `/?thread=${encodeURIComponent(thread)}`)
  await waitCard(other, run1, 'pending')
  await waitPill(other, 'awaiting approval')
  await page.reload()
  await page.evaluate(() => window.__batonReady)
  await waitCard(page, run1, 'pending')
  const reloaded = await card(page, run1)
  check(reloaded.id === asked.id && reloaded.enabled && reloaded.status === 'Waiting for your answer',
    'after a reload the card is not there to answer', reloaded)
  check(await cardCount(page, run1) === 1, 'after a reload the request shows more than once')
  await waitPill(page, 'awaiting approval')

  // --- 2. approve in one tab, the other follows --------------------------------------------
  await page.click(`section.run[data-run-id="${run1}"] .approval button.approve`)
  await waitCard(page, run1, 'answered')
  await waitCard(other, run1, 'answered')
  const approved = await card(page, run1)
  const seen = await card(other, run1)
  check(approved.decision === 'allow' && approved.status === 'Approved' && !approved.buttonsShown,
    'the card does not say Approved (and nothing left to press)', approved)
  check(seen.decision === 'allow' && !seen.enabled && seen.status === 'Approved', 'the second tab does not show the answer', seen)
  await waitState(page, 'completed')
  check(await page.textContent('#run-state') === 'completed' && await cardCount(page, run1) === 1 &&
    (await card(page, run1)).status === 'Approved', 'the finished run does not show one approved card')
  const ran = await card(page, run1)
  check(ran.tool.state.startsWith('done'), 'the approved tool call does not show done', ran)
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
  check(denied.decision === 'deny' && denied.status === 'Denied: not today' && !denied.buttonsShown,
    'the card does not say the denial', denied)
  await waitState(page, 'completed')
  const out2 = await toolResults(page, run2)
  check(out2.includes('not today'), 'the denial is not the tool\'s result', { out2 })
  await shot(page, 'approval-denied')

  // --- 4. two tabs answer at once ------------------------------------------------------------
  const run3 = await send(page, SPEC, 'run echo raced')
  await waitCard(page, run3, 'pending')
  await open(other, `/?thread=${encodeURIComponent(thread)}`) // a tab shows the runs it was opened on
  await waitCard(other, run3, 'pending')
  const clickIn = (tab, button) => tab.evaluate(([sel, b]) => document.querySelector(`${sel} .approval button.${b}`).click(),
    [sectionOf(run3), button])
  await Promise.all([clickIn(page, 'approve'), clickIn(other, 'deny')])
  await waitCard(page, run3, 'answered')
  await waitCard(other, run3, 'answered')
  const stored = (await record(run3)).inputs[0]
  const mine = await card(page, run3)
  const theirs = await card(other, run3)
  const word = stored.decision === 'allow' ? 'Approved' : 'Denied'
  const [winner, loser] = stored.decision === 'allow' ? [mine, theirs] : [theirs, mine]
  check(mine.decision === stored.decision && theirs.decision === stored.decision,
    'the two tabs do not both show the stored answer', { stored, mine, theirs })
  check([winner.status, loser.status].every((t) => t.startsWith(word) || t.startsWith(`Already answered: ${word}`)),
    'the tab that lost does not say the first answer', { stored, winner, loser })
  await waitState(page, 'completed')
  await shot(other, 'approval-raced')
  results.raced = { run: run3, decision: stored.decision, loser: loser.status }

  // --- 5. send into the running turn -----------------------------------------------------------
  const run4 = await send(page, { kind: 'claude-code' }, 'say steer me\nsleep 6\nsay end of turn')
  await page.waitForFunction((sel) => document.querySelector(`${sel} .run-body > .msg.assistant`)?.textContent.includes('steer me'),
    sectionOf(run4), { timeout: 30000 })
  await page.fill('#prompt', 'say steered from the page')
  await page.keyboard.press('Enter')
  await page.waitForSelector('#busy:not([hidden]) button.steer')
  await page.click('#busy button.steer')
  await page.waitForSelector('#busy', { state: 'hidden' })
  check(await page.inputValue('#prompt') === '', 'the steered message stays in the composer')
  await waitState(page, 'completed')
  const steered = await page.evaluate((sel) => [...document.querySelectorAll(`${sel} .msg`)].map((m) =>
    [m.classList.contains('user') ? 'user' : 'assistant', m.textContent.trim()]), sectionOf(run4))
  const said = steered.findIndex(([r, t]) => r === 'user' && t === 'say steered from the page')
  check(steered.filter(([r, t]) => r === 'user' && t === 'say steered from the page').length === 1 &&
    steered.findIndex(([r, t], i) => i > said && r === 'assistant' && t.includes('steered from the page')) > said,
  'the steered message is not shown once in the run, followed by the agent acting on it', { steered })
  await shot(page, 'steered')
  results.steered = { run: run4, messages: steered }
  noProblems(page, 'approvals')
  noProblems(other, 'approvals, second tab')
  results.approvals = { thread, run1, run2, approval: asked.id }

  // --- 6. a busy thread: queue two messages, cancel one, the other runs next -----------------
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
