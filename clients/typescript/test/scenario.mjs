// The TypeScript client against a real cluster (tests/grpc/test_ts_client.py runs it and checks
// its JSON line): start a run through a TCP proxy that cuts every connection after 3 chunks
// (the stream must resume on its own), while the test SIGKILLs the driving host; join from an
// offset, from the start and for new chunks only; read the run, the transcript, the listings;
// cancel a second run with wait; errors with their code and reason.
//
// usage: node scenario.mjs GATEWAY_GRPC_ADDR THREAD RUN JOURNAL THREAD2 RUN2
import net from "node:net";

import { BatonError, BatonRunsClient, RunStatus } from "../dist/index.js";

const [target, threadId, runId, journal, thread2, run2] = process.argv.slice(2);
const delay = Number(process.env.BATON_REPLAY_DELAY || "0.05");
const messages = [{ id: "u1", role: "user", content: "go" }];

// A TCP proxy in front of the gateway: cut() destroys every connection open through it.
const sockets = new Set();
const proxy = net.createServer((down) => {
  const [host, port] = [target.slice(0, target.lastIndexOf(":")), Number(target.slice(target.lastIndexOf(":") + 1))];
  const up = net.connect(port, host);
  for (const s of [down, up]) {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
    s.on("error", () => {});
  }
  down.pipe(up).pipe(down);
});
await new Promise((ok) => proxy.listen(0, "127.0.0.1", ok));
const cut = () => { for (const s of sockets) s.destroy(); };

const collect = async (stream, limit) => {
  const out = [];
  for await (const c of stream) {
    out.push([c.offset, Buffer.from(c.json).toString("utf8")]);
    if (limit && out.length >= limit) break;
  }
  return out;
};
const errorOf = async (fn) => {
  try {
    await fn();
    return null;
  } catch (err) {
    if (!(err instanceof BatonError)) throw err;
    return { code: err.codeName, reason: err.reason, domain: err.domain, metadata: err.metadata };
  }
};

const viaProxy = new BatonRunsClient(`127.0.0.1:${proxy.address().port}`);
const runs = new BatonRunsClient(target);
const result = { ok: false };
try {
  // 1: start and stream to the end; the proxy cuts the connection after the 3rd chunk.
  const stream = viaProxy.startRun({ runId, threadId, messages, agent: { kind: "replay", journal, speed: 1, delay } });
  const chunks = [];
  for await (const c of stream) {
    chunks.push([c.offset, Buffer.from(c.json).toString("utf8")]);
    if (chunks.length === 3) cut();
  }
  Object.assign(result, { chunks, status: stream.status, resumes: stream.resumes });

  // 2: joins: after an offset, from the start, only new chunks (the log is closed: none).
  const after = await collect(runs.joinRun(runId, { afterOffset: chunks[4][0] }));
  result.joinAfterOk = JSON.stringify(after) === JSON.stringify(chunks.slice(5));
  result.joinFromStartOk = JSON.stringify(await collect(runs.joinRun(runId))) === JSON.stringify(chunks);
  const onlyNew = runs.joinRun(runId, { onlyNew: true });
  result.onlyNew = { chunks: (await collect(onlyNew)).length, status: onlyNew.status };

  // 3: the run, the thread, the transcript, the listings.
  const info = await runs.getRun(runId);
  result.run = { status: RunStatus[info.status], driverHost: info.driverHost, epoch: info.epoch };
  result.active = await runs.findActiveRun(threadId);
  result.transcript = (await runs.getTranscript(threadId)).messages;
  // The run's messages page by page from its final snapshot, newest first (GetMessages).
  let page = await runs.getMessages(runId, { limit: 2 });
  const paged = [...page.messages];
  result.messagesTotal = page.total;
  result.messagesOffset = page.snapshotOffset;
  while (page.nextCursor) {
    page = await runs.getMessages(runId, { limit: 2, before: page.nextCursor });
    paged.unshift(...page.messages);
  }
  result.messages = paged;
  result.listed = [];
  for await (const r of runs.listRuns({ threadId, pageSize: 1 })) result.listed.push(r.runId);
  result.agents = (await runs.listAgents()).agents.map((a) => a.kind);

  // 4: cancel a second run with wait, then read its log to its end.
  const s2 = runs.startRun({ runId: run2, threadId: thread2, messages,
                             agent: { kind: "replay", journal, speed: 1, delay: 0.3 } });
  const c2 = await collect(s2, 2);
  const kept = await runs.keepRun(run2, 1e9); // above the gateway's maximum: clamped
  result.kept = { granted: kept.grantedSeconds, requested: kept.requestedSeconds,
                  untilOnRun: kept.run.keptUntil === kept.keptUntil };
  const cancelled = await runs.cancelRun({ runId: run2, wait: true, timeoutSeconds: 60 });
  result.cancel = { requested: cancelled.cancelRequested, status: RunStatus[cancelled.run.status] };
  const rest = runs.joinRun(run2, { afterOffset: c2[c2.length - 1][0] });
  await collect(rest);
  result.cancel.logStatus = rest.status;

  // 5: errors, with their code and ErrorInfo reason.
  result.errors = {
    getUnknown: await errorOf(() => runs.getRun(`no-such-${runId}`)),
    joinUnknown: await errorOf(() => collect(runs.joinRun(`no-such-${runId}`))),
    badOffset: await errorOf(() => collect(runs.joinRun(runId, { afterOffset: "not-an-offset" }))),
    badPageToken: await errorOf(async () => { for await (const _ of runs.listRuns({ pageToken: "nope" })) break; }),
    cancelNothing: await errorOf(() => runs.cancelRun({})),
    keepEnded: await errorOf(() => runs.keepRun(runId, 600)),
    keepBad: await errorOf(() => runs.keepRun(runId, -1)),
    messagesBadCursor: await errorOf(() => runs.getMessages(runId, { before: "nope" })),
  };
  result.ok = true;
} catch (err) {
  result.error = String(err?.stack ?? err);
  if (err instanceof BatonError) Object.assign(result, { code: err.codeName, reason: err.reason });
} finally {
  viaProxy.close();
  runs.close();
  proxy.close();
  cut();
}
console.log(JSON.stringify(result));
process.exit(result.ok ? 0 : 1);
