// A Node.js client of baton's gRPC run API (baton.v1.Runs), reading the .proto files at
// run time (no generated code). Copy it: it needs @grpc/grpc-js, @grpc/proto-loader and
// protobufjs (for the google.rpc.ErrorInfo of errors).
//
// What it does, as a user's client would:
//   1. StartRun: stream a run; after a few chunks the stream breaks (we cancel it)...
//   2. ...and JoinRun after the last offset we hold gets exactly the rest, to the end.
//   3. GetTranscript: the thread's saved messages.
//   4. A second run: CancelRun with wait, then its log to the end ("aborted").
//
// Usage: node runs_client.mjs <host:port> <thread_id> <run_id> <journal> [<thread2> <run2>]
// BATON_API_KEY: the bearer key when the gateway has BATON_API_KEYS. BATON_REPLAY_DELAY:
// seconds between the replay journal's lines (default 0.05). BATON_PROTOS: the
// protos/ directory (default: ../../protos from this file).
// Prints one JSON object on stdout ({"ok": true, ...}); exits non-zero on failure.
import path from "node:path";
import { fileURLToPath } from "node:url";
import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";
import protobuf from "protobufjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const protoRoot = process.env.BATON_PROTOS || path.resolve(here, "..", "..", "protos");
const [address, threadId, runId, journal, thread2, run2] = process.argv.slice(2);
if (!address || !threadId || !runId || !journal) {
  console.error("usage: node runs_client.mjs <host:port> <thread_id> <run_id> <journal> [<thread2> <run2>]");
  process.exit(2);
}

const def = protoLoader.loadSync("baton/v1/runs_service.proto", {
  includeDirs: [protoRoot], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
});
const { Runs } = grpc.loadPackageDefinition(def).baton.v1;
const client = new Runs(address, grpc.credentials.createInsecure());
const md = new grpc.Metadata();
if (process.env.BATON_API_KEY) md.set("authorization", `Bearer ${process.env.BATON_API_KEY}`);

// google.rpc.Status / ErrorInfo: errors carry their reason (the same as the HTTP API's)
// in the grpc-status-details-bin trailer.
const rpcTypes = protobuf.Root.fromJSON({
  nested: {
    Any: { fields: { type_url: { type: "string", id: 1 }, value: { type: "bytes", id: 2 } } },
    Status: { fields: { code: { type: "int32", id: 1 }, message: { type: "string", id: 2 },
                        details: { rule: "repeated", type: "Any", id: 3 } } },
    ErrorInfo: { fields: { reason: { type: "string", id: 1 }, domain: { type: "string", id: 2 },
                           metadata: { keyType: "string", type: "string", id: 3 } } },
  },
});

function errorInfo(err) {
  const raw = err.metadata?.get("grpc-status-details-bin")?.[0];
  if (!raw) return null;
  for (const d of rpcTypes.lookupType("Status").decode(raw).details) {
    if (d.type_url.endsWith("google.rpc.ErrorInfo")) {
      const info = rpcTypes.lookupType("ErrorInfo").decode(d.value);
      return { reason: info.reason, domain: info.domain, metadata: { ...info.metadata } };
    }
  }
  return null;
}

const unary = (method, req) => new Promise((resolve, reject) =>
  client[method](req, md, (err, resp) => (err ? reject(err) : resolve(resp))));

// Read a stream into `chunks` ([offset, json] pairs); stop after `stopAfter` chunks if set.
// Resolves {status} when the log closed, {broken: true} when we stopped early.
async function read(call, chunks, stopAfter) {
  try {
    for await (const ev of call) {
      for (const c of ev.chunks) {
        chunks.push([c.offset, c.json.toString("utf8")]);
        if (stopAfter && chunks.length >= stopAfter) {
          call.cancel(); // the stream breaks here; we resume from the last offset below
          return { broken: true };
        }
      }
      if (ev.gap) throw new Error(`offset expired; earliest is ${ev.gap.earliest_offset}`);
      if (ev.end) return { status: ev.end.status };
    }
  } catch (err) {
    if (err.code === grpc.status.CANCELLED) return { broken: true };
    throw err;
  }
  return { broken: true }; // ended without `end`: the connection broke; join again
}

// Stream a run to its end, resuming after the last offset whenever the stream breaks.
async function follow(runIdToJoin, chunks) {
  for (let attempt = 0; attempt < 20; attempt++) {
    const last = chunks.length ? chunks[chunks.length - 1][0] : null;
    const req = last ? { run_id: runIdToJoin, after_offset: last } : { run_id: runIdToJoin, from_start: true };
    const r = await read(client.JoinRun(req, md), chunks);
    if (r.status !== undefined) return r.status;
    await new Promise((ok) => setTimeout(ok, 100 * (attempt + 1)));
  }
  throw new Error("the stream kept breaking");
}

const messages = JSON.stringify([{ id: "u1", role: "user", content: "go" }]);
const agent = (speedDelay) => ({ kind: "replay", options_json: JSON.stringify({ journal, speed: 1, delay: speedDelay }) });

try {
  // 1 + 2: start, break after 3 chunks, resume after the last offset held.
  const chunks = [];
  const delay = Number(process.env.BATON_REPLAY_DELAY || "0.05"); // seconds between the replay's lines
  const first = await read(client.StartRun({ thread_id: threadId, run_id: runId, messages_json: messages,
    agent: agent(delay) }, md), chunks, 3);
  const resumedAt = chunks.length;
  const status = first.status ?? (await follow(runId, chunks));
  // 3: the transcript.
  const transcript = await unary("GetTranscript", { thread_id: threadId });
  const result = { ok: true, chunks, status, resumedAt, transcript: JSON.parse(transcript.messages_json) };
  // 4: cancel a second run with wait.
  if (thread2 && run2) {
    const c2 = [];
    await read(client.StartRun({ thread_id: thread2, run_id: run2, messages_json: messages, agent: agent(0.3) }, md),
      c2, 2);
    const cancelled = await unary("CancelRun", { run_id: run2, wait: true, timeout_seconds: 60 });
    result.cancelStatus = cancelled.run.status;
    result.cancelLogStatus = await follow(run2, c2);
    result.cancelChunks = c2;
  }
  // A bad request: the error carries a status code (and a google.rpc.ErrorInfo detail).
  try {
    await unary("GetRun", { run_id: "no-such-run-" + runId });
  } catch (err) {
    result.unknownCode = err.code;
    result.unknownInfo = errorInfo(err); // {reason: "UNKNOWN_RUN", domain: "baton.dev", metadata: {run_id}}
  }
  console.log(JSON.stringify(result));
  client.close();
} catch (err) {
  console.log(JSON.stringify({ ok: false, error: String(err), code: err.code, details: err.details }));
  client.close();
  process.exit(1);
}
