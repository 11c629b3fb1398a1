// Shared helpers of the Playwright tests of the web pages (page_chat.mjs, page_takeover.mjs).
//
// Env: BATON_GATEWAY_URL, BATON_API_KEY (the tenant's bearer key), BATON_ARTIFACTS (where
// screenshots go). Each script prints one JSON line {ok, ...results} and exits 1 on failure.
import { chromium } from 'playwright-core'
import fs from 'node:fs'
import path from 'node:path'
import readline from 'node:readline'

export const base = process.env.BATON_GATEWAY_URL
export const apiKey = process.env.BATON_API_KEY ?? ''
export const artifacts = process.env.BATON_ARTIFACTS ?? ''
export const results = { screenshots: [] }

export class Failure extends Error {}

let stdinLines = null

/**
 * Ask the Python test to do something (kill a host, write a record): print `msg` as one
 * JSON line and wait for its answer line on stdin.
 */
export async function ask (msg) {
  if (!stdinLines) {
    stdinLines = readline.createInterface({ input: process.stdin })
    stdinLines.waiting = []
    stdinLines.on('line', (line) => stdinLines.waiting.shift()?.(line))
  }
  const answer = new Promise((resolve) => stdinLines.waiting.push(resolve))
  console.log(JSON.stringify(msg))
  return answer
}

/** Fail the test with a message and what was seen. */
export function check (cond, msg, extra = {}) {
  if (!cond) throw Object.assign(new Failure(msg), { extra })
}

export async function api (p, init = {}) {
  const headers = { ...(init.headers ?? {}), ...(apiKey ? { Authorization: `Bearer ${apiKey}` } : {}) }
  return fetch(`${base}${p}`, { ...init, headers })
}

/** The run's log from the start: [{id, chunk}] (the log must be closed). */
export async function rawLog (runId) {
  const text = await (await api(`/api/chat?runId=${encodeURIComponent(runId)}&offset=-1`)).text()
  const out = []
  for (const block of text.split('\n\n')) {
    const lines = block.split('\n')
    const id = lines.find((l) => l.startsWith('id: '))
    const data = lines.find((l) => l.startsWith('data: '))
    if (id && data) out.push({ id: id.slice(4), chunk: JSON.parse(data.slice(6)) })
  }
  return out
}

export async function record (runId) {
  return (await api(`/api/runs/${encodeURIComponent(runId)}`)).json()
}

export async function launch () {
  return chromium.launch({
    executablePath: '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking']
  })
}

/**
 * A page that records console errors, page errors, dialogs and failed requests (any
 * answer >= 400 except the ones a test expects), with the API key already stored.
 * `polled`: path prefixes of reads the page asks again after a 503 (the operator view's
 * `/api/ops/`): a loaded gateway may answer one so, and the page shows the data once the
 * read succeeds, which the test checks. Those 503s go to `page.retried`, not the problems.
 */
export async function newPage (context, { expectStatus = [], polled = [] } = {}) {
  const page = await context.newPage()
  page.problems = []
  page.retried = []
  page.on('pageerror', (e) => page.problems.push(`pageerror: ${e}`))
  // Chromium logs every answer >= 400 as a console error; those are judged by status below.
  page.on('console', (m) => {
    if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) page.problems.push(`console: ${m.text()}`)
  })
  page.on('dialog', async (d) => { page.problems.push(`dialog: ${d.message()}`); await d.dismiss() })
  page.on('response', (r) => {
    if (r.status() < 400 || expectStatus.includes(r.status())) return
    const again = r.status() === 503 && r.request().method() === 'GET' &&
      polled.some((prefix) => new URL(r.url()).pathname.startsWith(prefix))
    const what = `HTTP ${r.status()} ${r.url()}`
    if (again) page.retried.push(what)
    else page.problems.push(what)
  })
  return page
}

export async function newContext (browser, viewport = { width: 1280, height: 860 }) {
  const context = await browser.newContext({ viewport })
  await context.addInitScript((key) => { localStorage.setItem('baton.apiKey', key) }, apiKey)
  return context
}

export async function open (page, url) {
  await page.goto(`${base}${url}`)
  await page.evaluate(() => window.__batonReady)
}

/** Pick an agent (adds it to the picker if the gateway does not list it). */
export async function chooseAgent (page, spec) {
  await page.evaluate((value) => {
    const sel = document.getElementById('agent')
    if (![...sel.options].some((o) => o.value === value)) {
      const opt = document.createElement('option')
      opt.value = value
      opt.textContent = 'test agent'
      sel.append(opt)
    }
    sel.value = value
  }, JSON.stringify(spec))
}

/** Type a prompt and send it with the keyboard (Enter); returns the new run id. */
export async function send (page, spec, prompt) {
  if (spec) await chooseAgent(page, spec)
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

export const pill = (page) => page.textContent('#run-state')

/** Wait until the page shows the run ended in `state` (the pill's data-state). */
export async function waitState (page, state, timeout = 60000) {
  await page.waitForFunction((s) => !window.__baton.live && document.getElementById('run-state').dataset.state === s &&
    document.querySelector('#transcript > section.run:last-child .outcome'), state, { timeout })
}

/** The run's section as a user reads it. */
export async function runSection (page, runId) {
  return page.evaluate((id) => {
    const s = document.querySelector(`section.run[data-run-id="${CSS.escape(id)}"]`)
    if (!s) return null
    const texts = (sel) => [...s.querySelectorAll(sel)].map((e) => e.textContent)
    return {
      user: texts('.msg.user'),
      assistant: texts('.run-body > .msg.assistant .text').join(''),
      reasoning: texts('.reasoning .text').join(''),
      tools: [...s.querySelectorAll('.tool')].map((t) => ({ name: t.querySelector('.tool-name').textContent, state: t.dataset.state })),
      errors: texts('.run-error'),
      notes: texts('.note'),
      takeovers: texts('.note.takeover'),
      outcome: s.querySelector('.outcome')?.textContent ?? null,
      usage: s.querySelector('.usage')?.textContent ?? null
    }
  }, runId)
}

export const rendered = (page) => page.evaluate(() => window.__baton.rendered())

/** Check every offset of the run's log was rendered exactly once, in order. */
export function checkOnce (renderedOffsets, log, what) {
  check(new Set(renderedOffsets).size === renderedOffsets.length, `${what}: an offset was rendered twice`)
  const want = log.map((e) => e.id)
  const got = renderedOffsets.filter((o) => want.includes(o))
  check(JSON.stringify(got) === JSON.stringify(want), `${what}: rendered offsets differ from the log`, { got, want })
}

export const textOf = (log) => log.filter((e) => e.chunk.type === 'TEXT_MESSAGE_CONTENT' && !e.chunk.subagentRunId)
  .map((e) => e.chunk.delta).join('')

export async function shot (page, name, { fullPage = false } = {}) {
  if (!artifacts) return
  fs.mkdirSync(artifacts, { recursive: true })
  const file = path.join(artifacts, `${name}.png`)
  await page.screenshot({ path: file, fullPage })
  results.screenshots.push(file)
}

export function noProblems (page, what) {
  check(page.problems.length === 0, `${what}: console errors or failed requests`, { problems: page.problems })
}

/** Run `body(browser)`; print the JSON result line; exit 1 on failure. */
export async function main (body) {
  const browser = await launch()
  let ok = false
  try {
    await body(browser)
    ok = true
  } catch (err) {
    results.error = String(err?.message ?? err)
    if (err?.extra) results.extra = err.extra
    if (!(err instanceof Failure)) results.stack = String(err?.stack ?? '')
    // What the pages showed when it failed.
    results.pages = []
    for (const ctx of browser.contexts()) {
      for (const p of ctx.pages()) {
        results.pages.push(await p.evaluate(() => ({
          url: location.href, state: document.getElementById('run-state')?.textContent,
          info: document.getElementById('run-info')?.textContent, body: document.body.innerText.slice(-1500)
        })).catch((e) => String(e)))
      }
    }
  } finally {
    await browser.close()
    stdinLines?.close()
  }
  console.log(JSON.stringify({ ok, ...results }))
  process.exit(ok ? 0 : 1)
}
