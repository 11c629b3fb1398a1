// A Node.js client of baton.v1.Coordinator, reading our .proto files (no generated code):
// creates a run, opens a session, claims the run, reads it back, and shows that a refused
// claim carries a google.rpc.ErrorInfo a non-Python client can branch on.
//
// Usage: node coordinator_client.mjs <host:port> <run_id> <thread_id>
// Prints one JSON object on stdout; exits non-zero on an unexpected failure.
import path from "node:path";
import { fileURLToPath } from "node:url";
import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";
import protobuf from "protobufjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const protoRoot = path.resolve(here, "..", "..", "protos");
const [address, runId, threadId] = process.argv.slice(2);
if (!address || !runId || !threadId) {
  console.error("usage: node coordinator_client.mjs <host:port> <run_id> <thread_id>");
  process.exit(2);
}

const def = protoLoader.loadSync("baton/v1/coordinator.proto", {
  includeDirs: [protoRoot], keepCase: true, longs: String, enums: String, defaults: false, oneofs: true,
});
const { Coordinator } = grpc.loadPackageDefinition(def).baton.v1;
const client = new Coordinator(address, grpc.credentials.createInsecure());

// google.rpc.Status / ErrorInfo, enough to read the error details trailer.
const rpcTypes = protobuf.Root.fromJSON({
  nested: {
    Any: { fields: { type_url: { type: "string", id: 1 }, value: { type: "bytes", id: 2 } } },
    Status: { fields: { code: { type: "int32", id: 1 }, message: { type: "string", id: 2 },
                        details: { rule: "repeated", type: "Any", id: 3 } } },
    ErrorInfo: { fields: { reason: { type: "string", id: 1 }, domain: { type: "string", id: 2 },
                           metadata: { keyType: "string", type: "string", id: 3 } } },
  },
});

function call(method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: Date.now() + 5000 }, (err, resp) => (err ? reject(err) : resolve(resp)));
  });
}

function errorInfo(err) {
  const raw = err.metadata?.get("grpc-status-details-bin")?.[0];
  if (!raw) return null;
  const status = rpcTypes.lookupType("Status").decode(raw);
  for (const d of status.details) {
    if (d.type_url.endsWith("google.rpc.ErrorInfo")) {
      const info = rpcTypes.lookupType("ErrorInfo").decode(d.value);
      return { reason: info.reason, domain: info.domain, metadata: { ...info.metadata } };
    }
  }
  return null;
}

try {
  const created = await call("CreateOrResumeRun", { record: { run_id: runId, thread_id: threadId, agent: { kind: "replay" } } });
  const session = await call("OpenSession", { ttl_seconds: 5, owner: "node-client" });
  const claim = await call("ClaimRun", { run_id: runId, session_id: session.session_id, host_id: "node-host" });
  const view = await call("GetRun", { run_id: runId });
  let refused = null;
  try {
    await call("ClaimRun", { run_id: runId, session_id: session.session_id, host_id: "node-host" });
  } catch (err) {
    refused = { code: err.code, info: errorInfo(err) };
  }
  await call("CloseSession", { session_id: session.session_id });
  const after = await call("GetRun", { run_id: runId });
  console.log(JSON.stringify({
    created: created.created,
    status: created.record.status,
    epoch: String(claim.epoch),
    record: { run_id: view.record.run_id, thread_id: view.record.thread_id,
              driver_epoch: String(view.record.driver_epoch), driver_host: view.record.driver_host,
              agent: view.record.agent?.kind },
    claim: view.claim ? { epoch: String(view.claim.epoch), host_id: view.claim.host_id,
                          session_id: String(view.claim.session_id) } : null,
    session_id: String(session.session_id),
    refused,
    claim_after_close: after.claim ?? null,
  }));
  client.close();
} catch (err) {
  console.error(`coordinator call failed: ${err.code} ${err.details ?? err.message}`);
  client.close();
  process.exit(1);
}
