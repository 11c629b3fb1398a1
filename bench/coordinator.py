"""Coordinator throughput and latency against raw etcd doing the same work, in one run.

Claims/s and record updates/s at 1 and 20 concurrent callers through the coordinator
(a real ``python -m coordinator`` subprocess, gRPC), side by side with raw ``aetcd``
transactions that do the same etcd work (the same reads, compares and puts). Targets
(issue 2): coordinator >= 0.5 x the raw etcd rate; p99 claim latency <= 10 ms at 20 callers.

Writes ``bench/results/coordinator.json``.
"""
from __future__ import annotations

import asyncio
import json
import pathlib
import statistics
import tempfile
import time
from typing import Any, Awaitable, Callable

import aetcd

from baton.coordinator_client import CoordinatorClient
from baton.testing.cluster import start_coordinator
from baton.testing.servers import EtcdServer
from baton.v1.runs_pb2 import Claim, RunRecord, RunStatus
from coordinator._keys import Keys

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "coordinator.json"
COUNTS = {1: 300, 20: 1500}  # operations per (path, op, concurrency) cell


async def _seed_runs(etcd: aetcd.Client, keys: Keys, run_ids: list[str]) -> None:
    """Create running records straight in etcd (setup, not measured)."""
    for i in range(0, len(run_ids), 50):  # etcd allows 128 ops per transaction
        ops = []
        for rid in run_ids[i : i + 50]:
            rec = RunRecord(run_id=rid, thread_id=f"th-{rid}", status=RunStatus.RUN_STATUS_RUNNING, started_at=1.0)
            ops += [etcd.transactions.put(keys.run(rid), rec.SerializeToString()),
                    etcd.transactions.put(keys.thread_active(rec.thread_id), rid.encode())]
        await etcd.transaction(compare=[], success=ops, failure=[])


async def _measure(op: Callable[[str], Awaitable[None]], run_ids: list[str], concurrency: int) -> dict[str, float]:
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
    lat = sorted(latencies)
    return {
        "ops": len(lat),
        "ops_per_s": len(lat) / elapsed,
        "p50_ms": statistics.median(lat) * 1000,
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
    }


class _Raw:
    """The coordinator's etcd work for ClaimRun / UpdateRun, done with aetcd directly."""

    def __init__(self, etcd: aetcd.Client, keys: Keys, lease: Any) -> None:
        self.etcd, self.keys, self.lease = etcd, keys, lease

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


async def _run(server: EtcdServer, tmp: pathlib.Path) -> dict[str, Any]:
    host, port = server.endpoint.rsplit(":", 1)
    coord_keys, raw_keys = Keys("/bench-coord/"), Keys("/bench-raw/")
    cp = await start_coordinator(server.endpoint, coord_keys.prefix, log_dir=tmp)
    rows: list[dict[str, Any]] = []
    try:
        async with aetcd.Client(host=host, port=int(port)) as etcd, CoordinatorClient(cp.address) as cc:
            session = await cc.open_session(60.0, owner="bench")
            lease = await etcd.lease(60)
            raw = _Raw(etcd, raw_keys, lease)

            async def coord_claim(rid: str) -> None:
                await cc.claim_run(rid, session, "bench")

            async def coord_update(rid: str) -> None:
                await cc.update_run(rid, RunRecord(sandbox_key="sb-updated"), ["sandbox_key"])

            for conc, n in COUNTS.items():
                for op in ("claim", "update"):
                    for path in ("raw-etcd", "coordinator"):
                        keys = raw_keys if path == "raw-etcd" else coord_keys
                        ids = [f"{op}-{conc}-{i}" for i in range(n)]
                        await _seed_runs(etcd, keys, ids)
                        fn = {("raw-etcd", "claim"): raw.claim, ("raw-etcd", "update"): raw.update,
                              ("coordinator", "claim"): coord_claim, ("coordinator", "update"): coord_update}[(path, op)]
                        await _measure(fn, ids[: min(20, n)], conc)  # warm-up (those runs are then used)
                        r = await _measure(fn, ids[min(20, n):] if op == "claim" else ids, conc)
                        rows.append({"op": op, "concurrency": conc, "path": path, **r})
            await session.close()
            await lease.revoke()
    finally:
        await cp.stop()

    result: dict[str, Any] = {"rows": rows, "targets": {}}
    print(f"{'op':8} {'callers':>7} {'path':12} {'ops/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'vs raw':>7}")
    for r in rows:
        base = next(x for x in rows if x["op"] == r["op"] and x["concurrency"] == r["concurrency"] and x["path"] == "raw-etcd")
        r["ratio_vs_raw"] = r["ops_per_s"] / base["ops_per_s"]
        print(f"{r['op']:8} {r['concurrency']:>7} {r['path']:12} {r['ops_per_s']:>9.0f} {r['p50_ms']:>8.2f} "
              f"{r['p99_ms']:>8.2f} {r['ratio_vs_raw']:>7.2f}")
    coord20 = next(x for x in rows if x["op"] == "claim" and x["concurrency"] == 20 and x["path"] == "coordinator")
    result["targets"] = {
        "min_ratio_vs_raw": min(r["ratio_vs_raw"] for r in rows if r["path"] == "coordinator"),
        "ratio_target": 0.5,
        "p99_claim_ms_at_20": coord20["p99_ms"],
        "p99_target_ms": 10.0,
    }
    t = result["targets"]
    print(f"min coordinator/raw ratio {t['min_ratio_vs_raw']:.2f} (target >= 0.5); "
          f"p99 claim at 20 callers {t['p99_claim_ms_at_20']:.2f} ms (target <= 10 ms)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    asyncio.run(main())
