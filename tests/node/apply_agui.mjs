// Assemble messages from chunk sequences the way the official AG-UI client does:
// defaultApplyEvents of @ag-ui/client (what HttpAgent runs on every event it receives).
// Usage: node apply_agui.mjs <file.json>  where the file is {"<name>": [chunk, ...], ...}.
// Prints {"<name>": [message, ...]} (the messages after the last chunk) on stdout.
import { readFileSync } from "node:fs";
import { defaultApplyEvents } from "@ag-ui/client";
import { from, lastValueFrom, toArray } from "rxjs";

async function apply(chunks) {
  const input = { threadId: "thread", runId: "run", messages: [], state: {}, tools: [], context: [] };
  const agent = { messages: [], state: {}, pendingInterrupts: [] };
  const mutations = await lastValueFrom(defaultApplyEvents(input, from(chunks), agent, []).pipe(toArray()));
  let messages = [];
  for (const m of mutations) if (m.messages !== undefined) messages = m.messages;
  return messages;
}

const input = JSON.parse(readFileSync(process.argv[2], "utf8"));
const result = {};
for (const [name, chunks] of Object.entries(input)) result[name] = await apply(chunks);
process.stdout.write(JSON.stringify(result));
