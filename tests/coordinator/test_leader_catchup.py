"""Leader-only work that must not depend on having watched: what changed while nobody led.

A new leader's watches start at the revision it read when it won; whatever vanished before
(a gateway's reader lease, a host's claim lease) is found by a catch-up sweep at the start
of its term (docs/design.md §3.2, §3.3).
"""
from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from baton.coordinator_client import CoordinatorClient
from baton_tools.testing.cluster import start_coordinator
from baton_tools.testing.servers import EtcdServer
from baton.v1 import coordinator_pb2 as pb
from baton.v1 import coordinator_pb2_grpc as pb_grpc
from baton.v1.runs_pb2 import RunRecord, RunStatus
from coordinator._etcd import Etcd
from coordinator._store import RunStore
from tests.conftest import assert_eventually, unique
from tests.coordinator.conftest import open_bare_session

RUNNING = RunStatus.RUN_STATUS_RUNNING


async def _readers_gone(etcd: EtcdServer, prefix: str, run_id: str) -> bool:
    store = RunStore(Etcd([etcd.endpoint]), prefix)
    try:
        return await store.reader_count(run_id, timeout=5) == 0
    finally:
        await store.etcd.close()


async def test_reader_lost_while_no_coordinator_leads_is_detached_by_the_next_leader(etcd: EtcdServer) -> None:
    prefix = f"/{unique('c')}/"
    first = await start_coordinator(etcd.endpoint, prefix, in_process=True)
    try:
        async with CoordinatorClient(first.address) as cc:
            rec, _ = await cc.create_or_resume_run(RunRecord(run_id=unique("run-"), thread_id=unique("th-")))
            unread, _ = await cc.create_or_resume_run(RunRecord(run_id=unique("run-"), thread_id=unique("th-")))
            live_rec, _ = await cc.create_or_resume_run(RunRecord(run_id=unique("run-"), thread_id=unique("th-")))
            dead = await open_bare_session(first.address, 1.0)    # a gateway that dies at once
            await cc.register_reader(rec.run_id, dead, "r-dead")
    finally:
        await first.stop()                                  # no leader from here on
    # The dead gateway's lease expires while nobody leads: no watch can report it.
    await assert_eventually(lambda: _readers_gone(etcd, prefix, rec.run_id), timeout=10)
    second = await start_coordinator(etcd.endpoint, prefix, in_process=True)
    try:
        async with CoordinatorClient(second.address) as cc:
            gw = await cc.open_session(2.0, owner="gateway-live")
            await cc.register_reader(live_rec.run_id, gw, "r-live")

            async def detached(run_id: str) -> bool:
                return (await cc.get_run(run_id)).record.HasField("detached_since")

            await assert_eventually(lambda: detached(rec.run_id), timeout=10)
            await assert_eventually(lambda: detached(unread.run_id), timeout=10)
            view = await cc.get_run(rec.run_id)
            assert view.record.status == RUNNING and not view.record.cancel_requested
            assert not await detached(live_rec.run_id)      # its reader is there: not detached
    finally:
        await second.stop()


async def test_cancelled_watch_stream_closes_its_generator_cleanly(
        etcd: EtcdServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    h = await start_coordinator(etcd.endpoint, f"/{unique('c')}/", in_process=True)
    try:
        async with CoordinatorClient(h.address) as cc:
            rec, _ = await cc.create_or_resume_run(RunRecord(run_id=unique("run-"), thread_id=unique("th-")))
        async with grpc.aio.insecure_channel(h.address) as ch:
            stub = pb_grpc.CoordinatorStub(ch)
            for _ in range(3):
                call = stub.WatchRun(pb.WatchRunRequest(run_id=rec.run_id))
                async with asyncio.timeout(5):
                    first = await call.read()
                assert first.record.run_id == rec.run_id
                call.cancel()                               # the client leaves mid-stream
    finally:
        await h.stop()                                      # waits for the handlers to end
    text = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert "already running" not in text
