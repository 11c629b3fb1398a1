// Starts @durable-streams/server (the protocol's Node reference server) on 127.0.0.1 and
// prints its URL on stdout; the baseline bench/durable_streams.py compares baton against.
// Usage: node ds_reference_server.mjs PORT [DATA_DIR]
// Without DATA_DIR the streams live in process memory; with it, in the server's file-backed
// store (LMDB metadata + an append-only segment file per stream, fdatasync'd before each
// append is answered). Runs until SIGTERM.
import { DurableStreamTestServer } from "@durable-streams/server"

const port = Number(process.argv[2] ?? 0)
const dataDir = process.argv[3]
const server = new DurableStreamTestServer({ port, host: "127.0.0.1", ...(dataDir ? { dataDir } : {}) })
const url = await server.start()
console.log(url)
const stop = async () => {
  await server.stop()
  process.exit(0)
}
process.on("SIGTERM", stop)
process.on("SIGINT", stop)
