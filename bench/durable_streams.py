"""Durable Streams: append throughput and read latency of baton's ``/ds`` against the
protocol's reference server (``@durable-streams/server``, in memory), run side by side.

Scenarios, the same HTTP client (httpx, this process) for both servers:
- ``append_1_stream``: one writer appending 256-byte messages to one stream, back to back;
- ``append_16_streams``: 16 writers, one stream each, concurrently;
- ``read_latency``: a long-poll reader at the tail; the time from sending an append to the
  reader holding its bytes (p50/p99).

baton is the real ``python -m gateway`` (subprocess) with a coordinator, etcd and a
nats-server; every append is stored in JetStream (file storage) before it is answered,
where the reference keeps it in process memory. Target: baton's throughput ≥ the
reference's. Writes ``bench/results/durable_streams.json``.
"""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from typing import Any

import httpx

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "durable_streams.json"
NODE_DIR = pathlib.Path(__file__).resolve().parent.parent / "tests" / "node"
MSG = b"x" * 256
ONE_STREAM_APPENDS = 400
MANY_STREAMS = 16
MANY_STREAMS_APPENDS = 100  # per stream
LATENCY_SAMPLES = 100


async def append_rate(http: httpx.AsyncClient, base: str, streams: int, per_stream: int) -> float:
    """Appends per second with one back-to-back writer per stream."""
    paths = [f"{base}/bench/{uuid.uuid4().hex}" for _ in range(streams)]
    for p in paths:
        (await http.put(p, headers={"content-type": "application/octet-stream"})).raise_for_status()

    async def writer(p: str) -> None:
        for _ in range(per_stream):
            r = await http.post(p, content=MSG, headers={"content-type": "application/octet-stream"})
            assert r.status_code in (200, 204), r.status_code

    t0 = time.perf_counter()
    await asyncio.gather(*(writer(p) for p in paths))
    return streams * per_stream / (time.perf_counter() - t0)


async def read_latency(http: httpx.AsyncClient, base: str, samples: int) -> dict[str, float]:
    """Send-append → long-poll-reader-has-it latency, milliseconds."""
    p = f"{base}/bench/{uuid.uuid4().hex}"
    r = await http.put(p, headers={"content-type": "application/octet-stream"})
    offset = r.headers["stream-next-offset"]
    lat: list[float] = []
    for _ in range(samples):
        sent: list[float] = []

        async def read(at: str) -> tuple[float, str]:
            while True:
                resp = await http.get(p, params={"offset": at, "live": "long-poll"})
                if resp.status_code == 200 and resp.content:
                    return time.perf_counter(), resp.headers["stream-next-offset"]

        reader = asyncio.create_task(read(offset))
        await asyncio.sleep(0.005)  # let the long-poll reach the server
        sent.append(time.perf_counter())
        await http.post(p, content=MSG, headers={"content-type": "application/octet-stream"})
        got, offset = await reader
        lat.append((got - sent[0]) * 1000)
    lat.sort()
    return {"p50": statistics.median(lat), "p99": lat[int(len(lat) * 0.99) - 1], "samples": len(lat)}


async def measure(base: str) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(trust_env=False, limits=limits, timeout=60) as http:
        await append_rate(http, base, 1, 20)  # warm up
        return {
            "append_1_stream_per_s": await append_rate(http, base, 1, ONE_STREAM_APPENDS),
            "append_16_streams_per_s": await append_rate(http, base, MANY_STREAMS, MANY_STREAMS_APPENDS),
            "read_latency_ms": await read_latency(http, base, LATENCY_SAMPLES),
        }


def start_reference() -> tuple[subprocess.Popen[bytes], str]:
    """The reference server on a free port: (process, URL)."""
    node = shutil.which("node")
    if node is None or not (NODE_DIR / "node_modules" / "@durable-streams" / "server").is_dir():
        raise SystemExit("node and @durable-streams/server are needed (make node-deps)")
    proc = subprocess.Popen([node, "ds_reference_server.mjs", "0"], cwd=NODE_DIR, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    url = proc.stdout.readline().decode().strip()
    return proc, url


async def main() -> dict[str, Any]:
    from baton_tools.testing.cluster import start_coordinator, start_gateway
    from baton_tools.testing.servers import EtcdServer, NatsServer

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="baton-bench-ds-"))
    etcd, nats = EtcdServer(tmp / "etcd"), NatsServer(tmp / "nats")
    etcd.start()
    nats.start()
    ref, ref_url = start_reference()
    try:
        coord = await start_coordinator(etcd.endpoint, f"/bench-ds-{os.getpid()}", log_dir=tmp)
        try:
            gw = await start_gateway(coord.address, nats.url, log_dir=tmp, log_level="WARNING")
            try:
                # Interleave the two servers' runs so both see the same machine load.
                baton = await measure(f"{gw.url}/ds")
                reference = await measure(ref_url)
            finally:
                await gw.stop()
        finally:
            await coord.stop()
    finally:
        ref.terminate()
        ref.wait(10)
        nats.stop()
        etcd.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    out: dict[str, Any] = {"baton": baton, "reference": reference}
    out["ratios"] = {
        "append_1_stream": baton["append_1_stream_per_s"] / reference["append_1_stream_per_s"],
        "append_16_streams": baton["append_16_streams_per_s"] / reference["append_16_streams_per_s"],
        "read_latency_p50": baton["read_latency_ms"]["p50"] / reference["read_latency_ms"]["p50"],
    }
    out["targets_met"] = {"throughput_ge_reference": out["ratios"]["append_16_streams"] >= 1.0}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    asyncio.run(main())
