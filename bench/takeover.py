"""Takeover latency: ours side by side with a reference-style baseline, in one run (issue 5).

Two clusters share one etcd and one nats-server: each has its own coordinator (own etcd
prefix) and two sandbox host subprocesses (own stream and bucket). The baseline's hosts wait
a 5 s quiet time after their fence before their first append (``BATON_TAKEOVER_QUIET_TIME``,
the reference design's default); ours append as soon as the fence has landed.

Figures (seconds; p50 and max over the samples):

(a) lease expired → first new chunk: the driving host is SIGKILLed; from the moment its
    claim vanishes with its lease (seen through ``WatchRun``; the earliest a rejoining
    client could trigger a takeover) to the first chunk of the successor reaching a reader.
    Target: p50 ≤ 150 ms and ≥ 30× faster than the baseline.
(b) SIGKILL stall: from the SIGKILL to the first new chunk at a reader connected the whole
    time (lease TTL included). Target ≤ TTL + 500 ms.
(c) drain stall: from SIGTERM (drain) of the driving host to the first new chunk. Target
    ≤ 300 ms.
(d) alignment time of 1k, 10k and 100k stored chunks (pure, with real fingerprints).
    Target: linear, 100k ≤ 2 s.

Fast failover (issue 17): two more clusters, ``fast`` (the default) and ``ttl``
(``BATON_FAST_FAILOVER=0``, today's lease-TTL path), three hosts each, measured side by side:

(e) SIGKILL → next chunk at the reader: a host driving 10 runs is SIGKILLed; for each run,
    from the SIGKILL to the first chunk of its successor at a reader connected the whole
    time. p50, p99 and max over every run of ``KILLS_FAST`` kills (``KILLS_TTL`` for ttl).
    Target: p50 ≤ 300 ms, max ≤ 600 ms.
(f) 50 runs on one killed host → all continued: from the SIGKILL to the last of the 50
    runs' first successor chunk. Target ≤ 1 s.
(g) unneeded takeovers in a blip: a host dialling its coordinator through a TCP proxy
    drives 10 runs while the proxy resets its connections ``BLIPS`` times; takeovers counted
    as fences above epoch 1 in the runs' logs. Target 0.

Writes ``bench/results/takeover.json``.
"""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "takeover.json"
REPO = pathlib.Path(__file__).resolve().parent.parent
CORPUS = REPO / "corpus"  # the repository's own recorded journals
JOURNAL = "claude-stream-json/partial-messages-parallel-bash-denied.jsonl"
DELAY = 0.01  # seconds per journal line: the agent keeps writing while its host is dead
KILL_AT = 40  # chunks a reader has seen when the host is killed / drained
TTL = 2.0
SAMPLES_OURS = 3
SAMPLES_BASE = 2
KILLS_FAST = 20  # (e): kills of the fast side, 10 runs each
KILLS_TTL = 5  # (e): kills of the ttl side (each waits the TTL)
RUNS_PER_KILL = 10
MANY = 50  # (f)
BLIPS = 10  # (g)
FAST_KILL_AT = 15  # chunks every reader of (e)-(g) has seen before the fault
#: Session TTL of the (e)-(g) clusters (s): the product's 2 s loses sessions before any
#: fault on a 2-core machine shared with other suites (as in tests/faults); the fast path
#: does not depend on it, the ttl side waits for it.
FAST_TTL = 5.0


@dataclass
class Side:
    name: str
    quiet: float
    tmp: pathlib.Path
    fast: bool = True
    n_hosts: int = 2
    ttl: float = TTL
    coordinator: Any = None
    hosts: list[Any] = field(default_factory=list)
    cc: Any = None
    log: Any = None
    env: dict[str, str] = field(default_factory=dict)
    channels: dict[str, Any] = field(default_factory=dict)

    async def start(self, etcd: Any, nats: Any) -> None:
        from baton.coordinator_client import CoordinatorClient
        from baton.log import DeliveryLog, LogConfig
        from baton_tools.testing.cluster import start_coordinator, start_host

        tag = f"b{uuid.uuid4().hex[:8]}"
        self.env = {
            "BATON_RUNS_STREAM": f"RUNS_{tag}", "BATON_SUBJECT_PREFIX": f"baton.{tag}",
            "BATON_THREADS_BUCKET": f"threads-{tag}", "BATON_JOURNAL_DIR": str(self.tmp / "journals"),
            "BATON_SANDBOX_DIR": str(self.tmp / "sandboxes"), "BATON_REPLAY_DIRS": str(CORPUS),
            "BATON_SESSION_TTL": str(int(self.ttl)), "BATON_TAKEOVER_QUIET_TIME": str(self.quiet),
            "BATON_LOG_LEVEL": "WARNING",
        }
        self.coordinator = await start_coordinator(etcd.endpoint, f"/{tag}/", log_dir=self.tmp / "logs",
                                                   BATON_SESSION_TTL=str(int(self.ttl)), BATON_REAPER_INTERVAL="0",
                                                   BATON_FAST_FAILOVER="1" if self.fast else "0")
        for i in range(self.n_hosts):
            self.hosts.append(await start_host(self.coordinator.address, nats.url, host_id=f"{self.name}-{i}",
                                               log_dir=self.tmp / "logs", **self.env))
        self.cc = CoordinatorClient(self.coordinator.address)
        self.log = await DeliveryLog.connect(nats.url, LogConfig.from_env(self.env))
        await self.log.provision()

    def stub(self, host: Any) -> Any:
        import grpc

        from baton.v1 import sandbox_host_pb2_grpc

        ch = self.channels.get(host.address)
        if ch is None:
            ch = self.channels[host.address] = grpc.aio.insecure_channel(
                host.address, options=[("grpc.enable_http_proxy", 0)])
        return sandbox_host_pb2_grpc.SandboxHostStub(ch)

    async def start_run(self, host: Any, delay: float = DELAY) -> str:
        from baton.v1 import runs_pb2, sandbox_host_pb2

        run_id = f"run-{uuid.uuid4().hex[:10]}"
        opts = {"journal": str(CORPUS / JOURNAL), "speed": 1.0, "delay": delay}
        await self.stub(host).StartRun(sandbox_host_pb2.StartRunRequest(
            run_id=run_id, thread_id=f"thr-{run_id}", agent=runs_pb2.AgentSpec(kind="replay", options_json=json.dumps(opts)),
            messages_json='[{"id":"u1","role":"user","content":"go"}]'),
            timeout=15, wait_for_ready=True)
        return run_id

    async def sample(self, how: str) -> dict[str, float]:
        """One run, its driving host killed (``kill``) or drained (``drain``) mid-way."""
        victim = self.hosts[0]
        run_id = await self.start_run(victim)
        arrivals: list[tuple[int, float]] = []
        reached = asyncio.Event()
        expired: list[float] = []

        async def read() -> None:
            async with self.log.read(run_id) as r:
                async for off, _ in r:
                    arrivals.append((int(off), time.monotonic()))
                    if len(arrivals) >= KILL_AT:
                        reached.set()
            reached.set()

        async def watch() -> None:
            held = False
            async for ev in self.cc.watch_run(run_id):
                if ev.claim is not None and ev.claim.epoch == 1:
                    held = True
                elif held and ev.claim is None:
                    expired.append(time.monotonic())
                    return

        reader = asyncio.create_task(read())
        watcher = asyncio.create_task(watch())
        async with asyncio.timeout(60):
            await reached.wait()
        t0 = time.monotonic()
        if how == "kill":
            victim.kill_now()
            stopping = None
        else:
            stopping = asyncio.create_task(victim.stop())
        async with asyncio.timeout(90):
            await reader
        if stopping is not None:
            await stopping
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        heads = await self.log.stored_headers(run_id)
        fence2 = next(h.offset for h in heads if h.kind == "fence" and h.epoch >= 2)
        t_new = next(t for off, t in arrivals if off > fence2)
        await victim.start()
        # Keep the victim first: the next sample drives on it again.
        out = {"stall": t_new - t0}
        if expired:
            out["after_expiry"] = t_new - expired[0]
        return out

    async def close(self) -> None:
        """Idempotent: stop the hosts, close the clients, stop the coordinator."""
        hosts, self.hosts = self.hosts, []
        for h in hosts:
            await h.stop()
        channels, self.channels = self.channels, {}
        for ch in channels.values():
            await ch.close()
        cc, self.cc = self.cc, None
        if cc is not None:
            await cc.close()
        dlog, self.log = self.log, None
        if dlog is not None:
            await dlog.close()
        if self.coordinator is not None:
            await self.coordinator.stop()


def alignment_times() -> dict[str, float]:
    """Seconds to align n stored chunks against their replay (real fingerprints)."""
    from baton.fingerprint import fingerprint
    from baton.log import StoredRecord
    from sandbox_host.align import align

    out: dict[str, float] = {}
    for n in (1_000, 10_000, 100_000):
        chunks = [{"type": "TEXT_MESSAGE_CONTENT", "messageId": f"m{i // 50}", "delta": f"token {i} "} for i in range(n)]
        stored = [StoredRecord(offset=i + 2, kind="chunk", epoch=1, origin="journal", fingerprint=fingerprint(c))
                  for i, c in enumerate(chunks)]
        t0 = time.perf_counter()
        tags = sum(1 for t in align(stored, chunks) if t.tag == "stored")
        out[str(n)] = time.perf_counter() - t0
        assert tags == n
    return out


async def _follow(log: Any, run_id: str, arrivals: list[tuple[int, float]], seen: asyncio.Event) -> None:
    async with log.read(run_id) as r:
        async for off, _ in r:
            arrivals.append((int(off), time.monotonic()))
            if len(arrivals) >= FAST_KILL_AT:
                seen.set()
    seen.set()


async def _drive(side: Side, host: Any, n: int, delay: float) -> tuple[list[str], dict[str, list[tuple[int, float]]], list[asyncio.Task[None]]]:
    """Start ``n`` runs on ``host``, each with a reader; returns once each reader saw
    ``FAST_KILL_AT`` chunks.

    A start refused because the host's session was lost meanwhile (a 2 s TTL on a loaded
    2-core machine) is retried: the sample is about the kill, not about that."""
    import grpc

    async def start() -> str:
        for attempt in range(5):
            try:
                return await side.start_run(host, delay)
            except grpc.aio.AioRpcError as exc:
                print(f"  ({side.name}: start refused: {exc.details()}; again)", flush=True)
                if attempt == 4:
                    raise
                await asyncio.sleep(0.5)
        raise AssertionError("unreachable")

    run_ids: list[str] = []
    for i in range(0, n, 10):  # 10 starts at a time: 50 at once time out on a loaded host
        run_ids += await asyncio.gather(*(start() for _ in range(min(10, n - i))))
    arrivals: dict[str, list[tuple[int, float]]] = {r: [] for r in run_ids}
    seen = {r: asyncio.Event() for r in run_ids}
    readers = [asyncio.create_task(_follow(side.log, r, arrivals[r], seen[r])) for r in run_ids]
    async with asyncio.timeout(120):
        await asyncio.gather(*(e.wait() for e in seen.values()))
    return run_ids, arrivals, readers


async def _successor_delays(side: Side, run_ids: list[str], arrivals: dict[str, list[tuple[int, float]]],
                            readers: list[asyncio.Task[None]], t0: float) -> list[float]:
    """Per run: seconds from ``t0`` to the first chunk after the successor's fence (once
    every run ended). Runs that ended before the fault (no fence above epoch 1) are left out."""
    async with asyncio.timeout(600):
        await asyncio.gather(*readers)
    out = []
    for r in run_ids:
        heads = await side.log.stored_headers(r)
        fence2 = next((h.offset for h in heads if h.kind == "fence" and h.epoch >= 2), None)
        if fence2 is not None:
            out.append(next(t for off, t in arrivals[r] if off > fence2) - t0)
    return out


async def kills(side: Side, n_kills: int, runs: int = RUNS_PER_KILL, delay: float = DELAY) -> list[float]:
    """(e): ``n_kills`` times, SIGKILL a host driving ``runs`` runs; every run's delay.

    The hosts take turns; a killed host restarts in the background while the next sample
    runs (at most one restarting, so the victim always has a live successor)."""
    out: list[float] = []
    restarts: list[asyncio.Task[None]] = []
    try:
        for i in range(n_kills):
            if len(restarts) >= 2:
                await restarts[-2]
            victim = side.hosts[i % len(side.hosts)]
            run_ids, arrivals, readers = await _drive(side, victim, runs, delay)
            t0 = time.monotonic()
            victim.kill_now()
            restarts.append(asyncio.create_task(victim.start()))
            got = await _successor_delays(side, run_ids, arrivals, readers, t0)
            print(f"  {side.name} kill {i + 1}/{n_kills}: max {max(got, default=0) * 1000:.0f} ms over {len(got)} runs", flush=True)
            out += got
    finally:
        await asyncio.gather(*restarts)
    return out


async def many_on_one(side: Side) -> float:
    """(f): seconds from the SIGKILL of a host driving ``MANY`` runs to the last run's next chunk."""
    victim = side.hosts[0]
    run_ids, arrivals, readers = await _drive(side, victim, MANY, 0.05)
    t0 = time.monotonic()
    victim.kill_now()
    delays = await _successor_delays(side, run_ids, arrivals, readers, t0)
    await victim.start()
    assert len(delays) == MANY, f"only {len(delays)} of {MANY} runs were taken over"
    return max(delays)


async def blips(side: Side, nats: Any) -> dict[str, int]:
    """(g): a host behind a TCP proxy to its coordinator drives 10 runs; the proxy resets
    its connections ``BLIPS`` times. Returns runs, takeovers and fast revokes."""
    from baton_tools.testing.cluster import start_host
    from baton_tools.testing.proxy import TcpProxy

    assert side.coordinator is not None
    log_path = side.coordinator.log_path
    revoked_before = log_path.read_text(errors="replace").count("lease revoked (fast failover)")
    proxy = await TcpProxy(side.coordinator.port).start()
    host = await start_host(proxy.endpoint, nats.url, host_id=f"{side.name}-proxied",
                            log_dir=side.tmp / "logs", **side.env)
    try:
        run_ids, _, readers = await _drive(side, host, RUNS_PER_KILL, 0.03)
        for _ in range(BLIPS):
            proxy.cut()
            await asyncio.sleep(0.4)  # the host reconnects within ~0.1 s; let it
        async with asyncio.timeout(180):
            await asyncio.gather(*readers)
        takeovers = 0
        for r in run_ids:
            takeovers += sum(1 for h in await side.log.stored_headers(r) if h.kind == "fence" and h.epoch >= 2)
    finally:
        await host.stop()
        await proxy.close()
    revoked = log_path.read_text(errors="replace").count("lease revoked (fast failover)") - revoked_before
    # The stop above revokes the proxied host's own session (it is gone): not a blip's.
    return {"runs": len(run_ids), "blips": BLIPS, "takeovers": takeovers, "revokes_during_blips": max(0, revoked - 1)}


async def _or_error(coro: Any) -> Any:
    try:
        return await coro
    except (TimeoutError, AssertionError, OSError) as exc:
        print(f"  failed: {exc!r}", flush=True)
        return {"error": repr(exc)}


def _pct(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    ys = sorted(xs)
    return {"p50": statistics.median(ys), "p99": ys[min(len(ys) - 1, round(0.99 * (len(ys) - 1)))],
            "max": ys[-1], "n": len(ys)}


async def fast_failover(etcd: Any, nats: Any, tmp: pathlib.Path) -> dict[str, Any]:
    """(e), (f) and (g), fast path and TTL path side by side."""
    fast = Side("fast", 0.0, tmp / "fast", fast=True, n_hosts=3, ttl=FAST_TTL)
    ttl = Side("ttl", 0.0, tmp / "ttl", fast=False, n_hosts=3, ttl=FAST_TTL)
    try:
        await fast.start(etcd, nats)
        await ttl.start(etcd, nats)
        e_fast = await kills(fast, KILLS_FAST)
        e_ttl = await kills(ttl, KILLS_TTL)
        print(f"(e) fast {_pct(e_fast)}\n(e) ttl {_pct(e_ttl)}", flush=True)
        # (f) and (g) may fail on an overloaded machine; (e) is kept either way.
        f_fast = await _or_error(many_on_one(fast))
        f_ttl = await _or_error(many_on_one(ttl))
        g = await _or_error(blips(fast, nats))
    finally:
        await fast.close()
        await ttl.close()
    return {
        "e_sigkill_next_chunk_s": {"fast": _pct(e_fast), "ttl": _pct(e_ttl),
                                   "kills": {"fast": KILLS_FAST, "ttl": KILLS_TTL},
                                   "runs_per_kill": RUNS_PER_KILL},
        "f_50_runs_all_continued_s": {"fast": f_fast, "ttl": f_ttl},
        "g_blip": g,
    }


def _stats(xs: list[float]) -> dict[str, float]:
    return {"p50": statistics.median(xs), "max": max(xs), "n": len(xs)} if xs else {}


async def main_fast() -> dict[str, Any]:
    """Only (e)-(g) (``python -m bench.takeover fast``): writes ``takeover_fast.json``."""
    sys.path.insert(0, str(REPO))
    os.environ.pop("http_proxy", None)
    os.environ.pop("https_proxy", None)
    from baton_tools.testing.servers import EtcdServer, NatsServer

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-takeover-"))
    etcd, nats = EtcdServer(tmp / "etcd"), NatsServer(tmp / "nats")
    etcd.start()
    nats.start()
    try:
        r = await fast_failover(etcd, nats, tmp)
    finally:
        nats.kill()
        etcd.kill()
    r["lease_ttl_s"] = FAST_TTL
    r["targets_met"] = _fast_targets(r)
    _print_fast(r)
    out = RESULTS.with_name("takeover_fast.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(r, indent=2, sort_keys=True) + "\n")
    return r


def _fast_targets(r: dict[str, Any]) -> dict[str, bool]:
    e = r["e_sigkill_next_chunk_s"]["fast"]
    return {
        "e_p50_le_300ms": bool(e) and e["p50"] <= 0.300,
        "e_max_le_600ms": bool(e) and e["max"] <= 0.600,
        "f_le_1s": isinstance(r["f_50_runs_all_continued_s"]["fast"], float)
        and r["f_50_runs_all_continued_s"]["fast"] <= 1.0,
        "g_no_unneeded_takeover": r["g_blip"].get("takeovers") == 0,
    }


async def main() -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    os.environ.pop("http_proxy", None)
    os.environ.pop("https_proxy", None)
    from baton_tools.testing.servers import EtcdServer, NatsServer

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-takeover-"))
    etcd, nats = EtcdServer(tmp / "etcd"), NatsServer(tmp / "nats")
    etcd.start()
    nats.start()
    ours, base = Side("ours", 0.0, tmp / "ours"), Side("base", 5.0, tmp / "base")
    results: dict[str, Any] = {}
    try:
        results["alignment_s"] = alignment_times()
        await ours.start(etcd, nats)
        await base.start(etcd, nats)
        k_ours = [await ours.sample("kill") for _ in range(SAMPLES_OURS)]
        k_base = [await base.sample("kill") for _ in range(SAMPLES_BASE)]
        d_ours = [await ours.sample("drain") for _ in range(SAMPLES_OURS)]
        d_base = [await base.sample("drain") for _ in range(1)]
        await ours.close()
        await base.close()
        results.update(await fast_failover(etcd, nats, tmp))
    finally:
        await ours.close()
        await base.close()
        nats.kill()
        etcd.kill()
    a_o = _stats([s["after_expiry"] for s in k_ours if "after_expiry" in s])
    a_b = _stats([s["after_expiry"] for s in k_base if "after_expiry" in s])
    results.update({
        "lease_ttl_s": TTL,
        "a_expiry_to_first_new_chunk_s": {"ours": a_o, "baseline": a_b,
                                          "speedup_p50": (a_b["p50"] / a_o["p50"]) if a_o and a_b else None},
        "b_sigkill_stall_s": {"ours": _stats([s["stall"] for s in k_ours]),
                              "baseline": _stats([s["stall"] for s in k_base])},
        "c_drain_stall_s": {"ours": _stats([s["stall"] for s in d_ours]),
                            "baseline": _stats([s["stall"] for s in d_base])},
    })
    targets = {
        "a_p50_le_150ms": bool(a_o) and a_o["p50"] <= 0.150,
        "a_speedup_ge_30x": bool(results["a_expiry_to_first_new_chunk_s"]["speedup_p50"])
        and results["a_expiry_to_first_new_chunk_s"]["speedup_p50"] >= 30,
        "b_le_ttl_plus_500ms": results["b_sigkill_stall_s"]["ours"]["max"] <= TTL + 0.5,
        "c_le_300ms": results["c_drain_stall_s"]["ours"]["max"] <= 0.300,
        "align_100k_le_2s": results["alignment_s"]["100000"] <= 2.0,
        **_fast_targets(results),
    }
    results["targets_met"] = targets
    _print(results)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return results


def _print(r: dict[str, Any]) -> None:
    def ms(x: Any) -> str:
        return f"{x * 1000:8.1f} ms" if isinstance(x, (int, float)) else f"{'-':>11}"

    print(f"{'figure':42} {'ours p50':>11} {'ours max':>11} {'base p50':>11}")
    for key, label in (("a_expiry_to_first_new_chunk_s", "(a) lease expired -> first new chunk"),
                       ("b_sigkill_stall_s", "(b) SIGKILL stall (TTL included)"),
                       ("c_drain_stall_s", "(c) drain stall")):
        o, b = r[key]["ours"], r[key]["baseline"]
        print(f"{label:42} {ms(o.get('p50'))} {ms(o.get('max'))} {ms(b.get('p50'))}")
    print(f"speedup (a) p50: {r['a_expiry_to_first_new_chunk_s']['speedup_p50']}")
    _print_fast(r)
    for n, s in r["alignment_s"].items():
        print(f"alignment of {int(n):>7} stored chunks: {ms(s)}")
    print("targets:", r["targets_met"])


def _print_fast(r: dict[str, Any]) -> None:
    def ms(x: Any) -> str:
        return f"{x * 1000:8.1f} ms" if isinstance(x, (int, float)) else f"{'-':>11}"

    e = r["e_sigkill_next_chunk_s"]
    print(f"{'fast failover (issue 17)':42} {'p50':>11} {'p99':>11} {'max':>11} {'n':>5}")
    for side in ("fast", "ttl"):
        x = e[side]
        print(f"{'(e) SIGKILL -> next chunk, ' + side:42} {ms(x.get('p50'))} {ms(x.get('p99'))} {ms(x.get('max'))} {x.get('n', 0):>5}")
    f = r["f_50_runs_all_continued_s"]
    print(f"{'(f) 50 runs on one killed host, fast':42} {ms(f['fast'])}")
    print(f"{'(f) 50 runs on one killed host, ttl':42} {ms(f['ttl'])}")
    print(f"(g) blip: {r['g_blip']}")
    if "e_p50_le_300ms" in r.get("targets_met", {}) and "a_p50_le_150ms" not in r["targets_met"]:
        print("targets:", r["targets_met"])


if __name__ == "__main__":
    asyncio.run(main_fast() if sys.argv[1:] == ["fast"] else main())
