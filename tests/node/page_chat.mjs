// The chat page in a real browser (Debian chromium via playwright-core), as a user uses it:
// 1. reload mid-reasoning, mid-text and after the end; a second tab on the same URL: every
//    offset rendered once, the prompt in every tab, reasoning, tool card, usage, outcome;
// 2. a second Send on a busy thread is refused with the reason and a Stop offer; Stop ends
//    the run as its own state (aborted); Esc stops a streaming run too (not from the agent
//    picker); a run paused for the user shows as interrupted, live and after a reload (the
//    Python test plays the pausing host: no shipped agent asks a human yet);
// 3. failed runs show their own state and a sentence with the code (a Codex JSON error too);
// 4. hostile agent output (<script>, <img onerror>, markdown image and javascript: links)
//    renders inert, while real markdown renders;
// 5. the threads list opens any thread; the URL names it; back/forward work;
// 6. a phone width has no sideways scroll; /favicon.ico answers; no console errors.
import {
  api, ask, check, checkOnce, main, newContext, newPage, open, pill, rawLog, record, rendered, results, runSection,
  send, shot, textOf, waitState, noProblems
} from './page_lib.mjs'

const J = (journal, extra = {}) => ({ kind: 'replay', journal, speed: 1, ...extra })

await main(async (browser) => {
  const context = await newContext(browser)
  const page = await newPage(context, { expectStatus: [409] })
  await open(page, '/')

  // --- 1. reloads and a second tab -------------------------------------------------------
  const runA = await send(page, J('claude-stream-json/thinking.jsonl', { delay: 0.1 }), 'why is git failing?')
  const threadA = new URL(page.url()).searchParams.get('thread')
  check(threadA, 'the URL does not name the thread')
  await page.waitForFunction(() => {
    const r = document.querySelector('.reasoning .text')
    return r && r.textContent.length > 20 && document.querySelector('.reasoning .label').textContent === 'Thinking…'
  })
  await shot(page, 'chat-mid-run')
  // Screen readers hear finished messages and run states (#announce), not every delta.
  results.a11y = await page.evaluate(() => ({
    liveTranscript: document.getElementById('transcript').closest('[aria-live]') !== null,
    status: document.getElementById('announce')?.getAttribute('aria-live'),
    previewWraps: getComputedStyle(document.querySelector('.reasoning .preview')).whiteSpace !== 'nowrap',
    stickyNav: getComputedStyle(document.querySelector('.top')).position === 'sticky'
  }))
  check(!results.a11y.liveTranscript && results.a11y.status === 'polite' && results.a11y.previewWraps && results.a11y.stickyNav,
    'the transcript is a live region, or the status region is missing, or the thought preview is one line', results.a11y)
  const beforeReload = (await rendered(page)).length
  await page.reload()
  await page.evaluate(() => window.__batonReady)
  await page.waitForFunction((id) => document.querySelector(`section.run[data-run-id="${id}"] .msg.user`), runA)
  results.rejoinedLive = await page.evaluate((id) => window.__baton.live?.runId === id, runA)
  const midReasoning = await runSection(page, runA)
  check(midReasoning.user.includes('why is git failing?'), 'no prompt after the reload', midReasoning)

  const tab2 = await newPage(context)
  await open(tab2, `/?thread=${encodeURIComponent(threadA)}`)
  await page.waitForFunction(() => document.querySelector('.run-body > .msg.assistant'))
  results.midText = await page.evaluate(() => !!window.__baton.live)
  await page.reload() // mid-text
  await page.evaluate(() => window.__batonReady)
  await waitState(page, 'completed')
  await waitState(tab2, 'completed')
  const logA = await rawLog(runA)
  checkOnce(await rendered(page), logA, 'reloaded tab')
  checkOnce(await rendered(tab2), logA, 'second tab')
  const a1 = await runSection(page, runA)
  const a2 = await runSection(tab2, runA)
  check(JSON.stringify(a1) === JSON.stringify(a2), 'the two tabs show different conversations', { a1, a2 })
  const wantReasoning = logA.filter((e) => e.chunk.type === 'REASONING_MESSAGE_CONTENT').map((e) => e.chunk.delta).join('')
  check(a1.reasoning === wantReasoning, 'reasoning differs from the log')
  check(a1.assistant.replace(/\s+/g, ' ').includes('current directory isn'), 'assistant text missing', a1)
  check(a1.tools.length === 1 && a1.tools[0].name === 'Bash' && a1.tools[0].state === 'error', 'tool card wrong', a1.tools)
  // The card holds the arguments and the error; the duration shows when the call was seen live.
  const card = await page.evaluate((id) => {
    const t = document.querySelector(`section.run[data-run-id="${id}"] .tool`)
    return { args: t.querySelector('.tool-args').textContent, result: t.querySelector('.tool-result').textContent,
      labels: [...t.querySelectorAll('.tool-label')].map((e) => e.textContent), state: t.querySelector('.tool-state').textContent }
  }, runA)
  const toolLog = logA.find((e) => e.chunk.type === 'TOOL_CALL_RESULT').chunk
  check(JSON.parse(card.args).command === 'git status && git branch -v' && card.result === toolLog.content &&
    JSON.stringify(card.labels) === '["Arguments","Error"]' && /^error( · \S.*)?$/.test(card.state), 'tool card content wrong', card)
  // Reasoning is folded under a summary that counts its words, and opens on a click.
  const thought = () => page.evaluate((id) => {
    const r = document.querySelector(`section.run[data-run-id="${id}"] .reasoning`)
    return { tag: r.tagName, open: r.open, label: r.querySelector('.label').textContent }
  }, runA)
  const folded = await thought()
  check(folded.tag === 'DETAILS' && !folded.open && /^Thought · \d+ words$/.test(folded.label), 'reasoning is not folded', folded)
  await page.click(`section.run[data-run-id="${runA}"] .reasoning summary`)
  check((await thought()).open, 'reasoning does not open')
  await page.click(`section.run[data-run-id="${runA}"] .reasoning summary`)
  check(a1.usage && a1.usage.includes('$0.0313'), 'no usage and cost', a1)
  check(a1.outcome.startsWith('Completed'), 'no completed outcome', a1)
  check(await pill(page) === 'completed', 'pill is not completed')
  results.announced = await page.textContent('#announce')
  check(/^(Run completed|Agent: )/.test(results.announced), 'the end of the run was not announced', { announced: results.announced })
  check((await page.textContent('#run-info')).includes('epoch 1'), 'no epoch shown')
  await page.click(`section.run[data-run-id="${runA}"] .tool summary`)
  await shot(page, 'chat-finished')
  // A transcript taller than the window: the navigation and the run bar stay on screen.
  await page.setViewportSize({ width: 1280, height: 420 })
  await page.evaluate(() => window.scrollTo(0, document.documentElement.scrollHeight))
  results.stuck = await page.evaluate(() => ({
    scrolled: window.scrollY,
    nav: document.querySelector('.top').getBoundingClientRect().top,
    bar: document.querySelector('.run-bar').getBoundingClientRect().top - document.querySelector('.top').offsetHeight
  }))
  check(results.stuck.scrolled > 0 && results.stuck.nav === 0 && Math.abs(results.stuck.bar) < 1,
    'the navigation or the run bar scrolled away', results.stuck)
  await shot(page, 'chat-scrolled')
  await page.setViewportSize({ width: 1280, height: 860 })
  await page.reload() // after the end
  await page.evaluate(() => window.__batonReady)
  await page.waitForFunction(() => document.querySelector('.outcome'))
  const a3 = await runSection(page, runA)
  check(JSON.stringify(a3) === JSON.stringify(a1), 'the reload after the end shows something else', { a3, a1 })
  checkOnce(await rendered(page), logA, 'reload after the end')
  // A closed log read back has no call durations to show (chunks carry no time).
  const stateAfterEnd = await page.textContent(`section.run[data-run-id="${runA}"] .tool-state`)
  check(stateAfterEnd === 'error', 'a tool duration made up from a backlog read', { stateAfterEnd })
  results.reload = { runA, threadA, beforeReload, log: logA.length, reasoning: a1.reasoning.length, text: textOf(logA) }
  await tab2.close()
  noProblems(tab2, 'second tab')

  // --- 2. busy thread: refused Send, then Stop ---------------------------------------------
  await page.click('#new-thread')
  const runB = await send(page, J('claude-stream-json/slow.jsonl', { delay: 1 }), 'count to forty')
  await page.waitForFunction(() => document.querySelectorAll('.run-body > .msg.assistant').length >= 2)
  await page.fill('#prompt', 'and then?')
  await page.keyboard.press('Enter')
  await page.waitForSelector('#busy:not([hidden])')
  const busy = await page.textContent('#busy')
  check(busy.includes('already has a run in progress'), 'the refusal does not say why', { busy })
  check(await page.evaluate(() => window.__baton.live?.runId) === runB, 'the refused Send replaced the shown run')
  check(await page.isEnabled('#stop'), 'Stop is not available on the busy thread')
  check(await page.inputValue('#prompt') === 'and then?', 'the refused prompt was lost')
  check(await pill(page) === 'running', 'the pill does not say running', { pill: await pill(page) })
  check(await page.isVisible('#busy button.steer'), 'the busy thread offers no way to send into the running turn')
  await shot(page, 'chat-busy')
  await page.click('#busy button.danger')
  await waitState(page, 'aborted')
  const b = await runSection(page, runB)
  const recB = await record(runB)
  check(recB.status === 'aborted', 'the stopped run is not aborted', recB)
  check(await pill(page) === 'stopped', 'the pill does not say stopped')
  check(b.errors.some((t) => t.includes('The run was stopped.') && t.includes('(code: cancelled)')), 'no cancel sentence', b)
  check(b.notes.some((t) => t.includes('you pressed Stop')), 'no cancel confirmation note', b)
  check(b.outcome.startsWith('Stopped'), 'no stopped outcome', b)
  await shot(page, 'chat-cancelled')
  results.stop = { runB, status: recB.status, errors: b.errors }

  // Esc stops a streaming run from the composer; Esc in the agent picker is the picker's.
  const cancels = []
  page.on('request', (r) => { if (new URL(r.url()).pathname === '/api/chat/cancel') cancels.push(r.method()) })
  await page.click('#new-thread')
  const runF = await send(page, J('claude-stream-json/slow.jsonl', { delay: 1 }), 'count once more')
  await page.waitForFunction(() => document.querySelectorAll('.run-body > .msg.assistant').length >= 2)
  await page.focus('#agent')
  await page.keyboard.press('Escape')
  const afterPicker = await page.evaluate(() => document.getElementById('run-state').dataset.state)
  check(afterPicker !== 'stopping' && await page.isEnabled('#stop'), 'Esc in the agent picker stopped the run', { afterPicker })
  await page.fill('#prompt', 'a draft')
  await page.focus('#prompt')
  await page.keyboard.press('Escape')
  await waitState(page, 'aborted')
  const f = await runSection(page, runF)
  const recF = await record(runF)
  check(recF.status === 'aborted', 'the run stopped with Esc is not aborted', recF)
  check(JSON.stringify(cancels) === '["POST"]', 'Esc did not send exactly one cancel', { cancels })
  // The pill and Stop settle with the final record (read after the log closed), which may
  // come a moment after the state waitState saw: wait for them, then say what they show.
  await page.waitForFunction(() => document.getElementById('run-state').textContent === 'stopped' &&
    document.getElementById('stop').disabled, null, { timeout: 10000 }).catch(() => {})
  check(await pill(page) === 'stopped' && !(await page.isEnabled('#stop')), 'the pill does not say stopped after Esc',
    { pill: await pill(page), stop: await page.isEnabled('#stop') })
  check(f.notes.some((t) => t.includes('you pressed Stop')) && f.outcome.startsWith('Stopped'), 'no stopped run after Esc', f)
  check(await page.inputValue('#prompt') === 'a draft', 'Esc lost the draft')
  await page.fill('#prompt', '')
  results.esc = { runF, status: recF.status, cancels: cancels.length, afterPicker }

  // A run that pauses for the user (HITL): `interrupted`, its own state and sentence.
  const hitl = { threadId: `thread-${crypto.randomUUID().slice(0, 8)}`, runId: `run-${crypto.randomUUID()}`,
    host: 'host-hitl', prompt: 'clean the build directory' }
  await ask({ hitl: 'start', ...hitl }) // record, claim, fence; run.accepted and the first text
  await open(page, `/?thread=${encodeURIComponent(hitl.threadId)}`)
  // Live: running, on its host and epoch, the first words shown.
  await page.waitForFunction(({ runId, host }) => window.__baton.live?.runId === runId &&
    document.getElementById('run-state').dataset.state === 'running' &&
    document.getElementById('run-info').textContent.startsWith(`host ${host} · epoch 1`) &&
    document.querySelector('.run-body > .msg.assistant')?.textContent === 'I will delete the build directory.', hitl)
  await ask({ hitl: 'interrupt', ...hitl }) // RUN_FINISHED outcome interrupt, close, status, release
  await waitState(page, 'interrupted')
  const seen = async () => ({
    section: await runSection(page, hitl.runId),
    pill: await pill(page),
    state: await page.evaluate(() => document.getElementById('run-state').dataset.state),
    info: await page.textContent('#run-info'),
    stop: await page.isEnabled('#stop')
  })
  const h = await seen()
  check(h.pill === 'interrupted' && h.state === 'interrupted' && !h.stop, 'the pill does not say interrupted', h)
  check(h.section.outcome === 'Paused: the agent is waiting for input (interrupted).', 'no paused sentence', h)
  check(JSON.stringify(h.section.user) === JSON.stringify([hitl.prompt]) &&
    h.section.assistant === 'I will delete the build directory. May I go ahead?' && h.section.errors.length === 0, 'the paused run shows something else', h)
  check(h.info.startsWith(`host ${hitl.host} · epoch 1`) && !/detached|reaper/.test(h.info), 'wrong run details for a paused run', h)
  await shot(page, 'chat-interrupted')
  const logH = await rawLog(hitl.runId)
  checkOnce(await rendered(page), logH, 'interrupted run')
  await page.reload()
  await page.evaluate(() => window.__batonReady)
  await page.waitForFunction(() => document.querySelector('.outcome'))
  const h2 = await seen()
  check(JSON.stringify(h2) === JSON.stringify(h), 'the reload shows the paused run differently', { h, h2 })
  checkOnce(await rendered(page), logH, 'interrupted run after a reload')
  await page.waitForFunction((t) => document.querySelector(`#threads a[data-thread-id="${t}"] .badge`)?.textContent === 'interrupted',
    hitl.threadId, { timeout: 10000 })
  results.interrupted = { ...hitl, shown: h, status: (await record(hitl.runId)).status }

  // --- 3. failed runs ---------------------------------------------------------------------------
  await page.click('#new-thread')
  const runC = await send(page, J('claude-stream-json/max-turns.jsonl', { speed: 0 }), 'summarise')
  await waitState(page, 'failed')
  const c = await runSection(page, runC)
  check(c.errors.some((t) => t.includes('maximum number of turns') && t.includes('(code: error_max_turns)')), 'no failure sentence', c)
  check(c.outcome.startsWith('Failed'), 'no failed outcome', c)
  check(!c.notes.some((t) => /claude\.(init|result)/.test(t)), 'internal event names shown', c)
  const runD = await send(page, J('codex-exec-json/turn-failed.jsonl', { speed: 0 }), 'search the web')
  await waitState(page, 'failed')
  const d = await runSection(page, runD)
  check(d.errors.length === 1 && d.errors[0].includes("Unsupported value: 'minimal'") && !d.errors[0].includes('{'),
    'the Codex error is not a readable sentence', d)
  check(await pill(page) === 'failed', 'the pill does not say failed')
  await shot(page, 'chat-failed')
  results.failed = { c: c.errors, d: d.errors, statusC: (await record(runC)).status, statusD: (await record(runD)).status }

  // subagent activity sits inside the card of the tool call that started it
  await page.click('#new-thread')
  const runS = await send(page, J('claude-stream-json/subagents.jsonl', { speed: 0 }), 'diagnose')
  await waitState(page, 'completed')
  const sub = await page.evaluate((id) => {
    const s = document.querySelector(`section.run[data-run-id="${id}"]`)
    return {
      subagents: [...s.querySelectorAll('.tool .subagent')].map((e) => ({
        name: e.querySelector('.sub-name').textContent, state: e.dataset.state,
        parent: e.closest('.tool').querySelector('.tool-name').textContent,
        tools: e.querySelectorAll('.sub-body .tool').length })),
      topTools: s.querySelectorAll('.run-body > .tool').length
    }
  }, runS)
  const logS = await rawLog(runS)
  const nested = logS.filter((e) => e.chunk.type === 'TOOL_CALL_START' && e.chunk.subagentRunId).length
  const top = logS.filter((e) => e.chunk.type === 'TOOL_CALL_START' && !e.chunk.subagentRunId).length
  results.subagents = { ...sub, nested, top }
  check(sub.subagents.length === 2 && sub.subagents.every((x) => x.state === 'done' && x.parent === 'Task'),
    'subagents are not grouped under their Task call', sub)
  check(sub.subagents.reduce((n, x) => n + x.tools, 0) === nested && sub.topTools === top,
    'subagent tool calls are not nested under their parent', results.subagents)

  // --- 4. hostile output ---------------------------------------------------------------------------
  const fetched = []
  page.on('request', (r) => { if (!r.url().startsWith(process.env.BATON_GATEWAY_URL)) fetched.push(r.url()) })
  await page.click('#new-thread')
  const runE = await send(page, J('claude-stream-json/hostile.jsonl', { speed: 0 }), 'be evil')
  await waitState(page, 'completed')
  const xss = await page.evaluate((id) => {
    const s = document.querySelector(`section.run[data-run-id="${id}"]`)
    return {
      flag: window.__xss ?? null,
      imgs: document.querySelectorAll('#transcript img, #transcript iframe, #transcript script').length,
      bold: s.querySelectorAll('b').length,
      links: [...s.querySelectorAll('a')].map((a) => a.href),
      images: [...s.querySelectorAll('.md-image')].map((e) => e.textContent),
      strong: [...s.querySelectorAll('strong')].map((e) => e.textContent),
      code: [...s.querySelectorAll('pre code')].map((e) => e.textContent),
      items: s.querySelectorAll('.msg.assistant .text li').length,
      messages: [...s.querySelectorAll('.msg.assistant .text')].map((e) => e.textContent)
    }
  }, runE)
  results.xss = xss
  check(xss.flag === null && xss.imgs === 0 && xss.bold === 0, 'agent output was interpreted as HTML', xss)
  check(JSON.stringify(xss.links) === JSON.stringify(['https://example.com/']), 'unsafe or missing links', xss)
  check(xss.images.length === 1 && xss.images[0] === 'image: tracker', 'the markdown image is not inert text', xss)
  check(fetched.length === 0, 'the page fetched something off the gateway', { fetched })
  check(xss.messages[0] === '<script>window.__xss = 1</script>' && xss.messages[1] === '<img src=x onerror="window.__xss = 2">',
    'the hostile text is not shown verbatim', xss)
  check(xss.strong.includes('bold') && xss.code.includes('<script>window.__xss = 4</script>') && xss.items === 2,
    'markdown was not rendered', xss)
  await shot(page, 'chat-hostile')

  // --- 5. threads list, URL, history --------------------------------------------------------------
  await page.waitForFunction((t) => document.querySelector(`#threads a[data-thread-id="${t}"]`), threadA, { timeout: 10000 })
  const listed = await page.evaluate(() => [...document.querySelectorAll('#threads a')].map((a) => ({
    thread: a.dataset.threadId, status: a.querySelector('.badge').textContent })))
  results.threads = listed
  const statusOf = (t) => listed.find((x) => x.thread === t)?.status
  check(statusOf(threadA) === 'completed', 'thread A not listed as completed', { listed })
  const threadE = new URL(page.url()).searchParams.get('thread')
  await page.click(`#threads a[data-thread-id="${threadA}"]`)
  await page.waitForFunction((id) => document.querySelector(`section.run[data-run-id="${id}"] .outcome`), runA)
  check(new URL(page.url()).searchParams.get('thread') === threadA, 'the URL does not follow the thread')
  check(JSON.stringify(await runSection(page, runA)) === JSON.stringify(a1), 'opening thread A from the list differs')
  await page.goBack()
  await page.waitForFunction((id) => document.querySelector(`section.run[data-run-id="${id}"] .outcome`), runE)
  check(new URL(page.url()).searchParams.get('thread') === threadE, 'back does not reopen the previous thread')

  // --- 6. phone width, favicon, errors ---------------------------------------------------------------
  const phoneCtx = await newContext(browser, { width: 390, height: 844 })
  const phone = await newPage(phoneCtx)
  await open(phone, `/?thread=${encodeURIComponent(threadA)}`)
  await phone.waitForFunction(() => document.querySelector('.outcome'))
  await shot(phone, 'chat-phone')
  const overflow = await phone.evaluate(() => document.documentElement.scrollWidth - window.innerWidth)
  check(overflow <= 0, 'the phone layout scrolls sideways', { overflow })
  noProblems(phone, 'phone')
  await phoneCtx.close()
  const icon = await api('/favicon.ico')
  check(icon.status === 200 && (icon.headers.get('content-type') ?? '').startsWith('image/'), 'no favicon')
  noProblems(page, 'chat page')
})
