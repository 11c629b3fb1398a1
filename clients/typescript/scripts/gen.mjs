// Generate the typed messages and the grpc-js service client from the repository's protos
// (protos/baton/v1/*.proto) with ts-proto and the system's protoc, into src/gen/ (not in git:
// regenerated on every build, so a field added to a .proto appears here at the next build).
// google/rpc/{status,error_details}.proto (copied from googleapis) decode the error details.
import { execFileSync } from "node:child_process";
import { mkdirSync, readdirSync, rmSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const repoProtos = resolve(here, process.env.BATON_PROTOS ?? "../../protos");
const out = join(here, "src", "gen");
const plugin = join(here, "node_modules", ".bin", process.platform === "win32" ? "protoc-gen-ts_proto.cmd" : "protoc-gen-ts_proto");
const protos = readdirSync(join(repoProtos, "baton", "v1")).filter((f) => f.endsWith(".proto")).sort()
  .map((f) => `baton/v1/${f}`);

rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
execFileSync(process.env.PROTOC ?? "protoc", [
  `--plugin=protoc-gen-ts_proto=${plugin}`,
  `--ts_proto_out=${out}`,
  // grpc-js service clients; plain interfaces + encode/decode per message; 64-bit ints as
  // numbers (epochs and revisions stay far below 2^53).
  "--ts_proto_opt=outputServices=grpc-js,esModuleInterop=true,env=node,forceLong=number",
  `-I${repoProtos}`,
  `-I${join(here, "protos")}`,
  ...protos,
  "google/rpc/status.proto",
  "google/rpc/error_details.proto",
], { stdio: "inherit" });
