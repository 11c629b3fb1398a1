// A real browser (Debian chromium via playwright-core) drives the gateway's web page:
// 1. start a slow replay run, reload mid-run: the page finds the active run and rejoins;
//    every offset is rendered exactly once and the text equals the log's;
// 2. Stop another run: it ends cancelled (record aborted);
// 3. a journal full of <script> and <img onerror> renders as text, runs nothing.
//
// Env: BATON_GATEWAY_URL. Prints one JSON line; exits 1 on failure.
import { chromium } from 'playwright-core'

const base = process.env.BATON_GATEWAY_URL
const results = {}

function fail(msg, extra = {}) {
  console.log(JSON.stringify({ ok: false, error: msg, ...results, ...extra }))
  process.exit(1)
}

async function rawLog(runId) {
  const text = await (await fetch(`${base}/api/chat?runId=${encodeURIComponent(runId)}&offset=-1`)).text()
  const out = []
  for (const block of text.split('\n\n')) {
    const lines = block.split('\n')
    const id = lines.find((l) => l.startsWith('id: '))
    const data = lines.find((l) => l.startsWith('data: '))
    if (id && data) out.push({ id: id.slice(4), chunk: JSON.parse(data.slice(6)) })
  }
  return out
}

async function chooseAgent(page, spec) {
  await page.evaluate((value) => {
    const sel = document.getElementById('agent')
    const opt = document.createElement('option')
    opt.value = value
    opt.textContent = 'test agent'
    sel.append(opt)
    sel.value = value
  }, JSON.stringify(spec))
}

async function newThread(page) {
  await page.click('#new-thread')
  return page.inputValue('#thread')
}

async function startRun(page, spec, prompt) {
  await chooseAgent(page, spec)
  await page.fill('#prompt', prompt)
  await page.click('#send')
  await page.waitForFunction(() => document.getElementById('run-id').textContent.startsWith('run-'))
  return page.textContent('#run-id')
}

const waitDone = (page, timeout = 60000) =>
  page.waitForFunction(() => document.getElementById('status').textContent === 'done', null, { timeout })

const assistantText = (page) => page.evaluate(() =>
  [...document.querySelectorAll('#transcript .msg.assistant .text')].map((e) => e.textContent).join(''))

const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking'],
})
try {
  const page = await browser.newPage()
  const pageErrors = []
  page.on('pageerror', (e) => pageErrors.push(String(e)))
  page.on('dialog', async (d) => { pageErrors.push(`dialog: ${d.message()}`); await d.dismiss() })
  await page.goto(base)
  await page.evaluate(() => window.__batonReady)

  // 1. reload mid-run → rejoin with no duplicate
  await newThread(page)
  const runA = await startRun(page, { kind: 'replay', journal: 'claude-stream-json/slow.jsonl', speed: 1, delay: 0.08 }, 'count')
  await page.waitForFunction(() => window.__batonRendered.length >= 12)
  const beforeReload = await page.evaluate(() => window.__batonRendered.length)
  await page.reload()
  await page.waitForFunction((id) => document.getElementById('run-id').textContent === id, runA)
  await waitDone(page)
  const rendered = await page.evaluate(() => window.__batonRendered)
  const logA = await rawLog(runA)
  results.reload = { runA, beforeReload, rendered: rendered.length, log: logA.length }
  if (new Set(rendered).size !== rendered.length) fail('an offset was rendered twice after the reload')
  if (JSON.stringify(rendered) !== JSON.stringify(logA.map((e) => e.id))) fail('rendered offsets differ from the log')
  const wantText = logA.filter((e) => e.chunk.type === 'TEXT_MESSAGE_CONTENT').map((e) => e.chunk.delta).join('')
  const gotText = await assistantText(page)
  if (gotText !== wantText) fail('rendered text differs from the log', { gotText, wantText })
  results.reload.text = gotText

  // 2. Stop → cancel
  await newThread(page)
  const runB = await startRun(page, { kind: 'replay', journal: 'claude-stream-json/slow.jsonl', speed: 1, delay: 0.3 }, 'stop me')
  await page.waitForFunction(() => document.querySelectorAll('#transcript .msg.assistant').length >= 1)
  await page.click('#stop')
  await waitDone(page)
  const run = await (await fetch(`${base}/api/runs/${encodeURIComponent(runB)}`)).json()
  const errorText = await page.evaluate(() => [...document.querySelectorAll('#transcript .error')].map((e) => e.textContent))
  results.stop = { runB, status: run.status, errorText }
  if (run.status !== 'aborted') fail('the stopped run is not aborted')
  if (!errorText.some((t) => t.includes('cancelled'))) fail('no cancelled error rendered')

  // 3. hostile journal renders as text
  await newThread(page)
  await startRun(page, { kind: 'replay', journal: 'claude-stream-json/xss.jsonl', speed: 0 }, 'xss')
  await waitDone(page)
  const xss = await page.evaluate(() => ({
    flag: window.__xss ?? null,
    imgs: document.querySelectorAll('#transcript img').length,
    scripts: document.querySelectorAll('#transcript script').length,
    bold: document.querySelectorAll('#transcript b').length,
    text: [...document.querySelectorAll('#transcript .msg.assistant .text')].map((e) => e.textContent).join(''),
  }))
  results.xss = xss
  if (xss.flag !== null || xss.imgs || xss.scripts || xss.bold) fail('agent output was interpreted as HTML')
  if (!xss.text.includes('<script>window.__xss = 1</script>') || !xss.text.includes('<img src=x onerror="window.__xss = 2">')) {
    fail('the hostile text was not shown verbatim')
  }
  if (pageErrors.length) fail('page errors', { pageErrors })
  console.log(JSON.stringify({ ok: true, ...results }))
} finally {
  await browser.close()
}
