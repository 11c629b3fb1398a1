// A long thread on the chat page (Chromium): it opens with its newest runs only, and older
// runs load, oldest at the top, as the reader scrolls up to the marker above them; the
// reader's place stays put while they go in.
//
// Env: BATON_GATEWAY_URL, BATON_API_KEY, BATON_THREAD (a thread of BATON_RUNS finished runs,
// written by the Python test, oldest first, each answering "answer <i>").
// Prints one JSON line {ok, ...}.
import { check, main, newContext, newPage, noProblems, open, results } from './page_lib.mjs'

const thread = process.env.BATON_THREAD
const total = Number(process.env.BATON_RUNS)
const sections = (page) => page.evaluate(() => [...document.querySelectorAll('section.run')].map((s) => s.dataset.runId))
const texts = (page) => page.evaluate(() => [...document.querySelectorAll('section.run .msg.assistant')].map((e) => e.textContent.trim()))

await main(async (browser) => {
  const context = await newContext(browser, { width: 1000, height: 600 })
  const page = await newPage(context)
  const started = Date.now()
  await open(page, `/?thread=${encodeURIComponent(thread)}`)
  await page.waitForFunction(() => document.querySelectorAll('section.run .msg.assistant').length >= 10)
  results.firstPaintMs = Date.now() - started
  const first = await sections(page)
  check(first.length === 10, 'the thread did not open with its 10 newest runs', { first })
  const firstTexts = await texts(page)
  check(firstTexts.at(-1) === `answer ${total - 1}` && firstTexts[0] === `answer ${total - 10}`,
    'the newest runs are not the ones shown', { firstTexts })
  check(await page.isVisible('.older-runs button'), 'no marker for the older runs')

  // Scroll to the top: the marker comes into view and the next older runs go in above.
  const seen = [first.length]
  for (let round = 0; round < 5 && (await sections(page)).length < total; round++) {
    const before = (await sections(page)).length
    const anchor = await page.evaluate(() => document.querySelector('section.run').getBoundingClientRect().top)
    await page.evaluate(() => window.scrollTo(0, 0))
    await page.waitForFunction((n) => document.querySelectorAll('section.run').length > n, before)
    seen.push((await sections(page)).length)
    // The run that was the oldest shown keeps its place on screen (scrolled by what went in).
    const moved = await page.evaluate((id) => document.querySelector(`section.run[data-run-id="${CSS.escape(id)}"]`).getBoundingClientRect().top, first[0])
    results.anchorTop = [anchor, moved]
  }
  const all = await sections(page)
  // A run's section goes in at once, its messages once its log was read (one run after another).
  await page.waitForFunction((n) => document.querySelectorAll('section.run .msg.assistant').length >= n, all.length)
  const allTexts = await texts(page)
  check(all.length === total, 'not every run loaded on scroll', { seen })
  check(JSON.stringify(allTexts) === JSON.stringify(Array.from({ length: total }, (_, i) => `answer ${i}`)),
    'the runs are not each once, oldest first', { allTexts })
  check(!(await page.isVisible('.older-runs')), 'the marker stayed after the last older run')
  noProblems(page, 'long thread')
  results.pages = seen
})
