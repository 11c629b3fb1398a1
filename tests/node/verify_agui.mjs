// Feed chunk sequences through the official AG-UI client's checks:
// the zod EventSchema of @ag-ui/core and verifyEvents() of @ag-ui/client.
// Usage: node verify_agui.mjs <file.json>  where the file is {"<name>": [chunk, ...], ...}.
// Prints {"<name>": {"ok": true} | {"ok": false, "error": "...", "index": n}} on stdout.
import { readFileSync } from "node:fs";
import { verifyEvents } from "@ag-ui/client";
import { EventSchema } from "@ag-ui/core/schemas";
import { from, lastValueFrom, toArray } from "rxjs";

async function verify(chunks) {
  const parsed = [];
  for (let i = 0; i < chunks.length; i++) {
    const r = EventSchema.safeParse(chunks[i]);
    if (!r.success) return { ok: false, index: i, error: `schema: ${r.error.message}` };
    parsed.push(r.data);
  }
  let seen = 0;
  try {
    const out = await lastValueFrom(
      from(parsed).pipe((src) => {
        return verifyEvents(false)(src);
      }, toArray()),
    );
    seen = out.length;
    if (seen !== parsed.length) return { ok: false, index: seen, error: `only ${seen} of ${parsed.length} passed` };
  } catch (e) {
    return { ok: false, error: String(e && e.message ? e.message : e) };
  }
  return { ok: true, count: seen };
}

const input = JSON.parse(readFileSync(process.argv[2], "utf8"));
const result = {};
for (const [name, chunks] of Object.entries(input)) result[name] = await verify(chunks);
process.stdout.write(JSON.stringify(result));
