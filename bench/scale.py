"""The control plane at volume: claims/s and failover time with 1k, 10k and 100k
stored records, each side by side with a baseline at ~0 records measured in the same run.

For each size a fresh etcd prefix is seeded straight into etcd (batch transactions) with
that many finished records of realistic size (~450 bytes, :mod:`baton_tools.testing.seed`),
and a real ``python -m coordinator`` subprocess serves it; the baseline is the same
measurement on an empty prefix, run just before. Figures:

* **claims/s**: ``ClaimRun`` of fresh running runs at 20 concurrent callers (median of
  rounds). Then again with both prefixes served at once, baseline and size round for round
  alternately (``claims_interleaved``): the fairer ratio on a shared, drifting machine.
* **failover (watch)**: a host's session is revoked with 20 runs claimed under it → every
  run claimed again by a live host. The host is a stub ``SandboxHost`` whose ``AttachRun``
  claims the run (the coordinator's part of failover, without an agent).
* **failover (fresh leader)**: the coordinator is SIGKILLed, the dying host's lease revoked,
  the coordinator started again → every run claimed again (start-up sweep included).

Target: each figure at 100k within 20% of 1k (and of the baseline). Writes
``bench/results/scale.json``. Rows of other scale benches (``bench/scale_runs.py``: many
concurrent runs across hosts) are composed in when that module exists: it must offer
``async def run() -> list[dict]`` (``BENCH_SCALE_RUNS_TOO=0``: not composed in).
``BENCH_SCALE_SIZES=1000,10000`` measures other sizes.
"""
from __future__ import annotations

import asyncio
import importlib
import json
import os
import pathlib
import statistics
import tempfile
import time
import uuid
from typing import Any

import grpc

from baton.coordinator_client import CoordinatorClient
from baton.errors import StoreUnavailable
from baton.v1 import sandbox_host_pb2, sandbox_host_pb2_grpc
from baton.v1.coordinator_pb2 import HostInfo
from baton.v1.runs_pb2 import RunRecord
from baton_tools.testing.cluster import start_coordinator
from baton_tools.testing.seed import seed, terminal_record
from baton_tools.testing.servers import EtcdServer
from coordinator import _etcd as E

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "scale.json"
SIZES = tuple(int(x) for x in os.environ.get("BENCH_SCALE_SIZES", "1000,10000,100000").split(","))
CLAIMS = 400          # runs claimed per round
CONCURRENCY = 20
ROUNDS = 2
HANDOVER_RUNS = 20
HOST_TTL = 30.0       # the stub host's session outlives a coordinator restart (slow when loaded)
DYING_TTL = 2.0


class _StubHost(sandbox_host_pb2_grpc.SandboxHostServicer):
    """``AttachRun`` = claim the run under this host's session (no agent, no log)."""

    def __init__(self, cc: CoordinatorClient, session: Any, host_id: str) -> None:
        self.cc, self.session, self.host_id = cc, session, host_id

    async def AttachRun(self, request: sandbox_host_pb2.AttachRunRequest,
                        context: grpc.aio.ServicerContext[Any, Any]) -> sandbox_host_pb2.AttachRunResponse:
        epoch, rec = await self.cc.claim_run(request.run_id, self.session, self.host_id, request.purpose or "drive")
        return sandbox_host_pb2.AttachRunResponse(epoch=epoch, record=rec)


async def _create(cc: CoordinatorClient, ids: list[str]) -> None:
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(rid: str) -> None:
        async with sem:
            await cc.create_or_resume_run(RunRecord(run_id=rid, thread_id=f"th-{rid}", tenant="acme"))

    await asyncio.gather(*(one(r) for r in ids))


async def _claims_per_s(cc: CoordinatorClient, session: Any, tag: str) -> float:
    ids = [f"{tag}-c-{uuid.uuid4().hex[:8]}-{i}" for i in range(CLAIMS)]
    await _create(cc, ids)
    queue = list(ids)

    async def worker() -> None:
        while queue:
            await cc.claim_run(queue.pop(), session, "bench")

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return CLAIMS / (time.perf_counter() - t0)


async def _all_claimed_by(cc: CoordinatorClient, ids: list[str], host_id: str, t0: float, limit: float = 120.0) -> float:
    while True:
        try:
            views = await asyncio.gather(*(cc.get_run(r, timeout=1.0) for r in ids))
            if all(v.claim is not None and v.claim.host_id == host_id for v in views):
                return time.perf_counter() - t0
        except StoreUnavailable:
            pass  # the coordinator is restarting
        if time.perf_counter() - t0 > limit:
            raise TimeoutError(f"runs not handed over within {limit} s")
        await asyncio.sleep(0.02)


async def _orphans(cc: CoordinatorClient, tag: str) -> tuple[list[str], Any]:
    """HANDOVER_RUNS running runs claimed under a session that is about to die."""
    ids = [f"{tag}-f-{uuid.uuid4().hex[:8]}-{i}" for i in range(HANDOVER_RUNS)]
    await _create(cc, ids)
    dying = await cc.open_session(DYING_TTL, owner="dying-host")
    for r in ids:
        await cc.claim_run(r, dying, "dying-host")
    return ids, dying


async def _side(server: EtcdServer, tmp: pathlib.Path, n: int) -> dict[str, Any]:
    """Every figure on a fresh prefix holding ``n`` finished records."""
    tag = f"s{uuid.uuid4().hex[:6]}"
    prefix = f"/{tag}/"
    raw = E.Etcd([server.endpoint])
    t_seed = time.perf_counter()
    now = time.time()
    for i in range(0, n, 5_000):
        await seed(raw, prefix, [terminal_record(j, tag=tag, finished_at=now - 60) for j in range(i, min(n, i + 5_000))])
    seeded = time.perf_counter() - t_seed
    coord = await start_coordinator(server.endpoint, prefix, log_dir=tmp, BATON_REAPER_INTERVAL="0",
                                    BATON_LOG_LEVEL="WARNING")
    try:
        async with CoordinatorClient(coord.address) as cc, CoordinatorClient(coord.address) as host_cc:
            host_session = await host_cc.open_session(HOST_TTL, owner="stub-host")
            stub = _StubHost(host_cc, host_session, f"stub-{tag}")
            host_server = grpc.aio.server()
            sandbox_host_pb2_grpc.add_SandboxHostServicer_to_server(stub, host_server)
            port = host_server.add_insecure_port("127.0.0.1:0")
            await host_server.start()
            try:
                await host_cc.register_host(HostInfo(host_id=stub.host_id, address=f"127.0.0.1:{port}",
                                                     capacity=1000, session_id=host_session.id))
                claimer = await cc.open_session(60.0, owner="bench")
                rates = [await _claims_per_s(cc, claimer, tag) for _ in range(ROUNDS)]
                watch = []
                for _ in range(ROUNDS):
                    ids, dying = await _orphans(cc, tag)
                    t0 = time.perf_counter()
                    await dying.close()  # revoked: its claims go at once, as a lease expiring
                    watch.append(await _all_claimed_by(cc, ids, stub.host_id, t0))
                ids, dying = await _orphans(cc, tag)
                dying_id = dying.id
                await coord.kill()
                dying.lost.set()
                await raw.revoke(dying_id, timeout=5)
                t0 = time.perf_counter()
                await coord.start()
                fresh = await _all_claimed_by(cc, ids, stub.host_id, t0)
            finally:
                await host_server.stop(None)
    finally:
        await coord.stop()
        await raw.close()
    return {"records": n, "prefix": prefix, "seed_s": round(seeded, 1), "claims_per_s": statistics.median(rates),
            "claims_per_s_rounds": [round(r, 1) for r in rates], "failover_watch_s": statistics.median(watch),
            "failover_watch_rounds": [round(w, 3) for w in watch], "failover_fresh_leader_s": fresh}


async def _claims_interleaved(server: EtcdServer, tmp: pathlib.Path, base_prefix: str, at_prefix: str,
                              rounds: int = 3) -> tuple[list[float], list[float]]:
    """claims/s on the two prefixes a row measured, round for round alternately (a
    coordinator on each, both up together): load that drifts over minutes on a shared machine
    weighs on both sides alike, which two sides measured one after the other cannot promise."""
    coords = [await start_coordinator(server.endpoint, p, log_dir=tmp, BATON_REAPER_INTERVAL="0",
                                      BATON_LOG_LEVEL="WARNING") for p in (base_prefix, at_prefix)]
    out: tuple[list[float], list[float]] = ([], [])
    try:
        async with CoordinatorClient(coords[0].address) as c0, CoordinatorClient(coords[1].address) as c1:
            ccs = (c0, c1)
            sessions = [await c.open_session(60.0, owner="bench") for c in ccs]
            for i in range(rounds):
                for side in ((0, 1) if i % 2 == 0 else (1, 0)):  # ABBA...: neither side always first
                    out[side].append(await _claims_per_s(ccs[side], sessions[side], f"i{i}"))
    finally:
        for c in coords:
            await c.stop()
    return out


async def rows(server: EtcdServer, tmp: pathlib.Path, sizes: tuple[int, ...] = SIZES) -> list[dict[str, Any]]:
    """One row per size: its figures and the baseline's (~0 records) measured just before."""
    out = []
    for n in sizes:
        base = await _side(server, tmp, 0)
        at = await _side(server, tmp, n)
        base_i, at_i = await _claims_interleaved(server, tmp, base["prefix"], at["prefix"])
        row = {"records": n, "baseline": base, "at": at,
               "claims_ratio": at["claims_per_s"] / base["claims_per_s"],
               "claims_interleaved": {"baseline_rounds": [round(x, 1) for x in base_i],
                                      "at_rounds": [round(x, 1) for x in at_i],
                                      "ratio": statistics.median(at_i) / statistics.median(base_i)},
               "failover_watch_ratio": at["failover_watch_s"] / base["failover_watch_s"],
               "failover_fresh_ratio": at["failover_fresh_leader_s"] / base["failover_fresh_leader_s"]}
        out.append(row)
        RESULTS.parent.mkdir(parents=True, exist_ok=True)  # partial, in case a later size fails
        RESULTS.write_text(json.dumps({"bench": "scale", "partial": True, "rows": out}, indent=2) + "\n")
        print(f"{n:>7} records: claims/s {at['claims_per_s']:7.0f} (baseline {base['claims_per_s']:7.0f}, "
              f"x{row['claims_ratio']:.2f}); failover watch {at['failover_watch_s'] * 1000:6.0f} ms "
              f"(baseline {base['failover_watch_s'] * 1000:6.0f} ms); fresh leader "
              f"{at['failover_fresh_leader_s']:.2f} s (baseline {base['failover_fresh_leader_s']:.2f} s); "
              f"claims/s interleaved x{row['claims_interleaved']['ratio']:.2f}", flush=True)
    return out


async def main() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="baton-bench-") as tmp:
        server = EtcdServer(pathlib.Path(tmp))
        server.start()
        try:
            table = await rows(server, pathlib.Path(tmp))
        finally:
            server.kill()
    first, last = table[0]["at"], table[-1]["at"]
    result: dict[str, Any] = {"bench": "scale", "rows": table, "targets": {
        "claims_100k_vs_1k": last["claims_per_s"] / first["claims_per_s"],
        "failover_watch_100k_vs_1k": last["failover_watch_s"] / first["failover_watch_s"],
        "failover_fresh_100k_vs_1k": last["failover_fresh_leader_s"] / first["failover_fresh_leader_s"],
        "flat_within": 0.2}}
    try:  # many concurrent runs across hosts (another module; composed in when present)
        scale_runs = importlib.import_module("bench.scale_runs") if os.environ.get("BENCH_SCALE_RUNS_TOO", "1") != "0" else None
    except ModuleNotFoundError:
        scale_runs = None
    if scale_runs is not None and hasattr(scale_runs, "run"):
        result["runs"] = await scale_runs.run()
    t = result["targets"]
    print(f"100k vs 1k: claims/s x{t['claims_100k_vs_1k']:.2f}, failover (watch) x{t['failover_watch_100k_vs_1k']:.2f}, "
          f"failover (fresh leader) x{t['failover_fresh_100k_vs_1k']:.2f} (target: within 20%)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    asyncio.run(main())
