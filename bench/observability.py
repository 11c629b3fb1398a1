"""What observability costs: the log-append and gateway fan-out benches with JSON logs and
OpenTelemetry tracing on, side by side with both off, in one run.

- **log append** (bench/log.py's ``baton_append``): a process like a sandbox host appends
  chunks with the real log writer, one run (3,000 chunks) and 50 runs at once (100 each).
  "on": ``BATON_LOG_FORMAT=json`` with the run's log fields bound, every run's appends under
  its ``run.drive`` span (plus its ``run.claim`` span and two log lines per run, as a host
  writes them), the host's Prometheus write metrics observing every append, spans exported over OTLP/gRPC to a receiver in the parent process. "off":
  text logs, no tracer provider, no metrics observer. Each measurement is a fresh subprocess
  (``python -m bench.observability --append on|off``): a process has one tracer provider.
- **gateway fan-out** (bench/gateway.py's scenario): a ``python -m gateway`` subprocess with
  JSON logs and an OTLP endpoint vs one without, against the same coordinator and NATS;
  one run × 500 SSE readers (burst throughput, paced p99) and 100 runs × 1 reader.

The rounds alternate which side goes first (off/on, then on/off: 6 rounds of appends, 4 of
fan-out) and the medians are compared, because the shared machine's load drifts. The
gateway's Prometheus metrics are on in both fan-out columns: the gateway has no switch for
them, so their cost is inside both figures and not measured apart. Target: the CPU each side spends per chunk (the append
process's, the gateway's) within 5 %; delivered chunks/s and p99 latency are reported next
to it, but on a shared 2-core machine they swing by tens of percent between two rounds of
the same side.
Writes ``bench/results/observability.json``.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench._cpu import cpu_seconds

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "observability.json"
REPO = pathlib.Path(__file__).resolve().parents[1]
APPEND_ROUNDS = 6
FANOUT_ROUNDS = 4
FANOUT_READERS = 500
FANOUT_RUNS = 100
TARGET = 0.05


# --- the append side, one subprocess per measurement --------------------------------------------


async def _append_child(mode: str, nats_url: str, tag: str, log_file: str) -> dict[str, float]:
    import nats

    from baton import telemetry
    from baton.log import DeliveryLog, LogConfig
    from bench.log import MANY_RUN_CHUNKS, MANY_RUNS, ONE_RUN_CHUNKS, payload

    on = mode == "on"
    with open(log_file, "a") as stream:  # noqa: ASYNC230 - setup of a bench child, before anything is timed
        telemetry.configure_logging("sandbox_host", level="INFO", fmt="json" if on else "text",
                                    static={"host": "bench"}, stream=stream)
        provider = telemetry.configure_tracing("sandbox-host") if on else None
        log = logging.getLogger("baton.sandbox_host.driver")
        nc = await nats.connect(nats_url)
        cfg = LogConfig(stream="BENCH_OBS", subject_prefix="bench.obs", bucket="bench-obs-threads")
        dlog = DeliveryLog(nc, cfg)
        if on:  # a host's write metrics (append latency, fences), as sandbox_host wires them
            from sandbox_host.metrics import HostMetrics

            dlog.observer = HostMetrics()
        await dlog.provision()

        async def one(run_id: str, chunks: int) -> None:
            # What a host does per run around its appends: the claim span, the drive span
            # made current with the run's fields bound, a log line at each end.
            telemetry.run_span("run.claim", "", {"baton.run_id": run_id}).end()
            span = telemetry.run_span("run.drive", "", {"baton.run_id": run_id, "baton.epoch": 1})
            with telemetry.log_fields(run_id=run_id, thread_id=f"t-{run_id}", epoch=1), telemetry.activate(span):
                log.info("run %s started", run_id)
                w = dlog.writer(run_id, 1)
                await w.fence()
                batch = [payload(i) for i in range(chunks)]
                for i in range(0, chunks, 50):  # the driver appends what one journal read gave
                    await w.append(batch[i:i + 50])
                log.info("run %s: driver ended at epoch 1", run_id)
            span.end()

        def flush() -> None:
            # The export is part of the cost: the spans leave the process inside the timing.
            if provider is not None:
                provider.force_flush()

        await one(f"{tag}-warm", 200)
        flush()
        t0, c0 = time.perf_counter(), time.process_time()
        await one(f"{tag}-one", ONE_RUN_CHUNKS)
        flush()
        t1, c1 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(f"{tag}-many-{r}", MANY_RUN_CHUNKS) for r in range(MANY_RUNS)))
        flush()
        t2, c2 = time.perf_counter(), time.process_time()
        await nc.close()
        if provider is not None:
            provider.shutdown()
    n_many = MANY_RUNS * MANY_RUN_CHUNKS
    # CPU seconds (every thread of the process, the exporter's included) per chunk: the
    # figure the machine's load changes least.
    return {"append_1_run_chunks_per_s": ONE_RUN_CHUNKS / (t1 - t0),
            "append_50_runs_chunks_per_s": n_many / (t2 - t1),
            "append_1_run_cpu_us_per_chunk": 1e6 * (c1 - c0) / ONE_RUN_CHUNKS,
            "append_50_runs_cpu_us_per_chunk": 1e6 * (c2 - c1) / n_many}


def _append_once(mode: str, nats_url: str, endpoint: str, tag: str, tmp: pathlib.Path) -> dict[str, float]:
    from baton_tools.testing.servers import env_without_proxy

    env = env_without_proxy()
    env["PYTHONPATH"] = str(REPO)
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    if mode == "on":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    out = subprocess.run([sys.executable, "-m", "bench.observability", "--append", mode, nats_url, tag,
                          str(tmp / f"append-{mode}.log")], env=env, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"append child ({mode}) failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# --- the fan-out side ----------------------------------------------------------------------------


async def _fanout(mode: str, coord: Any, nats_url: str, endpoint: str, tmp: pathlib.Path, rnd: int,
                  http: Any, dlog: Any) -> dict[str, Any]:
    from bench.gateway import GatewayTarget, scenario
    from baton_tools.testing.cluster import start_gateway

    # Every reader comes from this one address: no per-client connection cap.
    settings: dict[str, Any] = {"BATON_LOG_FORMAT": "json" if mode == "on" else "text",
                                "BATON_HTTP_CONNECTIONS_PER_CLIENT": "0"}
    saved = os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    if mode == "on":
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint  # the launcher copies this environment
    try:
        gw = await start_gateway(coord.address, nats_url, log_dir=tmp, log_level="INFO",
                                 runs_stream="BENCH_OBS", subject_prefix="bench.obs",
                                 threads_bucket="bench-obs-threads", **settings)
    finally:
        os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        if saved is not None:
            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = saved
    try:
        target = GatewayTarget(gw, dlog, http)
        target.name = f"gateway-{mode}"
        assert gw.pid is not None
        c0 = cpu_seconds(gw.pid)
        one = await scenario(target, [f"fan-{mode}-{rnd}-one"], FANOUT_READERS, paced=True)
        c1 = cpu_seconds(gw.pid)
        many = await scenario(target, [f"fan-{mode}-{rnd}-many-{i}" for i in range(FANOUT_RUNS)], 1, paced=False)
        c2 = cpu_seconds(gw.pid)
    finally:
        await gw.stop()
    from bench.gateway import BURST_CHUNKS, MANY_RUNS_CHUNKS, PACED_CHUNKS

    one_chunks = (BURST_CHUNKS + PACED_CHUNKS) * FANOUT_READERS
    many_chunks = MANY_RUNS_CHUNKS * FANOUT_RUNS
    # The gateway's CPU per delivered chunk (readers connecting and leaving included).
    return {"one_run_chunks_per_s": one["delivered_chunks_per_s"], "one_run_paced_p99_ms": one["latency_p99_ms"],
            "one_run_cpu_us_per_chunk": 1e6 * (c1 - c0) / one_chunks,
            "many_runs_chunks_per_s": many["delivered_chunks_per_s"], "many_runs_burst_p99_ms": many["burst_p99_ms"],
            "many_runs_cpu_us_per_chunk": 1e6 * (c2 - c1) / many_chunks}


def _order(rnd: int) -> tuple[str, str]:
    """Which side goes first in round ``rnd``: alternating, so neither always runs on a
    machine the other just warmed (or loaded)."""
    return ("off", "on") if rnd % 2 == 0 else ("on", "off")


def _median(rounds: list[dict[str, Any]]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in rounds), 2) for k in rounds[0]}


def _costs(off: dict[str, float], on: dict[str, float]) -> dict[str, float]:
    """Relative cost of "on" per figure: throughput lost, or latency added (fractions)."""
    out = {}
    for k, v_off in off.items():
        v_on = on[k]
        if k.endswith(("_ms", "_per_chunk")):
            out[k] = round((v_on - v_off) / v_off, 3) if v_off else 0.0
        else:
            out[k] = round((v_off - v_on) / v_off, 3) if v_off else 0.0
    return out


async def main() -> dict[str, Any]:
    import httpx
    import nats as nats_py

    from baton.log import DeliveryLog, LogConfig
    from baton_tools.testing.cluster import start_coordinator
    from baton_tools.testing.otlp import OtlpReceiver
    from baton_tools.testing.servers import EtcdServer, NatsServer

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="baton-bench-obs-"))
    etcd, nats = EtcdServer(tmp / "etcd"), NatsServer(tmp / "nats")
    etcd.start()
    nats.start()
    appends: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    fanouts: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    coord = None
    try:
        async with OtlpReceiver() as otlp:
            for rnd in range(APPEND_ROUNDS):
                for mode in _order(rnd):
                    got = await asyncio.to_thread(_append_once, mode, nats.url, otlp.endpoint, f"a{rnd}{mode}", tmp)
                    print(f"  append {mode} round {rnd}: {got}", flush=True)
                    appends[mode].append(got)
            append_spans = len(otlp.spans)
            coord = await start_coordinator(etcd.endpoint, "/bench-obs/", log_dir=tmp)
            cfg = LogConfig(stream="BENCH_OBS", subject_prefix="bench.obs", bucket="bench-obs-threads")
            async with DeliveryLog(await nats_py.connect(servers=[nats.url]), cfg, owns_connection=True) as dlog, \
                    httpx.AsyncClient(trust_env=False, timeout=30, limits=httpx.Limits(max_connections=400)) as http:
                for rnd in range(FANOUT_ROUNDS):
                    for mode in _order(rnd):
                        got = await _fanout(mode, coord, nats.url, otlp.endpoint, tmp, rnd, http, dlog)
                        print(f"  fan-out {mode} round {rnd}: {got}", flush=True)
                        fanouts[mode].append(got)
    finally:
        if coord is not None:
            await coord.stop()
        nats.stop()
        etcd.stop()

    append = {m: _median(r) for m, r in appends.items()}
    fanout = {m: _median(r) for m, r in fanouts.items()}
    costs = {**_costs(append["off"], append["on"]), **_costs(fanout["off"], fanout["on"])}
    # The target is on CPU per chunk: throughput and tail latency are shown too, but on a
    # shared machine they swing by tens of percent between two rounds of the same side.
    cpu_costs = {k: v for k, v in costs.items() if "cpu" in k}
    out = {
        "bench": "observability",
        "machine": {"cpus": os.cpu_count()},
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "on": ("BATON_LOG_FORMAT=json + OTLP tracing (spans to an in-process receiver) + the host's write "
               "metrics on appends; off: text logs, no tracing, no append metrics; the gateway's "
               "metrics are on in both fan-out columns"),
        "append": append, "fanout": fanout, "rounds": {"append": appends, "fanout": fanouts},
        "spans_received_from_appends": append_spans,
        "cost": costs,
        "target_le_5pct_cpu_per_chunk": all(v <= TARGET for v in cpu_costs.values()),
    }
    rows = [("figure", "off", "on", "cost")]
    for side in (append, fanout):
        for k in side["off"]:
            rows.append((k, str(side["off"][k]), str(side["on"][k]), f"{100 * costs[k]:+.1f}%"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    print("target (CPU per chunk costs <= 5%):", out["target_le_5pct_cpu_per_chunk"])
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--append":
        print(json.dumps(asyncio.run(_append_child(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]))))
    else:
        asyncio.run(main())
