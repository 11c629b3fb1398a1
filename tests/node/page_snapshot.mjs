// A live run opened afresh on the chat page (a reload mid-run) is joined from its snapshot's
// newest messages: the page shows those first, with a marker for the earlier ones, loads the
// earlier ones as the reader scrolls up (keeping the reader's place), and follows the run to
// its end. A page opened on the closed run then joins it from its snapshot too, and once
// scrolled to the top shows the same.
//
// Env: BATON_GATEWAY_URL, BATON_API_KEY, BATON_THREAD, BATON_RUN (a running run of the thread
// whose log already has a snapshot of more messages than a join asks for).
// Prints one JSON line {ok, window, firstShown, items, closedOlderMarkers, closedFirstShown, closed, ...}.
import { ask, check, main, newContext, newPage, noProblems, open, results, waitState } from './page_lib.mjs'

const thread = process.env.BATON_THREAD
const runId = process.env.BATON_RUN

// What a reader sees of the run: its messages and tool cards, in order.
const items = (page) => page.evaluate(() => [...document.querySelectorAll('section.run .run-body .msg, section.run .run-body details.tool')]
  .map((e) => e.matches('.msg')
    ? [e.classList.contains('user') ? 'user' : 'assistant', e.textContent.trim()]
    : ['tool', e.dataset.toolCallId, e.querySelector('.tool-name').textContent, e.querySelector('.tool-args').textContent,
        e.querySelector('.tool-result')?.textContent ?? null, e.dataset.state]))

/** Scroll `page` to the top until no earlier message is left to load; checks the reader's place. */
async function scrollToTheTop (page) {
  const anchorId = await page.evaluate(() => document.querySelector('section.run .run-body .msg.assistant').dataset.messageId)
  const top = (id) => page.evaluate((m) => document.querySelector(`[data-message-id="${CSS.escape(m)}"]`).getBoundingClientRect().top, id)
  const rounds = []
  for (let round = 0; round < 30 && await page.isVisible('.older-messages'); round++) {
    const before = (await items(page)).length
    await page.evaluate(() => window.scrollTo(0, 0))
    const was = await top(anchorId)
    await page.waitForFunction((n) => !document.querySelector('.older-messages') ||
      document.querySelectorAll('section.run .run-body .msg, section.run .run-body details.tool').length > n, before)
    rounds.push([before, (await items(page)).length, was, await top(anchorId)])
  }
  check(!(await page.isVisible('.older-messages')), 'the earlier messages did not all load', { rounds })
  // Each page went in above what the reader saw: the anchor moved down by what went in, never up.
  // (Within a pixel: layout is fractional, scroll offsets are whole pixels.)
  check(rounds.every(([, , was, now]) => now >= was - 1), 'the reader lost their place', { rounds })
  return rounds
}

await main(async (browser) => {
  const context = await newContext(browser, { width: 1000, height: 700 })
  const page = await newPage(context)
  await open(page, `/?thread=${encodeURIComponent(thread)}`)
  try {
    await page.waitForFunction(() => window.__baton.live?.view?.window && document.querySelector('section.run .msg.assistant'), null, { timeout: 60000 })
  } catch (err) {
    results.problems = page.problems
    results.live = await page.evaluate(() => [window.__baton.live?.runId, window.__baton.live?.view?.lastOffset, document.querySelectorAll('.msg').length])
    throw err
  }
  results.window = await page.evaluate(() => window.__baton.live.view.window)
  const first = await items(page)
  results.firstShown = first.filter(([k]) => k === 'assistant').length
  check(results.window.messagesOmitted > 0, 'the join left nothing out', { window: results.window })
  check(first[0][0] !== 'user' && !first.some(([k, t]) => k === 'assistant' && t.startsWith('Reading file 0.')),
    'the oldest messages are shown before any scroll', { first: first.slice(0, 3) })
  check(await page.isVisible('.older-messages button'), 'no marker for the earlier messages')
  await page.screenshot({ path: `${process.env.BATON_ARTIFACTS}/snapshot-join-newest.png` })

  // Scroll to the top until every earlier message is in; the message that was at the top keeps its place.
  results.rounds = await scrollToTheTop(page)
  // The run goes on and ends: the page follows it from after the snapshot.
  await ask({ finish: true })
  await waitState(page, 'completed', 120000)
  results.items = await items(page)
  const rendered = await page.evaluate(() => window.__baton.rendered())
  check(new Set(rendered).size === rendered.length, 'a chunk was rendered twice', { rendered })
  results.rendered = rendered.length
  await page.screenshot({ path: `${process.env.BATON_ARTIFACTS}/snapshot-join-all.png`, fullPage: false })
  noProblems(page, 'snapshot join')

  // The closed run opened afresh: joined from its snapshot's newest messages as well, then
  // scrolled to the top.
  const other = await newPage(await newContext(browser, { width: 1000, height: 700 }))
  await open(other, `/?thread=${encodeURIComponent(thread)}`)
  await other.waitForFunction(() => document.querySelector('section.run .outcome'))
  results.closedOlderMarkers = await other.evaluate(() => document.querySelectorAll('section.run .older-messages').length)
  results.closedFirstShown = (await items(other)).filter(([k]) => k === 'assistant').length
  results.closedRounds = await scrollToTheTop(other)
  results.closed = await items(other)
  noProblems(other, 'the closed run')
})
