// The operator view with a dead host (tests/cli/test_operator.py): a SIGKILLed host whose runs
// could not move yet is listed dead, with its cause and the runs it left flagged "host lost",
// and the takeovers table shows when, from where, to where, why (drain, crash) and the stall.
//
// Env: BATON_DEAD_HOST (the killed host's id), BATON_DRAINED_RUN (a run a drain moved).
import { check, main, newContext, newPage, noProblems, open, results, shot } from './page_lib.mjs'

const dead = process.env.BATON_DEAD_HOST
const drained = process.env.BATON_DRAINED_RUN

const rows = (page, table) => page.evaluate((id) => [...document.querySelectorAll(`#${id} tbody tr`)]
  .map((tr) => ({ cls: tr.className, cells: [...tr.children].map((td) => td.textContent) })), table)

await main(async (browser) => {
  const context = await newContext(browser)
  const ops = await newPage(context, { polled: ['/api/ops/'] })
  await open(ops, '/ops')
  // The page refreshes every few seconds: wait for the dead host and both causes.
  await ops.waitForFunction(({ host, run }) => {
    const cells = (id) => [...document.querySelectorAll(`#${id} tbody tr`)].map((tr) => [...tr.children].map((td) => td.textContent))
    return cells('hosts').some((c) => c[0] === host && c[3].startsWith('dead')) &&
      cells('takeovers').some((c) => c[0] === run && c[6] === 'drain') &&
      cells('takeovers').some((c) => c[6] === 'crash')
  }, { host: dead, run: drained }, { timeout: 60000 })
  results.hosts = await rows(ops, 'hosts')
  results.live = await rows(ops, 'live')
  results.takeovers = await rows(ops, 'takeovers')
  results.heading = await ops.textContent('#h-hosts')
  await shot(ops, 'ops-dead-host', { fullPage: true })
  check(results.hosts.some((r) => r.cls === 'dead-host'), 'the dead host row is not marked', results)
  noProblems(ops, 'operator page')
})
