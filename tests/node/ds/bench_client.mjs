// The load generator of bench/durable_streams.py (undici's fetch: a client much lighter than
// Python's, so the servers, not the client, are measured). Usage: node bench_client.mjs URL
// Prints {"append_1_stream_per_s", "append_16_streams_per_s", "read_latency_ms": {p50, p99}}.
const base = process.argv[2]
const MSG = new Uint8Array(256).fill(120)
const CT = { "content-type": "application/octet-stream" }
// Retry once on a connection the server closed as we reused it (a keep-alive race of
// node's http server, seen with the reference under load); counted in the output.
let retries = 0
let requests = 0 // every request sent, so the bench can divide the server's CPU time by it
async function call(url, init) {
  requests++
  try {
    return await fetch(url, init)
  } catch (err) {
    retries++
    requests++
    return await fetch(url, init)
  }
}
const rnd = () => Math.random().toString(36).slice(2) + Date.now().toString(36)

async function create() {
  const p = `${base}/bench/${rnd()}`
  const r = await call(p, { method: "PUT", headers: CT })
  await r.arrayBuffer()
  return [p, r.headers.get("stream-next-offset")]
}

async function appendRate(streams, perStream) {
  const paths = []
  for (let i = 0; i < streams; i++) paths.push((await create())[0])
  const t0 = performance.now()
  await Promise.all(paths.map(async (p) => {
    for (let i = 0; i < perStream; i++) {
      const r = await call(p, { method: "POST", headers: CT, body: MSG })
      await r.arrayBuffer()
      if (r.status !== 200 && r.status !== 204) throw new Error(`append: ${r.status}`)
    }
  }))
  return (streams * perStream) / ((performance.now() - t0) / 1000)
}

async function readLatency(samples) {
  if (samples === 0) return { p50: 0, p99: 0, samples: 0 } // not measured (LATENCY_SAMPLES=0)
  let [p, offset] = await create()
  const lat = []
  for (let i = 0; i < samples; i++) {
    const reader = (async () => {
      for (;;) {
        const r = await call(`${p}?offset=${offset}&live=long-poll`)
        const body = await r.arrayBuffer()
        if (r.status === 200 && body.byteLength > 0) return [performance.now(), r.headers.get("stream-next-offset")]
      }
    })()
    await new Promise((res) => setTimeout(res, 5)) // let the long-poll reach the server
    const sent = performance.now()
    await (await call(p, { method: "POST", headers: CT, body: MSG })).arrayBuffer()
    const [got, next] = await reader
    offset = next
    lat.push(got - sent)
  }
  lat.sort((a, b) => a - b)
  return { p50: lat[lat.length >> 1], p99: lat[Math.floor(lat.length * 0.99) - 1], samples: lat.length }
}

await appendRate(1, 20) // warm up
const out = {
  append_1_stream_per_s: await appendRate(1, Number(process.env.ONE_STREAM_APPENDS ?? 400)),
  append_16_streams_per_s: await appendRate(16, Number(process.env.MANY_STREAMS_APPENDS ?? 100)),
  read_latency_ms: await readLatency(Number(process.env.LATENCY_SAMPLES ?? 100)),
}
out.client_retries = retries
out.requests = requests
console.log(JSON.stringify(out))
