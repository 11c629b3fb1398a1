// The baton web page: start a run, watch it stream, reload and rejoin, stop.
//
// Agent output is untrusted: it is only ever put in the page with textContent (never
// innerHTML), so a journal full of <script> or <img onerror> shows up as text.
//
// Reload without duplicates: every chunk rendered is kept, with its offset, in
// sessionStorage. After a reload the page asks GET /api/chat/active for the thread's live
// run, re-renders what it kept, and joins strictly after the last offset it rendered.

const $ = (id) => document.getElementById(id);
const store = {
  get: (k, d) => { try { return JSON.parse(sessionStorage.getItem(k)) ?? d } catch { return d } },
  set: (k, v) => sessionStorage.setItem(k, JSON.stringify(v)),
};

// Offsets rendered on this page, in order (tests read it to check for duplicates).
window.__batonRendered = [];
let current = null; // { runId, controller }

function apiHeaders(extra = {}) {
  const key = $('api-key').value.trim();
  return key ? { Authorization: `Bearer ${key}`, ...extra } : extra;
}

function setStatus(state, text) {
  const el = $('status');
  el.dataset.state = state;
  el.textContent = text ?? state;
}

function threadId() {
  let t = $('thread').value.trim();
  if (!t) {
    t = `thread-${crypto.randomUUID().slice(0, 8)}`;
    $('thread').value = t;
  }
  localStorage.setItem('baton.thread', t);
  return t;
}

// --- rendering (textContent only) ----------------------------------------------------

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function messageBox(id, role) {
  let box = document.querySelector(`[data-message-id="${CSS.escape(id)}"]`);
  if (!box) {
    box = el('div', `msg ${role}`);
    box.dataset.messageId = id;
    box.append(el('span', 'role', role), el('span', 'text'));
    $('transcript').append(box);
  }
  return box;
}

function toolBox(id, name) {
  let box = document.querySelector(`[data-tool-call-id="${CSS.escape(id)}"]`);
  if (!box) {
    box = el('div', 'tool');
    box.dataset.toolCallId = id;
    box.append(el('span', 'role', `tool ${name ?? ''}`), el('pre', 'args'), el('pre', 'result'));
    $('transcript').append(box);
  }
  return box;
}

function render(offset, chunk) {
  window.__batonRendered.push(offset);
  switch (chunk.type) {
    case 'TEXT_MESSAGE_START':
      messageBox(chunk.messageId, chunk.role ?? 'assistant');
      break;
    case 'TEXT_MESSAGE_CONTENT': {
      const t = messageBox(chunk.messageId, 'assistant').querySelector('.text');
      t.textContent += chunk.delta ?? '';
      break;
    }
    case 'TEXT_MESSAGE_CHUNK': {
      const t = messageBox(chunk.messageId ?? 'm', chunk.role ?? 'assistant').querySelector('.text');
      t.textContent += chunk.delta ?? '';
      break;
    }
    case 'TOOL_CALL_START':
      toolBox(chunk.toolCallId, chunk.toolCallName);
      break;
    case 'TOOL_CALL_ARGS':
      toolBox(chunk.toolCallId).querySelector('.args').textContent += chunk.delta ?? '';
      break;
    case 'TOOL_CALL_RESULT': {
      const c = typeof chunk.content === 'string' ? chunk.content : JSON.stringify(chunk.content);
      toolBox(chunk.toolCallId).querySelector('.result').textContent += c;
      break;
    }
    case 'RUN_ERROR':
      $('transcript').append(el('div', 'error', `error: ${chunk.message ?? ''}${chunk.code ? ` (${chunk.code})` : ''}`));
      break;
    case 'RUN_FINISHED':
      $('transcript').append(el('div', 'custom', 'run finished'));
      break;
    case 'CUSTOM':
      $('transcript').append(el('div', 'custom', `${chunk.name}`));
      break;
    default:
      break; // RUN_STARTED, steps, ends: nothing to show
  }
}

function renderUser(text) {
  const box = el('div', 'msg user');
  box.append(el('span', 'role', 'you'), el('span', 'text', text));
  $('transcript').append(box);
}

// --- streaming -----------------------------------------------------------------------

function runKey(runId) { return `baton.run.${runId}` }

// Read an SSE response: id/data pairs, comments (": end" = the log closed).
async function consume(runId, response, signal) {
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw Object.assign(new Error(body.error ?? `HTTP ${response.status}`), { status: response.status, body });
  }
  const saved = store.get(runKey(runId), { chunks: [], prompt: '' });
  const seen = new Set(saved.chunks.map(([o]) => o));
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buf = '', id = null, data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return false;
    buf += decoder.decode(value, { stream: true });
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl).replace(/\r$/, '');
      buf = buf.slice(nl + 1);
      if (line === '') {
        if (data.length && id !== null && !seen.has(id)) {
          const chunk = JSON.parse(data.join('\n'));
          seen.add(id);
          saved.chunks.push([id, chunk]);
          store.set(runKey(runId), saved);
          render(id, chunk);
        }
        id = null; data = [];
      } else if (line.startsWith(':')) {
        if (line.slice(1).trim() === 'end') return true;
      } else if (line.startsWith('id:')) {
        id = line.slice(3).trimStart();
      } else if (line.startsWith('data:')) {
        data.push(line.slice(5).replace(/^ /, ''));
      }
    }
    if (signal.aborted) return false;
  }
}

function lastOffset(runId) {
  const saved = store.get(runKey(runId), { chunks: [] });
  return saved.chunks.length ? saved.chunks[saved.chunks.length - 1][0] : '-1';
}

// Follow a run until its log closes, reconnecting after the last offset on drops.
async function follow(runId, firstRequest) {
  const controller = new AbortController();
  current = { runId, controller };
  $('stop').disabled = false;
  $('run-id').textContent = runId;
  setStatus('streaming');
  let request = firstRequest;
  try {
    for (let attempt = 0; attempt < 50 && !controller.signal.aborted; attempt++) {
      try {
        const resp = await (request ? request(controller.signal) : fetch(
          `/api/chat?runId=${encodeURIComponent(runId)}&offset=${encodeURIComponent(lastOffset(runId))}`,
          { headers: apiHeaders({ Accept: 'text/event-stream' }), signal: controller.signal }));
        request = null;
        if (await consume(runId, resp, controller.signal)) {
          setStatus('idle', 'done');
          return;
        }
      } catch (err) {
        if (err.status) { setStatus('error', err.message); return; }
        if (controller.signal.aborted) return;
      }
      await new Promise((r) => setTimeout(r, 500));
    }
  } finally {
    if (current && current.runId === runId) {
      current = null;
      $('stop').disabled = true;
    }
  }
}

async function send() {
  const prompt = $('prompt').value;
  const thread = threadId();
  const runId = `run-${crypto.randomUUID()}`;
  const agent = JSON.parse($('agent').value || 'null');
  store.set(runKey(runId), { chunks: [], prompt });
  renderUser(prompt);
  $('prompt').value = '';
  const body = {
    threadId: thread, runId,
    messages: [{ id: `${runId}-user`, role: 'user', content: prompt }],
    ...(agent ? { agent } : {}),
  };
  await follow(runId, (signal) => fetch('/api/chat', {
    method: 'POST', signal,
    headers: apiHeaders({ 'Content-Type': 'application/json', 'X-Run-Id': runId, Accept: 'text/event-stream' }),
    body: JSON.stringify(body),
  }));
}

async function stop() {
  if (!current) return;
  $('stop').disabled = true;
  setStatus('streaming', 'stopping…');
  const r = await fetch('/api/chat/cancel', {
    method: 'POST', headers: apiHeaders({ 'Content-Type': 'application/json' }),
    body: JSON.stringify({ runId: current.runId }),
  });
  if (r.status !== 202) setStatus('error', `cancel failed: HTTP ${r.status}`);
  // The stream ends by itself: run.cancelled, RUN_ERROR cancelled, then the log closes.
}

// After a reload: rejoin the thread's live run without rendering anything twice.
async function rejoin() {
  const thread = $('thread').value.trim();
  if (!thread) return;
  const r = await fetch(`/api/chat/active?threadId=${encodeURIComponent(thread)}`, { headers: apiHeaders() });
  if (!r.ok) return;
  const { runId } = await r.json();
  if (!runId) return;
  const saved = store.get(runKey(runId), { chunks: [], prompt: '' });
  if (saved.prompt) renderUser(saved.prompt);
  for (const [offset, chunk] of saved.chunks) render(offset, chunk);
  await follow(runId, null);
}

async function loadAgents() {
  const r = await fetch('/api/agents', { headers: apiHeaders() });
  if (!r.ok) return;
  const { agents, default: dflt } = await r.json();
  const sel = $('agent');
  sel.replaceChildren();
  for (const a of agents) {
    const spec = a.kind === 'replay' ? { kind: 'replay', journal: a.journal, speed: 1 } : { kind: a.kind };
    const opt = el('option', null, a.name);
    opt.value = JSON.stringify(spec);
    if (a.kind === dflt && !sel.value) opt.selected = true;
    sel.append(opt);
  }
}

$('api-key').value = localStorage.getItem('baton.apiKey') ?? '';
$('api-key').addEventListener('change', () => { localStorage.setItem('baton.apiKey', $('api-key').value); loadAgents(); });
$('thread').value = localStorage.getItem('baton.thread') ?? '';
$('new-thread').addEventListener('click', () => { $('thread').value = ''; threadId(); $('transcript').replaceChildren(); });
$('send').addEventListener('click', () => { send(); });
$('stop').addEventListener('click', () => { stop(); });
window.__batonReady = loadAgents();
window.__batonReady.then(rejoin);
