"""Faults: etcd unreachable or frozen, etcd restart, coordinator restart, SIGTERM."""
from __future__ import annotations

import asyncio
import signal
import time

import grpc
import pytest

from baton import errors
from baton.coordinator_client import CoordinatorClient, SandboxInstance
from baton_tools.testing.cluster import CoordinatorProcess, start_coordinator
from baton_tools.testing.servers import EtcdServer, free_port
from baton.v1 import coordinator_pb2 as pb
from baton.v1 import coordinator_pb2_grpc as pb_grpc
from baton.v1.runs_pb2 import RunRecord, RunStatus
from tests.conftest import assert_eventually, assert_throughout, freeze, unique


@pytest.mark.parametrize("fault", ["killed", "frozen"])
async def test_etcd_unreachable_answers_unavailable_within_the_deadline(own_etcd: EtcdServer, fault: str) -> None:
    h = await start_coordinator(own_etcd.endpoint, f"/{unique()}/", in_process=True)
    try:
        async with CoordinatorClient(h.address) as cc:
            await cc.create_or_resume_run(RunRecord(run_id="r1", thread_id="t1"))
            assert own_etcd.proc is not None
            if fault == "killed":
                await asyncio.to_thread(own_etcd.kill)
            else:
                await freeze(own_etcd.proc)   # open sockets, no answers: the hang case
            try:
                for call in (lambda: cc.get_run("r1", timeout=1.0),
                             lambda: cc.claim_run("r1", 1, "h", timeout=1.0),
                             lambda: cc.update_run("r1", RunRecord(sandbox_key="x"), ["sandbox_key"], timeout=1.0),
                             lambda: cc.open_session(2.0, timeout=1.0)):
                    t0 = time.monotonic()
                    with pytest.raises(errors.StoreUnavailable):
                        await call()
                    assert time.monotonic() - t0 < 1.5
                # Raw gRPC: the coordinator itself answers UNAVAILABLE before the deadline.
                async with grpc.aio.insecure_channel(h.address) as ch:
                    with pytest.raises(grpc.aio.AioRpcError) as ei:
                        await pb_grpc.CoordinatorStub(ch).GetRun(pb.GetRunRequest(run_id="r1"), timeout=1.0)
                    assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
            finally:
                if fault == "frozen":
                    own_etcd.proc.send_signal(signal.SIGCONT)
    finally:
        await h.stop()


async def test_etcd_restart_loses_nothing(own_etcd: EtcdServer) -> None:
    h = await start_coordinator(own_etcd.endpoint, f"/{unique()}/", in_process=True)
    try:
        async with CoordinatorClient(h.address) as cc:
            s = await cc.open_session(5.0, owner="host-a")
            recs = {}
            for i in range(5):
                rec, _ = await cc.create_or_resume_run(RunRecord(run_id=f"r{i}", thread_id=f"t{i}", sandbox_key=f"sb{i}"))
                recs[rec.run_id] = rec
            epoch, recs["r0"] = await cc.claim_run("r0", s, "host-a")
            _, recs["r1"] = await cc.update_run("r1", RunRecord(detached_since=10.0), ["detached_since"])  # type: ignore[assignment]
            sb = SandboxInstance(sandbox_key="sb0", provider="local", handle_json="{}", run_id="r0")
            await cc.put_sandbox(sb)

            await asyncio.to_thread(own_etcd.restart)

            async def all_back() -> bool:
                try:
                    return all([(await cc.get_run(r, timeout=2)).record == rec for r, rec in recs.items()])
                except errors.StoreUnavailable:
                    return False
            await assert_eventually(all_back, timeout=20)
            view = await cc.get_run("r0")
            assert view.claim is not None and view.claim.epoch == epoch and view.claim.session_id == s.id
            assert await cc.get_sandbox("sb0") == sb
            assert (await cc.find_active_run("t2")).run_id == "r2"  # type: ignore[union-attr]
            assert [r.run_id for r in await cc.list_reclaimable(now=100.0, ttl=1.0)] == ["r1"]
            assert not s.lost.is_set()
            # The session still works after the restart: a new claim, and a release.
            e2, _ = await cc.claim_run("r3", s, "host-a")
            assert e2 == 1 and await cc.release_claim("r0", s, epoch)
    finally:
        await h.stop()


async def test_coordinator_restart_keeps_sessions_and_claims(etcd: EtcdServer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cp = await start_coordinator(etcd.endpoint, f"/{unique()}/", log_dir=tmp_path)
    assert isinstance(cp, CoordinatorProcess)
    try:
        async with CoordinatorClient(cp.address) as cc:
            rec, _ = await cc.create_or_resume_run(RunRecord(run_id="r1", thread_id="t1"))
            # The TTL must outlast the restart (a graceful stop, then a new Python process
            # serving again): with one replica nothing refreshes the lease meanwhile, so etcd
            # rightly expires it when the restart takes longer. The client retries every
            # 0.1 s and reconnects within 1 s of the port answering (its reconnect backoff
            # is capped); the restart itself took 10 s and more on two cores at load 10-20.
            s = await cc.open_session(30.0, owner="host-a")
            epoch, _ = await cc.claim_run("r1", s, "host-a")
            await cp.restart()
            assert cp.proc is not None

            async def claim_is_ours() -> None:
                view = await cc.get_run("r1")
                assert view.claim is not None and view.claim.session_id == s.id and view.claim.epoch == epoch
                assert not s.lost.is_set()
            # Longer than the TTL after the restart: only a working keep-alive explains it.
            await assert_throughout(claim_is_ours, s.ttl + 1.0)
            outcome, out = await cc.update_run("r1", RunRecord(status=RunStatus.RUN_STATUS_COMPLETED), ["status"],
                                               epoch=epoch, session_id=s)
            assert out is not None and out.status == RunStatus.RUN_STATUS_COMPLETED
    finally:
        await cp.stop()
    assert cp.proc is not None and cp.proc.returncode == 0          # SIGTERM: graceful exit
    assert "Traceback" not in cp.log_path.read_text()


async def test_client_fails_over_between_replicas(etcd: EtcdServer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    prefix = f"/{unique()}/"
    a = await start_coordinator(etcd.endpoint, prefix, in_process=True)
    b = await start_coordinator(etcd.endpoint, prefix, in_process=True)
    try:
        async with CoordinatorClient([a.address, b.address]) as cc:
            await cc.create_or_resume_run(RunRecord(run_id="r1", thread_id="t1"))
            s = await cc.open_session(3.0)
            epoch, _ = await cc.claim_run("r1", s, "h")
            await a.kill()
            # Reads retry on the other replica; the session's keep-alive moves there too.
            await assert_throughout(lambda: _claim_held(cc, s.id), s.ttl + 1.0)
    finally:
        await a.stop()
        await b.stop()


async def test_concurrent_failures_on_a_dead_replica_all_go_to_the_live_one(etcd: EtcdServer) -> None:
    # Several callers fail on the dead replica at once (reads, a session's keep-alive): each
    # must move on to the live one. A shared cursor that every failure advanced sent every
    # second caller back to the dead replica for its retry (seen as a flaky failover test).
    prefix = f"/{unique()}/"
    b = await start_coordinator(etcd.endpoint, prefix, in_process=True)
    dead = f"127.0.0.1:{free_port()}"
    try:
        async with CoordinatorClient(b.address) as direct:
            await direct.create_or_resume_run(RunRecord(run_id="r1", thread_id="t1"))
        for _ in range(3):  # a new client starts on the first (dead) replica
            async with CoordinatorClient([dead, b.address]) as cc:
                views = await asyncio.gather(*(cc.get_run("r1") for _ in range(8)))
                assert [v.record.run_id for v in views] == ["r1"] * 8
    finally:
        await b.stop()


async def _claim_held(cc: CoordinatorClient, sid: int) -> None:
    view = await cc.get_run("r1")
    assert view.claim is not None and view.claim.session_id == sid
