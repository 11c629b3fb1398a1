// Starts @durable-streams/server (the protocol's Node reference server, in memory) on
// 127.0.0.1 and prints its URL on stdout; the baseline the conformance suite and
// bench/durable_streams.py compare baton against. Runs until SIGTERM.
import { DurableStreamTestServer } from "@durable-streams/server"

const port = Number(process.argv[2] ?? 0)
const server = new DurableStreamTestServer({ port, host: "127.0.0.1" })
const url = await server.start()
console.log(url)
const stop = async () => {
  await server.stop()
  process.exit(0)
}
process.on("SIGTERM", stop)
process.on("SIGINT", stop)
