// Coding sessions on the chat page (Debian chromium via playwright-core), with the stand-in
// `claude` on the hosts' PATH and a local git repository (BATON_TEST_REPO, a file:// URL):
// 1. a replay thread shows no repository field; picking claude-code on a new thread does;
// 2. a workspace the gateway refuses (a directory outside BATON_WORKSPACE_DIRS) is said beside
//    the field, the prompt kept;
// 3. the repository and a ref, `write hello.txt hi`: the run ends; `run cat hello.txt` on the
//    same thread reads `hi` (the workspace carried over) and the field is read-only, after a
//    reload too (from the runs' records);
// 4. "Fork from here" on the first run (keyboard): the page opens the new thread, listed,
//    with the first turn's messages only; `run cat hello.txt` there reads `hi`.
import {
  check, main, newContext, newPage, noProblems, open, results, runSection, shot, waitState
} from './page_lib.mjs'

const repo = process.env.BATON_TEST_REPO

async function sendPrompt (page, prompt) {
  const before = await page.evaluate(() => window.__baton.live?.runId ?? null)
  await page.fill('#prompt', prompt)
  await page.focus('#prompt')
  await page.keyboard.press('Enter')
  const handle = await page.waitForFunction((b) => {
    const id = window.__baton.live?.runId
    return id && id !== b ? id : null
  }, before)
  return handle.jsonValue()
}

const field = (page) => page.evaluate(() => ({
  shown: !document.getElementById('workspace').hidden,
  mode: document.getElementById('workspace').dataset.mode ?? null,
  git: document.getElementById('ws-git').value,
  ref: document.getElementById('ws-ref').value,
  readOnly: document.getElementById('ws-git').readOnly && document.getElementById('ws-ref').readOnly,
  label: document.getElementById('ws-git').labels[0]?.textContent.trim() ?? null,
  hint: document.getElementById('ws-hint').textContent
}))

const toolResults = (page, runId) => page.evaluate((id) =>
  [...document.querySelectorAll(`section.run[data-run-id="${id}"] .tool-result`)].map((e) => e.textContent), runId)

await main(async (browser) => {
  const context = await newContext(browser)
  const page = await newPage(context, { expectStatus: [400] })
  await open(page, '/')

  // --- 1. the field appears for a coding agent on a new thread only -------------------------
  const initial = await field(page)
  check(!initial.shown, 'a repository field on a replay thread', initial)
  await page.selectOption('#agent', { label: 'claude-code' })
  const fresh = await field(page)
  check(fresh.shown && fresh.mode === 'edit' && !fresh.readOnly && fresh.label.startsWith('Git URL'),
    'no editable, labelled repository field for claude-code on a new thread', fresh)
  await page.fill('#ws-git', repo)
  await page.fill('#ws-ref', 'main')
  await shot(page, 'session-new')

  // --- 2. a refused workspace is said beside the field ---------------------------------------
  await page.fill('#ws-git', '/etc')
  await page.fill('#prompt', 'write hello.txt hi')
  await page.focus('#prompt')
  await page.keyboard.press('Enter')
  await page.waitForSelector('#ws-error:not([hidden])')
  const refused = await page.evaluate(() => ({
    text: document.getElementById('ws-error').textContent,
    role: document.getElementById('ws-error').getAttribute('role'),
    invalid: document.getElementById('ws-git').getAttribute('aria-invalid'),
    focused: document.activeElement?.id,
    prompt: document.getElementById('prompt').value,
    runs: document.querySelectorAll('section.run').length
  }))
  check(refused.text.includes('workspace.dir') && refused.role === 'alert' && refused.invalid === 'true' &&
    refused.focused === 'ws-git' && refused.prompt === 'write hello.txt hi' && refused.runs === 0,
  'the refused workspace is not said beside the field', refused)
  await shot(page, 'session-refused')
  results.session = { refused: refused.text }

  // --- 3. two turns in one workspace ---------------------------------------------------------
  await page.fill('#ws-git', repo)
  check(await page.evaluate(() => document.getElementById('ws-error').hidden), 'the error stays after an edit')
  const run1 = await sendPrompt(page, 'write hello.txt hi')
  const thread = new URL(page.url()).searchParams.get('thread')
  await waitState(page, 'completed')
  const afterFirst = await field(page)
  check(afterFirst.shown && afterFirst.readOnly && afterFirst.git === repo && afterFirst.ref === 'main',
    'the field is not read-only after the first run', afterFirst)
  const run2 = await sendPrompt(page, 'run cat hello.txt')
  await waitState(page, 'completed')
  const read2 = await toolResults(page, run2)
  check(read2.includes('hi'), 'the second turn does not read the first turn\'s file', { read2 })
  await page.click(`section.run[data-run-id="${run2}"] .tool summary`)
  await shot(page, 'session-second-turn')
  // After a reload the field comes from the runs' records (the repository resolved to its path).
  await page.reload()
  await page.evaluate(() => window.__batonReady)
  await page.waitForFunction((id) => document.querySelector(`section.run[data-run-id="${id}"] .outcome`), run2)
  const reloaded = await field(page)
  check(reloaded.shown && reloaded.readOnly && repo.endsWith(reloaded.git.replace(/^file:\/\//, '')) && reloaded.ref === 'main',
    'the field after a reload does not show the thread\'s repository read-only', reloaded)
  const forks = await page.evaluate(() => [...document.querySelectorAll('section.run')].map((s) =>
    [s.dataset.runId, !!s.querySelector('.run-footer button.fork')]))
  check(forks.length === 2 && forks.every(([, has]) => has), 'no Fork button on each ended run', { forks })
  Object.assign(results.session, { thread, run1, run2, read2, reloaded })

  // --- 4. fork at the first run ----------------------------------------------------------------
  await page.focus(`section.run[data-run-id="${run1}"] button.fork`)
  await page.keyboard.press('Enter')
  await page.waitForFunction((t) => {
    const now = new URL(location.href).searchParams.get('thread')
    return now && now !== t && document.querySelector('#transcript > section.history')
  }, thread)
  const forkThread = new URL(page.url()).searchParams.get('thread')
  await page.waitForFunction((t) => document.querySelector(`#threads a[data-thread-id="${t}"]`), forkThread, { timeout: 10000 })
  const shown = await page.evaluate(() => ({
    title: document.getElementById('thread-title').textContent,
    origin: document.querySelector('.history .fork-origin')?.textContent,
    users: [...document.querySelectorAll('.history .msg.user')].map((e) => e.textContent),
    tools: [...document.querySelectorAll('.history .tool .tool-name')].map((e) => e.textContent),
    runs: document.querySelectorAll('section.run').length,
    listed: document.querySelector('#threads a[aria-current] .badge')?.textContent,
    announced: document.getElementById('announce').textContent
  }))
  check(shown.title === forkThread && shown.origin.includes(thread) && shown.origin.includes(run1) &&
    JSON.stringify(shown.users) === '["write hello.txt hi"]' && shown.tools.includes('Write') && shown.runs === 0,
  'the fork does not show the first turn\'s messages only', shown)
  check(shown.listed === 'forked' && shown.announced.includes(forkThread), 'the fork is not listed or announced', shown)
  const forkField = await field(page)
  check(forkField.shown && forkField.readOnly && forkField.git, 'the fork does not show its repository read-only', forkField)
  await shot(page, 'session-forked')

  const runF = await sendPrompt(page, 'run cat hello.txt')
  await waitState(page, 'completed')
  const readF = await toolResults(page, runF)
  check(readF.includes('hi'), 'the fork\'s turn does not read the forked workspace', { readF })
  const f = await runSection(page, runF)
  check(JSON.stringify(f.user) === '["run cat hello.txt"]', 'the fork\'s run shows another prompt', f)
  check(await page.evaluate(() => document.querySelectorAll('#transcript > section.history').length) === 1,
    'the fork\'s history is not kept above its run')
  await page.click(`section.run[data-run-id="${runF}"] .tool summary`)
  await shot(page, 'session-fork-turn')
  const saved = await (await fetch(`${process.env.BATON_GATEWAY_URL}/api/threads/${encodeURIComponent(forkThread)}/runs`,
    { headers: { Authorization: `Bearer ${process.env.BATON_API_KEY}` } })).json()
  results.fork = { thread: forkThread, run: runF, readF, forkedFrom: saved.forkedFrom, shown }

  // A phone width: the field wraps, nothing scrolls sideways.
  const phoneCtx = await newContext(browser, { width: 390, height: 844 })
  const phone = await newPage(phoneCtx)
  await open(phone, '/')
  await phone.selectOption('#agent', { label: 'claude-code' })
  await phone.fill('#ws-git', repo)
  await shot(phone, 'session-phone', { fullPage: true })
  const overflow = await phone.evaluate(() => document.documentElement.scrollWidth - window.innerWidth)
  check(overflow <= 0, 'the phone layout scrolls sideways', { overflow })
  noProblems(phone, 'phone')
  await phoneCtx.close()
  noProblems(page, 'session page') // the refused POST's 400 was expected
})
