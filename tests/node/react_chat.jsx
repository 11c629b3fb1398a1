// A minimal React chat app as a TanStack AI user writes it: `useChat` from
// @tanstack/ai-react with server persistence (`persistence: true`) and nothing but the
// gateway's URL as configuration. react_chat.mjs bundles it with esbuild and serves it on
// the gateway's origin.
//
// URL: ?thread=<threadId>&adapter=sse|xhr&journal=<replay journal>&delay=<s between messages>
// Exposes window.__renders (one {loading, runId, view} per React commit, the view being
// what the page shows) and window.__tanstack (the adapters, for direct use by the test).
import { useEffect, useState } from 'react'
import { createRoot } from 'react-dom/client'
import { fetchServerSentEvents, useChat, xhrHttpStream } from '@tanstack/ai-react'

const q = new URLSearchParams(location.search)
const agent = { kind: 'replay', journal: q.get('journal'), speed: 1, delay: Number(q.get('delay') ?? 0) }
// The README's adapter table: the URL and nothing else (the body only picks the agent).
const connection = q.get('adapter') === 'xhr'
  ? xhrHttpStream('/api/chat?format=ndjson', { body: { agent } })
  : fetchServerSentEvents('/api/chat', { body: { agent } })

window.__tanstack = { xhrHttpStream, fetchServerSentEvents }
window.__renders = []

const shown = (p) => p.type === 'text' || p.type === 'thinking'

function Chat () {
  const { messages, sendMessage, isLoading, runId, error } = useChat({
    connection, threadId: q.get('thread'), persistence: true
  })
  const [prompt, setPrompt] = useState('')
  useEffect(() => {
    window.__renders.push({
      loading: isLoading,
      runId,
      view: messages.map((m) => ({ role: m.role, parts: m.parts.filter(shown).map((p) => [p.type, p.content]) }))
    })
  })
  const submit = (e) => {
    e.preventDefault()
    sendMessage(prompt)
    setPrompt('')
  }
  return (
    <main>
      <ol id='messages'>
        {messages.map((m) => (
          <li key={m.id} className={`msg ${m.role}`}>
            {m.parts.filter(shown).map((p, i) => <p key={i} className={p.type}>{p.content}</p>)}
          </li>
        ))}
      </ol>
      <form onSubmit={submit}>
        <input id='prompt' value={prompt} onChange={(e) => setPrompt(e.target.value)} />
        <button id='send' disabled={isLoading}>Send</button>
      </form>
      <p id='state' data-loading={String(isLoading)} data-run-id={runId ?? ''}>{error ? String(error.message) : ''}</p>
    </main>
  )
}

createRoot(document.getElementById('root')).render(<Chat />)
