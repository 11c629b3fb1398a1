"""Seed a coordinator's etcd prefix with many run records at once (tests and bench/scale.py).

Records are written straight into etcd in batch transactions, as the coordinator lays them
out (:mod:`coordinator._keys`), so a store of 100,000 records takes seconds, not the hours
100,000 real runs would. A seeded record is "realistic": about 450 bytes, as a run of the
``claude-code`` agent with options, usage and a sandbox key (the size at which an unpaged
range of 8,000 to 10,000 records passes gRPC's 4 MiB limit).
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Sequence

from baton.v1.runs_pb2 import AgentSpec, RunRecord, RunStatus, Usage
from coordinator import _etcd as E
from coordinator import rules
from coordinator._indexes import INDEXES_VERSION
from coordinator._keys import Keys

COMPLETED = RunStatus.RUN_STATUS_COMPLETED
RUNNING = RunStatus.RUN_STATUS_RUNNING
#: Records per seeding transaction (up to nine puts each; etcd allows 128 ops).
PER_TXN = 12
#: Transactions in flight at once: etcd commits concurrent ones together (one fsync).
IN_FLIGHT = 32


def terminal_record(i: int, *, tag: str, finished_at: float, tenant: str = "acme") -> RunRecord:
    """The ``i``-th seeded terminal record (``completed``), ~450 bytes serialized."""
    options = {"model": "claude-sonnet-4", "permission_mode": "acceptEdits", "max_turns": 40,
               "allowed_tools": ["Bash", "Edit", "Read", "Write", "Glob", "Grep"],
               "system_prompt": "You are a careful engineer. Keep changes small and tested."}
    return RunRecord(
        run_id=f"{tag}-run-{i:07d}", thread_id=f"{tag}-thr-{i:07d}", status=COMPLETED,
        started_at=finished_at - 120.0, finished_at=finished_at, tenant=tenant,
        usage=Usage(input_tokens=123_456, output_tokens=7_890),
        sandbox_key=f"sbx-{tag}-{i:07d}-0123456789abcdef", driver_epoch=2, driver_host="host-0123456789",
        agent=AgentSpec(kind="claude-code", options_json=json.dumps(options)))


def running_record(i: int, *, tag: str, tenant: str = "acme", driver_host: str = "host-seeded") -> RunRecord:
    """The ``i``-th seeded running record (claimed once, input durable)."""
    return RunRecord(run_id=f"{tag}-live-{i:05d}", thread_id=f"{tag}-lthr-{i:05d}", status=RUNNING,
                     started_at=time.time(), tenant=tenant, driver_epoch=1, driver_host=driver_host,
                     agent=AgentSpec(kind="replay", options_json="{}"))


def _ops(keys: Keys, rec: RunRecord, indexed: bool) -> list[E.Op]:
    ops = [E.put(keys.run(rec.run_id), rec.SerializeToString(deterministic=True)),
           E.put(keys.thread_run(rec.thread_id, rec.run_id), b""),
           E.put(keys.thread_tenant(rec.thread_id), rec.tenant.encode())]
    if rec.status == RUNNING:
        ops.append(E.put(keys.thread_active(rec.thread_id), rec.run_id.encode()))
    if indexed:
        ops += rules.backfill_indexes(keys, rec)
    return ops


async def seed(etcd: E.Etcd, prefix: str, recs: Sequence[RunRecord], *, indexed: bool = True,
               timeout: float = 30.0) -> None:
    """Write ``recs`` with their thread entries (and live/ended/started index entries when
    ``indexed``; without, the store looks like one written before those indexes)."""
    keys = Keys(prefix)
    slots = asyncio.Semaphore(IN_FLIGHT)

    async def one(batch: Sequence[RunRecord]) -> None:
        async with slots:
            await etcd.txn([], [op for rec in batch for op in _ops(keys, rec, indexed)], timeout=timeout)

    await asyncio.gather(*(one(recs[i : i + PER_TXN]) for i in range(0, len(recs), PER_TXN)))
    if indexed:
        await etcd.txn([], [E.put(keys.indexes_marker, INDEXES_VERSION)], timeout=timeout)
