"""Coordinator throughput and latency against raw etcd doing the same work, in one run.

Claims/s and record updates/s at 1 and 20 concurrent callers through the coordinator
(a real ``python -m coordinator`` subprocess, gRPC), side by side with raw ``aetcd``
transactions doing the same claim and update (read the record and claim, then one
transaction comparing the record's mod revision and, for a claim, the claim key's absence).
Targets: coordinator >= 0.9 x the raw etcd rate with one caller, >= 0.8 x at 20 callers,
>= 0.6 x with a cold cache (the floors these stand against: ``floor-txn`` and, for the
cold cache, ``floor-cold`` below); p99 claim latency <= 10 ms at 20 callers.

Paths:
  * ``raw-etcd``: the baseline above (a client that holds no state must read first).
  * ``coordinator``: runs created through the coordinator (as the gateway does), so its
    record cache knows them and a claim/update is one etcd transaction.
  * ``coord-cold``: runs written straight into etcd, never seen by the coordinator: every
    call reads first (the worst case, e.g. a run created through another replica).
  * ``raw-cas``: reference only, not a target: raw etcd's single transaction with the
    revision already known (what the coordinator sends to etcd on a cache hit), so the
    ratio against it is the cost of the coordinator's gRPC hop itself.
  * ``floor-noop``, ``floor-txn`` and ``floor-cold``: the floor (``bench/_coord_floor.py``),
    reference only: the coordinator's gRPC stack answering at once, answering after one etcd
    write transaction (the floor of ``coordinator``), and after raw etcd's read and write
    transaction (the floor of ``coord-cold``), with none of its rules, store or cache.

With ``BENCH_COORD_BASE=<checkout>``, ``base`` and ``base-cold`` are the same two paths through
that checkout's coordinator, in the same run (a before/after side by side).

Besides the rate, every cell gives the CPU each process spent per operation (µs: this
client, the server in between, etcd; read from ``/proc``): on a loaded machine, where the
rates follow the CPU each side needs, this is what the ratios come from.

Writes ``bench/results/coordinator.json``.
"""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Awaitable, Callable

import aetcd

from baton.coordinator_client import CoordinatorClient
from bench._cpu import cpu_seconds
from baton_tools.testing.cluster import start_coordinator
from baton_tools.testing.servers import EtcdServer
from baton.v1.runs_pb2 import Claim, RunRecord, RunStatus
from coordinator._keys import Keys

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "coordinator.json"
COUNTS = {1: 300, 20: 1500}  # operations per (path, op, concurrency) cell and round
ROUNDS = 5  # every cell is measured this many times, the paths interleaved (noise hits all)


async def _seed_runs(etcd: aetcd.Client, keys: Keys, run_ids: list[str]) -> None:
    """Create running records straight in etcd (setup, not measured)."""
    for i in range(0, len(run_ids), 50):  # etcd allows 128 ops per transaction
        ops = []
        for rid in run_ids[i : i + 50]:
            rec = RunRecord(run_id=rid, thread_id=f"th-{rid}", status=RunStatus.RUN_STATUS_RUNNING, started_at=1.0)
            ops += [etcd.transactions.put(keys.run(rid), rec.SerializeToString()),
                    etcd.transactions.put(keys.thread_active(rec.thread_id), rid.encode())]
        await etcd.transaction(compare=[], success=ops, failure=[])


def _cpu(pid: int | None) -> float:
    """CPU seconds (user + system) process ``pid`` has used; this process's for ``None``."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    return cpu_seconds(pid)


async def _measure(op: Callable[[str], Awaitable[None]], run_ids: list[str], concurrency: int,
                   pids: dict[str, int | None] | None = None) -> dict[str, Any]:
    """Run ``op`` over ``run_ids`` with ``concurrency`` callers → rate, latencies, and the
    CPU µs per operation of each process in ``pids`` (name → pid, ``None``: this one)."""
    pids = pids or {}
    cpu0 = {name: _cpu(pid) for name, pid in pids.items()}
    latencies: list[float] = []
    queue = list(reversed(run_ids))

    async def worker() -> None:
        while queue:
            rid = queue.pop()
            t = time.perf_counter()
            await op(rid)
            latencies.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    cpu = {name: (_cpu(pid) - cpu0[name]) * 1e6 / max(len(latencies), 1) for name, pid in pids.items()}
    return {"ops": len(latencies), "ops_per_s": len(latencies) / elapsed, "latencies": latencies, "cpu_us": cpu}


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Median rate over the rounds; latency percentiles over every operation of them."""
    lat = sorted(x for r in rounds for x in r["latencies"])
    cpu = {name: statistics.median(r["cpu_us"][name] for r in rounds) for name in rounds[0]["cpu_us"]}
    return {
        "ops": len(lat),
        "cpu_us_per_op": cpu,
        "ops_per_s": statistics.median(r["ops_per_s"] for r in rounds),
        "ops_per_s_rounds": [round(r["ops_per_s"], 1) for r in rounds],
        "p50_ms": statistics.median(lat) * 1000,
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
    }


async def _create_via_coordinator(cc: CoordinatorClient, run_ids: list[str]) -> None:
    """Create running records through the coordinator (setup, not measured)."""
    sem = asyncio.Semaphore(20)

    async def one(rid: str) -> None:
        async with sem:
            await cc.create_or_resume_run(RunRecord(run_id=rid, thread_id=f"th-{rid}", started_at=1.0))

    await asyncio.gather(*(one(r) for r in run_ids))


class _Raw:
    """The coordinator's etcd work for ClaimRun / UpdateRun, done with aetcd directly.

    ``known`` holds the record revisions of ``raw-cas`` (the single transaction with the
    revision known in advance, as the coordinator's cache knows it).
    """

    def __init__(self, etcd: aetcd.Client, keys: Keys, lease: Any) -> None:
        self.etcd, self.keys, self.lease = etcd, keys, lease
        self.known: dict[str, tuple[int, RunRecord]] = {}

    async def learn(self, run_ids: list[str]) -> None:
        """Read the records ``raw-cas`` will write (setup, not measured)."""
        for rid in run_ids:
            meta, _, rec = await self._snapshot(rid)
            self.known[rid] = (meta.mod_revision, rec)

    async def cas_claim(self, rid: str) -> None:
        t = self.etcd.transactions
        rev, rec = self.known.pop(rid)
        rec.driver_epoch += 1
        rec.driver_host = "bench"
        claim = Claim(run_id=rid, epoch=rec.driver_epoch, host_id="bench", session_id=self.lease.id, purpose="drive")
        ok, _ = await self.etcd.transaction(
            compare=[t.mod(self.keys.run(rid)) == rev, t.create(self.keys.claim(rid)) == 0],
            success=[t.put(self.keys.run(rid), rec.SerializeToString()),
                     t.put(self.keys.claim(rid), claim.SerializeToString(), lease=self.lease)],
            failure=[t.get(self.keys.run(rid)), t.get(self.keys.claim(rid))])
        assert ok

    async def cas_update(self, rid: str) -> None:
        t = self.etcd.transactions
        rev, rec = self.known.pop(rid)
        rec.sandbox_key = "sb-updated"
        ok, _ = await self.etcd.transaction(
            compare=[t.mod(self.keys.run(rid)) == rev],
            success=[t.put(self.keys.run(rid), rec.SerializeToString())],
            failure=[t.get(self.keys.run(rid)), t.get(self.keys.claim(rid))])
        assert ok

    async def _snapshot(self, rid: str) -> tuple[Any, Any, RunRecord]:
        t = self.etcd.transactions
        _, (run_kvs, claim_kvs) = await self.etcd.transaction(
            compare=[], success=[t.get(self.keys.run(rid)), t.get(self.keys.claim(rid))], failure=[])
        meta = run_kvs[0][1]
        return meta, claim_kvs, RunRecord.FromString(run_kvs[0][0])

    async def claim(self, rid: str) -> None:
        t = self.etcd.transactions
        meta, claim_kvs, rec = await self._snapshot(rid)
        assert not claim_kvs
        rec.driver_epoch += 1
        rec.driver_host = "bench"
        claim = Claim(run_id=rid, epoch=rec.driver_epoch, host_id="bench", session_id=self.lease.id, purpose="drive")
        ok, _ = await self.etcd.transaction(
            compare=[t.mod(self.keys.run(rid)) == meta.mod_revision, t.create(self.keys.claim(rid)) == 0],
            success=[t.put(self.keys.run(rid), rec.SerializeToString()),
                     t.put(self.keys.claim(rid), claim.SerializeToString(), lease=self.lease)],
            failure=[])
        assert ok

    async def update(self, rid: str) -> None:
        t = self.etcd.transactions
        meta, _, rec = await self._snapshot(rid)
        rec.sandbox_key = "sb-updated"
        ok, _ = await self.etcd.transaction(
            compare=[t.mod(self.keys.run(rid)) == meta.mod_revision],
            success=[t.put(self.keys.run(rid), rec.SerializeToString())], failure=[])
        assert ok


async def main() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="baton-bench-") as tmp:
        server = EtcdServer(pathlib.Path(tmp))
        server.start()
        try:
            return await _run(server, pathlib.Path(tmp))
        finally:
            server.kill()


BASE = os.environ.get("BENCH_COORD_BASE", "")
PATHS = ("raw-etcd", "coordinator", "coord-cold", "raw-cas", "floor-noop", "floor-txn", "floor-cold",
         *(("base", "base-cold") if BASE else ()))


def _start_floor(mode: str, etcd_endpoint: str) -> tuple[subprocess.Popen[bytes], str]:
    """``bench/_coord_floor.py`` in ``mode`` → (process, its address); blocks until it serves."""
    proc = subprocess.Popen([sys.executable, "-m", "bench._coord_floor", mode, etcd_endpoint],
                            cwd=ROOT, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.strip():
        proc.kill()
        raise RuntimeError(f"bench/_coord_floor.py {mode} did not start")
    return proc, f"127.0.0.1:{int(line)}"


async def _run(server: EtcdServer, tmp: pathlib.Path) -> dict[str, Any]:
    host, port = server.endpoint.rsplit(":", 1)
    coord_keys, raw_keys, base_keys = Keys("/bench-coord/"), Keys("/bench-raw/"), Keys("/bench-base/")
    floors: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    try:
        for mode in ("noop", "txn", "read-txn"):
            floors[mode] = _start_floor(mode, server.endpoint)
        cp = await start_coordinator(server.endpoint, coord_keys.prefix, log_dir=tmp)
    except BaseException:
        for proc, _ in floors.values():  # the floors started before the failure
            proc.kill()
            proc.wait()
        raise
    bp = await start_coordinator(server.endpoint, base_keys.prefix, log_dir=tmp, repo=BASE) if BASE else cp
    base_proc = getattr(bp, "proc", None)
    assert isinstance(base_proc, subprocess.Popen)
    coord_proc = getattr(cp, "proc", None)  # a subprocess, so its CPU can be read
    assert isinstance(coord_proc, subprocess.Popen) and server.proc is not None
    rows: list[dict[str, Any]] = []
    try:
        async with aetcd.Client(host=host, port=int(port)) as etcd, CoordinatorClient(cp.address) as cc, \
                CoordinatorClient(bp.address) as bc, CoordinatorClient(floors["noop"][1]) as f_noop, CoordinatorClient(floors["txn"][1]) as f_txn, \
                CoordinatorClient(floors["read-txn"][1]) as f_cold:
            session = await cc.open_session(60.0, owner="bench")
            base_session = await bc.open_session(60.0, owner="bench") if BASE else session
            lease = await etcd.lease(3600)  # no keep-alive: outlives the bench
            raw = _Raw(etcd, raw_keys, lease)

            async def coord_claim(rid: str) -> None:
                await cc.claim_run(rid, session, "bench")

            async def coord_update(rid: str) -> None:
                await cc.update_run(rid, RunRecord(sandbox_key="sb-updated"), ["sandbox_key"])

            def floor(client: CoordinatorClient, op: str) -> Callable[[str], Awaitable[None]]:
                async def claim(rid: str) -> None:
                    await client.claim_run(rid, base_session if client is bc else session, "bench")

                async def update(rid: str) -> None:
                    await client.update_run(rid, RunRecord(sandbox_key="sb-updated"), ["sandbox_key"])
                return claim if op == "claim" else update

            etcd_pid = server.proc.pid
            pids: dict[str, dict[str, int | None]] = {
                "raw-etcd": {"client": None, "etcd": etcd_pid}, "raw-cas": {"client": None, "etcd": etcd_pid},
                "coordinator": {"client": None, "server": coord_proc.pid, "etcd": etcd_pid},
                "coord-cold": {"client": None, "server": coord_proc.pid, "etcd": etcd_pid},
                "floor-noop": {"client": None, "server": floors["noop"][0].pid, "etcd": etcd_pid},
                "floor-txn": {"client": None, "server": floors["txn"][0].pid, "etcd": etcd_pid},
                "floor-cold": {"client": None, "server": floors["read-txn"][0].pid, "etcd": etcd_pid},
                "base": {"client": None, "server": base_proc.pid, "etcd": etcd_pid},
                "base-cold": {"client": None, "server": base_proc.pid, "etcd": etcd_pid}}

            fns: dict[tuple[str, str], Callable[[str], Awaitable[None]]] = {
                ("raw-etcd", "claim"): raw.claim, ("raw-etcd", "update"): raw.update,
                ("raw-cas", "claim"): raw.cas_claim, ("raw-cas", "update"): raw.cas_update,
                ("coordinator", "claim"): coord_claim, ("coordinator", "update"): coord_update,
                ("coord-cold", "claim"): coord_claim, ("coord-cold", "update"): coord_update,
                ("floor-noop", "claim"): floor(f_noop, "claim"), ("floor-noop", "update"): floor(f_noop, "update"),
                ("floor-txn", "claim"): floor(f_txn, "claim"), ("floor-txn", "update"): floor(f_txn, "update"),
                ("floor-cold", "claim"): floor(f_cold, "claim"), ("floor-cold", "update"): floor(f_cold, "update"),
                ("base", "claim"): floor(bc, "claim"), ("base", "update"): floor(bc, "update"),
                ("base-cold", "claim"): floor(bc, "claim"), ("base-cold", "update"): floor(bc, "update")}
            for conc, n in COUNTS.items():
                for op in ("claim", "update"):
                    runs: dict[str, list[dict[str, Any]]] = {path: [] for path in PATHS}
                    for rnd in range(ROUNDS):
                        for path in PATHS[rnd % len(PATHS):] + PATHS[:rnd % len(PATHS)]:
                            keys = (coord_keys if path.startswith("coord") else
                                    base_keys if path.startswith("base") else raw_keys)
                            ids = [f"{path}-{op}-{conc}-{rnd}-{i}" for i in range(n)]
                            if path in ("coordinator", "base"):
                                await _create_via_coordinator(cc if path == "coordinator" else bc, ids)
                            elif not path.startswith("floor"):
                                await _seed_runs(etcd, keys, ids)
                            if path == "raw-cas":
                                await raw.learn(ids)
                            warm, measured = ids[: min(20, n)], ids[min(20, n):]
                            await _measure(fns[(path, op)], warm, conc)  # warm-up on runs not measured
                            runs[path].append(await _measure(fns[(path, op)], measured, conc, pids[path]))
                    for path in PATHS:
                        base = runs["raw-etcd"]
                        rows.append({"op": op, "concurrency": conc, "path": path, **_summary(runs[path]),
                                     # per round against the baseline measured next to it
                                     "ratio_vs_raw": statistics.median(
                                         r["ops_per_s"] / b["ops_per_s"] for r, b in zip(runs[path], base))})
            await session.close()
            if BASE:
                await base_session.close()
            await lease.revoke()
    finally:
        await cp.stop()
        if BASE:
            await bp.stop()
        for proc, _ in floors.values():
            proc.kill()
            proc.wait()

    result: dict[str, Any] = {"rows": rows, "targets": {}}
    print(f"{'op':8} {'callers':>7} {'path':12} {'ops/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'vs raw':>7} "
          f"{'CPU µs/op: client':>17} {'server':>7} {'etcd':>6} {'total':>6}")
    for r in rows:
        c = r["cpu_us_per_op"]
        print(f"{r['op']:8} {r['concurrency']:>7} {r['path']:12} {r['ops_per_s']:>9.0f} {r['p50_ms']:>8.2f} "
              f"{r['p99_ms']:>8.2f} {r['ratio_vs_raw']:>7.2f} {c['client']:>17.0f} {c.get('server', 0):>7.0f} "
              f"{c['etcd']:>6.0f} {sum(c.values()):>6.0f}")
    cell = lambda op, c, p: next(x for x in rows if x["op"] == op and x["concurrency"] == c and x["path"] == p)  # noqa: E731
    coord20, raw20 = cell("claim", 20, "coordinator"), cell("claim", 20, "raw-etcd")
    result["targets"] = {
        "min_ratio_vs_raw": min(r["ratio_vs_raw"] for r in rows if r["path"] == "coordinator"),
        "min_ratio_vs_raw_cold": min(r["ratio_vs_raw"] for r in rows if r["path"] == "coord-cold"),
        "ratio_target": 0.5,
        # The targets per cell (issue "the coordinator's hot path"): >= 0.9 x raw etcd with
        # one caller, >= 0.8 x at 20, >= 0.6 x with a cold cache.
        "ratio_at_1": min(r["ratio_vs_raw"] for r in rows if r["path"] == "coordinator" and r["concurrency"] == 1),
        "ratio_at_1_target": 0.9,
        "ratio_at_20": min(r["ratio_vs_raw"] for r in rows if r["path"] == "coordinator" and r["concurrency"] == 20),
        "ratio_at_20_target": 0.8,
        "ratio_cold_target": 0.6,
        "p99_claim_ms_at_20": coord20["p99_ms"],
        "p99_claim_ms_at_20_raw": raw20["p99_ms"],
        "p99_target_ms": 10.0,
    }
    t = result["targets"]
    print(f"min coordinator/raw ratio {t['min_ratio_vs_raw']:.2f} (target >= 0.5; cold cache "
          f"{t['min_ratio_vs_raw_cold']:.2f}); p99 claim at 20 callers {t['p99_claim_ms_at_20']:.2f} ms "
          f"(target <= 10 ms; raw etcd {t['p99_claim_ms_at_20_raw']:.2f} ms)")
    print(f"coordinator/raw: 1 caller {t['ratio_at_1']:.2f} (target >= 0.9), 20 callers {t['ratio_at_20']:.2f} "
          f"(target >= 0.8), cold cache {t['min_ratio_vs_raw_cold']:.2f} (target >= 0.6)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    asyncio.run(main())
