"""Gateway fan-out: delivered chunks/s, append→reader p99 and RSS per idle reader, side by
side with a minimal Starlette SSE endpoint serving the same bytes from memory, in one run.

Scenarios:
- 1 run × 1,000 concurrent SSE readers: burst throughput, paced latency, RSS per idle reader;
- 200 runs × 1 reader each: burst throughput and latency.

Both servers are ``uvicorn`` subprocesses (the real ``python -m gateway`` against a real
coordinator, etcd and nats-server; the minimal one is ``python -m bench._minimal_sse``);
the readers are raw asyncio sockets in this process, so both sides pay the same client
cost. Chunks are appended with the real log writer (gateway) or POSTed to the minimal
endpoint, each carrying its send time. Targets: p99 ≤ 50 ms with 1,000 readers, ≤ 100 KB
RSS per idle reader, throughput ≥ 0.5 × the minimal endpoint's.

``gateway_gzip`` is the same gateway again, a process of its own, whose 1,000 readers ask for
gzip as browsers do (:class:`GzipReader`); ``gzip_vs_plain_one_run`` gives its figures
against the plain readers' (the cost of gateway/_compression.py): the median over
``BENCH_GW_GZIP_ROUNDS`` (5) rounds of the two side by side of each round's ratio, and RSS
per idle reader and after the scenario (``rss_kb_after_rest``) from the first round, each
gateway a fresh process then. The gzip readers also inflate in this process, which the
plain ones do not: their latencies carry that.

A third server, ``gateway_2w``, is the same gateway with ``BATON_GATEWAY_WORKERS=2`` (two
worker processes on one port, in the same cluster); its readers are counted on each
worker's metrics port and its RSS is its workers'. Target: its many-runs throughput
≥ 1.6 × one worker's (``workers_2_vs_1_many_runs``). The many-runs scenario runs
``BENCH_GW_ROUNDS`` (3) interleaved rounds, the servers' order rotated each round; its
figures are the medians. Two workers can only gain with a core to spare: on a machine
whose cores other work keeps busy the ratio says little.

Every burst also reports the cores each process group used through it (``burst_cores``:
the server, the bench process that publishes and reads, nats-server, the machine's busy
share), the server's CPU per delivered chunk, and when its publishing ended against its
last delivery (``burst_publish_s`` / ``burst_s``). The many-runs scenario runs once more
with the log writer's publishes pipelined (``*_pipelined``; bench/_pipelined.py: the same
stored records without a wait per acknowledgement), and each round times the same burst
with nobody reading (``publisher_alone``): the most any gateway could deliver of it here.
The 2-workers target is judged on the pipelined burst; ``publisher_alone_vs_1_worker_pipelined``
is the ceiling the load generator puts on that ratio on this machine.

Writes ``bench/results/gateway.json``.
"""
from __future__ import annotations

import asyncio
import json
import pathlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

from bench._cpu import CpuWindow
from bench._readers import (GzipReader, Reader, chunk, close_readers, open_readers, pct, rss_kb,
                            wait_delivered)

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "gateway.json"
READERS_ONE_RUN = 1000
BURST_CHUNKS = 60
PACED_CHUNKS = 30
PACED_RATE = 15.0  # chunks/s
MANY_RUNS = 200
MANY_RUNS_CHUNKS = 20
MANY_RUNS_ROUNDS = int(os.environ.get("BENCH_GW_ROUNDS", "3"))
#: Rounds of the 1-run scenario for plain and gzip readers side by side (the first is the
#: main one's; the others alternate which goes first): a 60-chunk burst is a fifth of a
#: second, so one round's ratio is mostly noise.
GZIP_ROUNDS = int(os.environ.get("BENCH_GW_GZIP_ROUNDS", "5"))


# --- scenarios, run against either server through a small adapter ----------------------


class Target:
    name = ""
    port = 0
    pid = 0
    reader: type[Reader] = Reader  # how its readers read (GzipReader: they ask for gzip)

    def path(self, run: str) -> str:
        raise NotImplementedError

    async def readers(self) -> int:
        raise NotImplementedError

    async def prepare(self, run: str) -> None:
        return None

    def rss_kb(self) -> int:
        return rss_kb(self.pid)

    def pids(self) -> list[int]:
        """The server's processes (a supervisor and its workers)."""
        return [self.pid, *worker_pids(self.pid)]

    async def publish(self, run: str, chunks: list[dict[str, Any]]) -> None:
        raise NotImplementedError

    async def published(self) -> None:
        """Every publish of a burst is stored (a pipelined publisher's acknowledgements)."""
        return None

    async def done(self) -> None:
        """The scenario is over (its writers may go)."""
        return None


#: Process groups measured through each burst (set by :func:`main`): the bench process
#: itself (the publisher and every reader), nats-server; the server under test is added
#: per target.
CPU_GROUPS: dict[str, Callable[[], list[int]]] = {"bench (publisher + readers)": lambda: [os.getpid()]}


async def scenario(target: Target, runs: list[str], readers_per_run: int, *, paced: bool) -> dict[str, Any]:
    for run in runs:
        await target.prepare(run)
    deadline = time.monotonic() + 60
    while await target.readers() != 0:  # the previous scenario's readers are gone
        if time.monotonic() > deadline:
            raise TimeoutError("readers of the previous scenario did not go away")
        await asyncio.sleep(0.1)
    base = 0
    t_start = time.monotonic()
    rss_before = target.rss_kb()
    paths = [target.path(run) for run in runs for _ in range(readers_per_run)]
    readers = await open_readers(len(paths), target.port, lambda i: paths[i], target.readers, base, target.reader)
    rss_idle = target.rss_kb()
    print(f"  {target.name}: {len(readers)} readers connected in {time.monotonic() - t_start:.1f}s", flush=True)
    out: dict[str, Any] = {"readers": len(readers), "rss_kb_before": rss_before, "rss_kb_idle": rss_idle,
                           # Meaningful with many readers on a fresh process only (the 1-run
                           # scenario runs first); later scenarios see freed memory come back.
                           "rss_kb_per_idle_reader": round((rss_idle - rss_before) / len(readers), 1)
                           if paced else None}
    try:
        # Burst: every run's chunks as fast as the publisher goes → delivered chunks/s.
        n = BURST_CHUNKS if len(runs) == 1 else MANY_RUNS_CHUNKS
        window = CpuWindow({**CPU_GROUPS, "server": target.pids})
        window.start()
        t0 = time.time()
        await asyncio.gather(*(target.publish(run, [chunk(i, run) for i in range(n)]) for run in runs))
        await target.published()
        published = time.time()
        last = await wait_delivered(readers, n)
        out["burst_cores"] = window.stop()
        delivered = n * len(readers)
        # The server's CPU per delivered chunk (µs): its cores over the window, times the window.
        out["server_cpu_us_per_chunk"] = round(out["burst_cores"]["server"] * (time.time() - t0) / delivered * 1e6, 1)
        out["burst_publish_s"] = round(published - t0, 3)
        out["burst_s"] = round(last - t0, 3)
        out["burst_chunks_per_run"] = n
        out["delivered_chunks_per_s"] = round(delivered / max(last - t0, 1e-9))
        out["burst_p99_ms"] = round(pct([x for r in readers for x in r.latencies], 99) * 1000, 1)
        # Paced: a steady producer → append→reader latency.
        if paced:
            for r in readers:
                r.latencies.clear()
            for i in range(PACED_CHUNKS):
                await asyncio.gather(*(target.publish(run, [chunk(n + i, run)]) for run in runs))
                await asyncio.sleep(1 / PACED_RATE)
            await wait_delivered(readers, n + PACED_CHUNKS)
            # What the scenario left behind in the server.
            out["rss_kb_after_rest"] = target.rss_kb()
            lat = [x for r in readers for x in r.latencies]
            out["paced_rate_per_s"] = PACED_RATE
            out["latency_p50_ms"] = round(pct(lat, 50) * 1000, 1)
            out["latency_p99_ms"] = round(pct(lat, 99) * 1000, 1)
    finally:
        await close_readers(readers)
        await target.done()
    print(f"  {target.name}: scenario done in {time.monotonic() - t_start:.1f}s: {out}", flush=True)
    return out


async def publish_alone(target: "GatewayTarget", runs: list[str]) -> dict[str, Any]:
    """The many-runs burst with nobody reading: how fast the publisher (pipelined) and
    nats-server take it in on this machine, the most any gateway could deliver of it."""
    for run in runs:
        await target.prepare(run)
    window = CpuWindow(dict(CPU_GROUPS))
    window.start()
    t0 = time.time()
    try:
        await asyncio.gather(*(target.publish(run, [chunk(i, run) for i in range(MANY_RUNS_CHUNKS)]) for run in runs))
        await target.published()
    finally:
        await target.done()
    took = time.time() - t0
    out = {"stored_chunks_per_s": round(MANY_RUNS_CHUNKS * len(runs) / took), "burst_cores": window.stop(),
           "burst_s": round(took, 3)}
    print(f"  publisher alone: {out}", flush=True)
    return out


class GatewayTarget(Target):
    """The gateway under test, its runs written by the product's log writer.

    Args:
        gzip: its readers ask for gzip (:class:`GzipReader`), as browsers do.
        pipelined: the writers' publishes go out without waiting for each acknowledgement
            (bench/_pipelined.py: the same stored records, byte for byte); a burst then
            comes as fast as nats-server stores it, so the gateway rather than the
            publisher's round trips sets the delivered rate.
    """

    name = "gateway"

    def __init__(self, gw: Any, log: Any, http: Any, name: str = "gateway", metrics: list[str] | None = None,
                 pipelined: bool = False, gzip: bool = False) -> None:
        self.gw, self.log, self.http = gw, log, http
        if gzip:
            self.reader = GzipReader
        self.name = name
        self.port, self.pid = gw.port, gw.pid
        self.writers: dict[str, Any] = {}
        # One worker: its public /metrics. Several: each worker's own metrics port.
        self.metrics = metrics or [f"{gw.url}/metrics"]
        self.pipelined = pipelined
        self._pnc: Any = None

    def path(self, run: str) -> str:
        return f"/api/chat?runId={run}&offset=-1"

    async def readers(self) -> int:
        total = 0
        for url in self.metrics:
            m = re.search(r"^baton_gateway_readers ([0-9.]+)$", (await self.http.get(url)).text, re.M)
            total += int(float(m.group(1))) if m else 0
        return total

    def rss_kb(self) -> int:
        return sum(rss_kb(pid) for pid in worker_pids(self.pid)) or rss_kb(self.pid)

    async def prepare(self, run: str) -> None:
        if not self.pipelined:
            w = self.log.writer(run, 1)
        else:
            from baton.log import LogWriter
            from bench._pipelined import PipelinedNats

            if self._pnc is None:  # the bench alone writes its stream while a scenario runs
                self._pnc = PipelinedNats(self.log.nc, f"{self.log.cfg.subject_prefix}.")
                await self._pnc.__aenter__()
            w = LogWriter(self._pnc, self.log.js, self.log.cfg, run, 1)
        await w.fence()
        self.writers[run] = w

    async def publish(self, run: str, chunks: list[dict[str, Any]]) -> None:
        await self.writers[run].append(chunks)

    async def published(self) -> None:
        if self._pnc is not None:
            await self._pnc.flush()  # raises if a record was refused or stored elsewhere

    async def done(self) -> None:
        self.writers.clear()
        if self._pnc is not None:
            pnc, self._pnc = self._pnc, None
            await pnc.__aexit__(None, None, None)


class MinimalTarget(Target):
    name = "minimal"

    def __init__(self, port: int, pid: int, http: Any) -> None:
        self.port, self.pid, self.http = port, pid, http

    def path(self, run: str) -> str:
        return f"/sse?runId={run}"

    async def readers(self) -> int:
        return int((await self.http.get(f"http://127.0.0.1:{self.port}/readers")).json()["readers"])

    async def publish(self, run: str, chunks: list[dict[str, Any]]) -> None:
        body = b"\n".join(json.dumps(c, separators=(",", ":")).encode() for c in chunks)
        await self.http.post(f"http://127.0.0.1:{self.port}/publish", params={"runId": run}, content=body)


def worker_pids(pid: int) -> list[int]:
    """The live children of ``pid`` (a supervised gateway's workers)."""
    out = []
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[1] == str(pid):
                out.append(int(stat.parent.name))
        except OSError:
            continue
    return out


async def main() -> dict[str, Any]:
    import httpx

    from baton.log import DeliveryLog, LogConfig
    from baton_tools.testing.cluster import start_coordinator, start_gateway
    from baton_tools.testing.servers import EtcdServer, NatsServer, env_without_proxy, free_port, free_ports_in_a_row

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="baton-bench-gw-"))
    etcd, nats = EtcdServer(tmp / "etcd"), NatsServer(tmp / "nats")
    etcd.start()
    nats.start()
    assert nats.proc is not None
    CPU_GROUPS["nats-server"] = lambda: [nats.proc.pid] if nats.proc is not None else []
    cfg = LogConfig(stream="BENCH_GW", subject_prefix="bench.gw", bucket="bench-gw-threads")
    coord = gw = gw2 = gwz = None
    port = free_port()
    env = env_without_proxy()
    # Setup, before anything is timed (the servers above start synchronously as well).
    env["PYTHONPATH"] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: ASYNC240
    minimal = subprocess.Popen(  # noqa: ASYNC220
        [sys.executable, "-m", "bench._minimal_sse", str(port)], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results: dict[str, Any] = {}
    try:
        coord = await start_coordinator(etcd.endpoint, "/bench-gw/", log_dir=tmp)
        # Every reader comes from 127.0.0.1: no per-client connection cap (it would stop
        # the 1,000 readers at BATON_HTTP_CONNECTIONS_PER_CLIENT).
        gw = await start_gateway(coord.address, nats.url, log_dir=tmp, log_level="WARNING",
                                 runs_stream=cfg.stream, subject_prefix=cfg.subject_prefix,
                                 threads_bucket=cfg.bucket, http_connections_per_client=0, start_timeout=120)
        # The same gateway for readers that ask for gzip: a process of its own, so its RSS
        # per idle reader is a fresh process's as the first one's is.
        gwz = await start_gateway(coord.address, nats.url, log_dir=tmp, log_level="WARNING",
                                  runs_stream=cfg.stream, subject_prefix=cfg.subject_prefix,
                                  threads_bucket=cfg.bucket, http_connections_per_client=0, start_timeout=120)
        metrics2 = free_ports_in_a_row(2)
        gw2 = await start_gateway(coord.address, nats.url, log_dir=tmp, log_level="WARNING",
                                  runs_stream=cfg.stream, subject_prefix=cfg.subject_prefix,
                                  threads_bucket=cfg.bucket, gateway_workers=2, http_connections_per_client=0, start_timeout=120,
                                  gateway_metrics_listen=f"127.0.0.1:{metrics2}")
        async with DeliveryLog(await _nats(nats.url), cfg, owns_connection=True) as log, \
                httpx.AsyncClient(trust_env=False, timeout=30,
                                  limits=httpx.Limits(max_connections=400)) as http:
            deadline = time.monotonic() + 20
            while True:
                try:
                    (await http.get(f"http://127.0.0.1:{port}/readers")).raise_for_status()
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.05)
            two = [f"http://127.0.0.1:{metrics2 + i}/metrics" for i in range(2)]
            deadline = time.monotonic() + 60
            while True:  # both workers up (the HTTP port answered as soon as one was)
                try:
                    if [(await http.get(u)).status_code for u in two] == [200, 200]:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError("the 2-worker gateway's workers did not both start")
                await asyncio.sleep(0.1)
            targets = [GatewayTarget(gw, log, http), GatewayTarget(gw2, log, http, "gateway_2w", two),
                       MinimalTarget(port, minimal.pid, http)]
            zipped = GatewayTarget(gwz, log, http, "gateway_gzip", gzip=True)
            for t in [*targets, zipped]:
                one = await scenario(t, [f"bench-one-{t.name}"], READERS_ONE_RUN, paced=True)
                results[t.name] = {"one_run_1000_readers": one}
            pairs = [(results["gateway"]["one_run_1000_readers"], results["gateway_gzip"]["one_run_1000_readers"])]
            for r in range(1, GZIP_ROUNDS):
                pair = {}
                for t in ([targets[0], zipped] if r % 2 else [zipped, targets[0]]):
                    pair[t.name] = await scenario(t, [f"bench-one-{t.name}-r{r}"], READERS_ONE_RUN, paced=True)
                pairs.append((pair["gateway"], pair["gateway_gzip"]))
            results["gzip_rounds"] = {"one_run_1000_readers": pairs}
            # Many runs with the log writer's publishes pipelined as well: the same gateways,
            # a burst the publisher no longer paces (the plain one ends as its last append's
            # acknowledgement comes, so its rate is the publisher's).
            targets += [GatewayTarget(gw, log, http, "gateway_pipelined", pipelined=True),
                        GatewayTarget(gw2, log, http, "gateway_2w_pipelined", two, pipelined=True)]
            # Many runs: interleaved rounds, the order rotated each round, each figure the
            # median (the machine's load drifts over a run and hits every server alike).
            rounds: dict[str, list[dict[str, Any]]] = {t.name: [] for t in targets}
            alone: list[dict[str, Any]] = []
            for r in range(MANY_RUNS_ROUNDS):
                k = r % len(targets)
                for t in targets[k:] + targets[:k]:
                    rounds[t.name].append(await scenario(
                        t, [f"bench-many-{t.name}-r{r}-{i}" for i in range(MANY_RUNS)], 1, paced=False))
                alone.append(await publish_alone(
                    GatewayTarget(gw, log, http, "alone", pipelined=True),
                    [f"bench-many-alone-r{r}-{i}" for i in range(MANY_RUNS)]))
            results["publisher_alone"] = {
                "200_runs": {"rounds": len(alone), "per_round": alone,
                             "stored_chunks_per_s": statistics.median(x["stored_chunks_per_s"] for x in alone)}}
            for t in targets:
                rs = rounds[t.name]
                results.setdefault(t.name, {})["200_runs_1_reader"] = {
                    **rs[-1], "rounds": len(rs),
                    "delivered_chunks_per_s": statistics.median(x["delivered_chunks_per_s"] for x in rs),
                    "burst_p99_ms": statistics.median(x["burst_p99_ms"] for x in rs),
                    "burst_publish_s": statistics.median(x["burst_publish_s"] for x in rs),
                    "burst_s": statistics.median(x["burst_s"] for x in rs),
                    "server_cpu_us_per_chunk": statistics.median(x["server_cpu_us_per_chunk"] for x in rs),
                    "burst_cores": {k: statistics.median(x["burst_cores"][k] for x in rs)
                                    for k in rs[0]["burst_cores"]},
                    "per_round_burst_cores": [x["burst_cores"] for x in rs],
                    "per_round_chunks_per_s": [x["delivered_chunks_per_s"] for x in rs]}
    finally:
        for g in (gw, gw2, gwz):
            if g is not None:
                await g.stop()
        if coord is not None:
            await coord.stop()
        minimal.terminate()
        minimal.wait(10)
        nats.stop()
        etcd.stop()

    g, m = results["gateway"], results["minimal"]
    summary = {
        "throughput_ratio_one_run": round(g["one_run_1000_readers"]["delivered_chunks_per_s"]
                                          / m["one_run_1000_readers"]["delivered_chunks_per_s"], 2),
        "throughput_ratio_many_runs": round(g["200_runs_1_reader"]["delivered_chunks_per_s"]
                                            / m["200_runs_1_reader"]["delivered_chunks_per_s"], 2),
        "p99_ms_1000_readers": g["one_run_1000_readers"]["latency_p99_ms"],
        "rss_kb_per_idle_reader": g["one_run_1000_readers"]["rss_kb_per_idle_reader"],
    }
    gz = results["gateway_gzip"]["one_run_1000_readers"]
    plain = g["one_run_1000_readers"]
    pairs = results["gzip_rounds"]["one_run_1000_readers"]

    def paired(key: str) -> float:
        """The median over the rounds of gzip's figure over plain's in the same round."""
        return round(statistics.median(z[key] / max(p[key], 1e-9) for p, z in pairs), 2)

    # The readers that ask for gzip against those that do not, on two gateways alike; RSS
    # from the first round only (each gateway a fresh process then).
    summary["gzip_vs_plain_one_run"] = {
        "rounds": len(pairs),
        **{k: paired(k) for k in ("delivered_chunks_per_s", "burst_p99_ms", "latency_p50_ms", "latency_p99_ms",
                                  "server_cpu_us_per_chunk")},
        "rss_kb_per_idle_reader": round(gz["rss_kb_per_idle_reader"] / plain["rss_kb_per_idle_reader"], 2),
        "rss_kb_after_rest": round((gz["rss_kb_after_rest"] - gz["rss_kb_before"])
                                   / max(plain["rss_kb_after_rest"] - plain["rss_kb_before"], 1), 2),
    }
    g2 = results["gateway_2w"]
    summary["workers_2_vs_1_one_run"] = round(g2["one_run_1000_readers"]["delivered_chunks_per_s"]
                                              / g["one_run_1000_readers"]["delivered_chunks_per_s"], 2)
    summary["workers_2_vs_1_many_runs"] = round(g2["200_runs_1_reader"]["delivered_chunks_per_s"]
                                                / g["200_runs_1_reader"]["delivered_chunks_per_s"], 2)
    gp, g2p = results["gateway_pipelined"], results["gateway_2w_pipelined"]
    summary["workers_2_vs_1_many_runs_pipelined"] = round(
        g2p["200_runs_1_reader"]["delivered_chunks_per_s"] / gp["200_runs_1_reader"]["delivered_chunks_per_s"], 2)
    # The most a gateway could deliver of the burst: what the publisher stores with nobody
    # reading, against one worker's delivered rate (a second worker cannot pass it).
    summary["publisher_alone_vs_1_worker_pipelined"] = round(
        results["publisher_alone"]["200_runs"]["stored_chunks_per_s"] / gp["200_runs_1_reader"]["delivered_chunks_per_s"], 2)
    summary["targets"] = {
        "p99_le_50ms": summary["p99_ms_1000_readers"] <= 50,
        "rss_le_100kb_per_reader": summary["rss_kb_per_idle_reader"] <= 100,
        "throughput_ge_half_of_minimal": min(summary["throughput_ratio_one_run"],
                                             summary["throughput_ratio_many_runs"]) >= 0.5,
        # Judged where the gateway, not the publisher, sets the rate.
        "workers_2_many_runs_ge_1_6x": summary["workers_2_vs_1_many_runs_pipelined"] >= 1.6,
    }
    out = {"bench": "gateway", "results": results, "summary": summary}
    _print_table(out)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    return out


async def _nats(url: str) -> Any:
    import nats as nats_py

    return await nats_py.connect(servers=[url])


def _print_table(out: dict[str, Any]) -> None:
    rows = [("scenario", "server", "chunks/s", "burst p99 ms", "paced p99 ms", "RSS KB/idle reader",
             "publish / burst s", "cores: server, bench, nats; machine busy")]
    for server, res in out["results"].items():
        if server in ("publisher_alone", "gzip_rounds"):
            continue
        for scen, r in res.items():
            rss = r["rss_kb_per_idle_reader"]  # None: not measured in this scenario
            c = r["burst_cores"]
            rows.append((scen, server, str(r["delivered_chunks_per_s"]), str(r["burst_p99_ms"]),
                         str(r.get("latency_p99_ms", "-")), "-" if rss is None else str(rss),
                         f"{r['burst_publish_s']} / {r['burst_s']}",
                         f"{c['server']}, {c['bench (publisher + readers)']}, {c['nats-server']}; {c['machine_busy']}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    alone = out["results"]["publisher_alone"]["200_runs"]
    print(f"publisher alone (200 runs, pipelined, nobody reading): {alone['stored_chunks_per_s']} chunks/s stored")
    print("summary:", json.dumps(out["summary"]))


if __name__ == "__main__":
    asyncio.run(main())
