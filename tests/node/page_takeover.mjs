// A host SIGKILLed mid-run, seen in the browser: the page shows an inline "continued on
// <host>, epoch 2" marker where the takeover happened, renders every offset once, and the
// operator view shows the surviving host with its load, the takeover, the run's two epochs,
// and a run nobody watches as detached, with since when and when the reaper acts, then,
// once a reaper sweep took it, among the recent reaps (and its chat says why it stopped).
//
// Talks to the Python test over stdio: asks it to kill the driving host when the run is
// mid-way and goes on once the host is dead.
import {
  ask, check, checkOnce, main, newContext, newPage, open, rawLog, record, rendered, results, runSection, send, shot,
  textOf, waitState, noProblems
} from './page_lib.mjs'

// How many assistant messages come before the takeover marker of the run.
const beforeMarker = (page, runId) => page.evaluate((id) => {
  const body = document.querySelector(`section.run[data-run-id="${id}"] .run-body`)
  const kids = [...body.children]
  const at = kids.findIndex((e) => e.classList.contains('takeover'))
  return { at, messagesBefore: kids.slice(0, at).filter((e) => e.classList.contains('assistant')).length,
    messagesAfter: kids.slice(at).filter((e) => e.classList.contains('assistant')).length }
}, runId)

await main(async (browser) => {
  const context = await newContext(browser)
  const page = await newPage(context)
  await open(page, '/')
  const runId = await send(page, { kind: 'replay', journal: 'claude-stream-json/slow.jsonl', speed: 1, delay: 0.15 }, 'count slowly')
  await page.waitForFunction(() => document.querySelectorAll('.run-body > .msg.assistant').length >= 6)
  const first = await record(runId)
  await ask({ kill: runId, host: first.driverHost })
  await page.waitForSelector('.note.takeover', { timeout: 45000 })
  await page.locator('.note.takeover').scrollIntoViewIfNeeded()
  await shot(page, 'chat-takeover')
  await waitState(page, 'completed', 60000)
  const rec = await record(runId)
  const log = await rawLog(runId)
  checkOnce(await rendered(page), log, 'takeover')
  const s = await runSection(page, runId)
  check(s.takeovers.length === 1 && s.takeovers[0] === `Continued on ${rec.driverHost}, epoch 2`, 'no takeover marker', s)
  check(s.user.includes('count slowly'), 'no prompt', s)
  const where = await beforeMarker(page, runId)
  check(where.messagesBefore >= 6 && where.messagesAfter >= 1, 'the marker is not where the takeover happened', where)
  check((await page.textContent('#run-info')).includes(`host ${rec.driverHost} · epoch 2`), 'host and epoch not shown')
  await page.reload()
  await page.evaluate(() => window.__batonReady)
  await page.waitForFunction(() => document.querySelector('.outcome'))
  const again = await beforeMarker(page, runId)
  check(JSON.stringify(again) === JSON.stringify(where), 'the marker moved on reload', { again, where })
  checkOnce(await rendered(page), log, 'reload after the takeover')
  results.takeover = { runId, from: first.driverHost, to: rec.driverHost, epoch: rec.epoch, status: rec.status,
    where, log: log.length, text: textOf(log), shownText: s.assistant }
  noProblems(page, 'chat page')

  // --- the operator view ------------------------------------------------------------------
  const { runId: idleRun, threadId: idleThread } = JSON.parse(await ask({ detach: true })) // its client gone
  const ops = await newPage(context, { polled: ['/api/ops/'] })
  await open(ops, `/ops?run=${encodeURIComponent(runId)}`)
  const liveRow = (id) => ops.evaluate((run) => [...document.querySelectorAll('#live tbody tr')]
    .map((tr) => [...tr.children].map((td) => td.textContent)).find((cells) => cells[0] === run) ?? null, id)
  await ops.waitForFunction((run) => [...document.querySelectorAll('#live tbody tr')].some((tr) =>
    tr.children[0].textContent === run && tr.children[2].textContent === 'detached' && tr.children[6].textContent !== '—'),
  idleRun, { timeout: 60000 })
  const idle = await liveRow(idleRun)
  await ops.waitForFunction(() => document.querySelectorAll('#timeline .epoch-seg').length === 2)
  await ops.waitForFunction((id) => [...document.querySelectorAll('#takeovers td')].some((td) => td.textContent === id), runId)
  const view = await ops.evaluate(() => ({
    hosts: [...document.querySelectorAll('#hosts tbody tr')].map((tr) => [...tr.children].map((td) => td.textContent)),
    chips: [...document.querySelectorAll('#by-status .chip')].map((c) => c.textContent),
    epochs: [...document.querySelectorAll('#timeline .epoch-seg')].map((e) => e.textContent),
    events: [...document.querySelectorAll('#timeline .events li')].map((e) => e.textContent),
    spark: !!document.querySelector('#timeline svg.spark polyline')
  }))
  results.ops = { ...view, detached: { runId: idleRun, row: idle } }
  check(view.hosts.length === 1 && view.hosts[0][0] === rec.driverHost, 'the live hosts are wrong', view)
  check(/^\d+ \/ (\d+|no limit)$/.test(view.hosts[0][1]) && view.hosts[0][3] === 'serving', 'no load and capacity', view)
  check(view.chips.some((c) => /^\d+ completed$/.test(c)), 'no completed runs counted by status', view)
  // [run, thread, state, host, epoch, detached since, reaper acts]
  check(idle[3] === rec.driverHost && idle[4] === '1' && /^\d\d:\d\d:\d\d \(.+\)$/.test(idle[5]) &&
    /^\d\d:\d\d:\d\d \(in .+\)$/.test(idle[6]), 'the detached run lacks its details', { idle })
  await shot(ops, 'ops-detached', { fullPage: true })
  // The reaper takes it: it moves to the recent reaps, and its chat says why it stopped.
  await ask({ reap: idleRun })
  await ops.waitForFunction((run) => [...document.querySelectorAll('#reaps tbody tr')].some((tr) =>
    tr.children[0].textContent === run && tr.children[2].textContent === 'aborted'), idleRun, { timeout: 60000 })
  const reaped = await ops.evaluate((run) => [...document.querySelectorAll('#reaps tbody tr')]
    .map((tr) => [...tr.children].map((td) => td.textContent)).find((cells) => cells[0] === run), idleRun)
  // [run, thread, state, detached since, finished]
  check(reaped[1] === idleThread && /^\d\d:\d\d:\d\d$/.test(reaped[3]) && /^\d\d:\d\d:\d\d$/.test(reaped[4]),
    'the reaped run lacks its details', { reaped })
  results.ops.reaped = reaped
  const chat = await newPage(context)
  await open(chat, `/?thread=${encodeURIComponent(idleThread)}`)
  await waitState(chat, 'aborted')
  const r = await runSection(chat, idleRun)
  check(r.notes.some((t) => t.startsWith('Stopped because nobody watched it for too long (reaper).')) &&
    r.outcome.startsWith('Stopped'), 'the reaped run does not say the reaper stopped it', r)
  await chat.close()
  noProblems(chat, 'chat of the reaped run')
  check(view.epochs[1].includes(rec.driverHost), 'the second epoch does not name its host', view)
  check(view.events.some((e) => e.includes('taken over')) && view.events.some((e) => e.includes('log closed: completed')),
    'the timeline lacks the takeover or the close', view)
  check(view.spark, 'no chunk rate drawn', view)
  await shot(ops, 'ops', { fullPage: true })
  const phoneCtx = await newContext(browser, { width: 390, height: 844 })
  const phone = await newPage(phoneCtx, { polled: ['/api/ops/'] })
  await open(phone, `/ops?run=${encodeURIComponent(runId)}`)
  await phone.waitForFunction(() => document.querySelectorAll('#timeline .epoch-seg').length === 2)
  await shot(phone, 'ops-phone', { fullPage: true })
  // Wide tables scroll inside their own box; the page itself never scrolls sideways.
  const overflow = await phone.evaluate(() => document.documentElement.scrollWidth - window.innerWidth)
  check(overflow <= 0, 'the operator view scrolls sideways on a phone', { overflow })
  await phoneCtx.close()
  results.ops.retried = [...ops.retried, ...phone.retried]  // 503s the page asked again (shown, not judged)
  noProblems(ops, 'operator page')
  noProblems(phone, 'operator page on a phone')
})
