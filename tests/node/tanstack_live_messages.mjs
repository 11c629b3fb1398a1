// What the live @tanstack/ai-client (ChatClient, unchanged) builds from a thread's runs, and
// what the same client shows after a `persistence: true` hydration of a given answer.
// Usage: node tanstack_live_messages.mjs <file.json>, the file {"<name>": {"turns": [{"prompt":
// UIMessage, "chunks": [...]}, ...], "hydration"?: {messages, activeRun}}, ...}: each turn is
// a user message sent with `append` and the run's chunks streamed back. Prints {"<name>":
// {"live": [UIMessage...], "hydrated"?: [UIMessage...]}} without `createdAt`.
import { readFileSync } from 'node:fs'
import { ChatClient, stream } from '@tanstack/ai-client'

const plain = (messages) => JSON.parse(JSON.stringify(messages.map(({ createdAt, ...rest }) => rest)))

async function live (turns) {
  let next = 0
  const client = new ChatClient({
    connection: stream(async function * () { for (const c of turns[next++].chunks) yield c }),
  })
  for (const turn of turns) await client.append(turn.prompt)
  return plain(client.getMessages())
}

async function hydrated (answer) {
  const client = new ChatClient({
    connection: stream(async function * () {}, { hydrate: async () => answer }),
    threadId: 'thread-hydrate',
    persistence: true,
  })
  client.attach()
  const deadline = Date.now() + 10000
  while (client.getMessages().length === 0 && answer.messages.length > 0) {
    if (Date.now() > deadline) throw new Error('no hydration')
    await new Promise((resolve) => setTimeout(resolve, 5))
  }
  const out = plain(client.getMessages())
  client.detach?.()
  return out
}

const input = JSON.parse(readFileSync(process.argv[2], 'utf8'))
const result = {}
for (const [name, { turns, hydration }] of Object.entries(input)) {
  result[name] = { live: await live(turns) }
  if (hydration) result[name].hydrated = await hydrated(hydration)
}
process.stdout.write(JSON.stringify(result))
