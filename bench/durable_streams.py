"""Durable Streams: append throughput and read latency of baton's ``/ds`` against the
protocol's reference server (``@durable-streams/server``, in memory), run side by side.

Scenarios, the same HTTP client for both servers (``tests/node/ds/bench_client.mjs``, node's
undici: a lighter client than Python's, so the servers are what is measured):
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
from typing import Any


RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "durable_streams.json"
NODE_DIR = pathlib.Path(__file__).resolve().parent.parent / "tests" / "node"
ONE_STREAM_APPENDS = 400
MANY_STREAMS = 16
MANY_STREAMS_APPENDS = 100  # per stream
LATENCY_SAMPLES = 100
ROUNDS = int(os.environ.get("BENCH_DS_ROUNDS", "3"))


def measure(base: str) -> dict[str, Any]:
    """Run the node load generator (``tests/node/ds/bench_client.mjs``) against ``base``."""
    node = shutil.which("node")
    assert node is not None
    env = {**os.environ, "ONE_STREAM_APPENDS": str(ONE_STREAM_APPENDS),
           "MANY_STREAMS_APPENDS": str(MANY_STREAMS_APPENDS), "LATENCY_SAMPLES": str(LATENCY_SAMPLES)}
    out = subprocess.run([node, "ds/bench_client.mjs", base], cwd=NODE_DIR, env=env, capture_output=True,
                         check=True, timeout=900)
    return json.loads(out.stdout.decode().strip().splitlines()[-1])  # type: ignore[no-any-return]


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
                # Interleaved rounds, each figure the median of its rounds: the machine's load
                # drifts over a run and hits both servers alike.
                rounds: dict[str, list[dict[str, Any]]] = {"baton": [], "reference": []}
                for _ in range(ROUNDS):
                    rounds["baton"].append(await asyncio.to_thread(measure, f"{gw.url}/ds"))
                    rounds["reference"].append(await asyncio.to_thread(measure, ref_url))
                baton, reference = _median(rounds["baton"]), _median(rounds["reference"])
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
    out: dict[str, Any] = {"baton": baton, "reference": reference, "rounds": ROUNDS}
    out["ratios"] = {
        "append_1_stream": baton["append_1_stream_per_s"] / reference["append_1_stream_per_s"],
        "append_16_streams": baton["append_16_streams_per_s"] / reference["append_16_streams_per_s"],
        "read_latency_p50": baton["read_latency_ms"]["p50"] / reference["read_latency_ms"]["p50"],
    }
    out["targets_met"] = {"throughput_ge_reference": out["ratios"]["append_16_streams"] >= 1.0}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"{'scenario':<22}{'baton':>10}{'reference':>11}{'ratio':>7}  (median of {ROUNDS} interleaved rounds)")
    for key, unit in (("append_1_stream", "per_s"), ("append_16_streams", "per_s")):
        b, r = baton[f"{key}_{unit}"], reference[f"{key}_{unit}"]
        print(f"{key + ' /s':<22}{b:>10.0f}{r:>11.0f}{out['ratios'][key]:>7.2f}")
    b, r = baton["read_latency_ms"]["p50"], reference["read_latency_ms"]["p50"]
    print(f"{'read latency p50 ms':<22}{b:>10.2f}{r:>11.2f}{out['ratios']['read_latency_p50']:>7.2f}")
    return out


def _median(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over rounds (``read_latency_ms`` field by field)."""
    out: dict[str, Any] = {}
    for key, value in results[0].items():
        if isinstance(value, dict):
            out[key] = {k: statistics.median(r[key][k] for r in results) for k in value}
        else:
            out[key] = statistics.median(r[key] for r in results)
    return out


if __name__ == "__main__":
    asyncio.run(main())
