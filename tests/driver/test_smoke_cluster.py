"""The host process starts, registers with its address, and refuses bad input at the edge."""
from __future__ import annotations

import grpc
import pytest

from baton.errors import JournalAttachUnavailable, RunClaimNotAcquired
from baton.grpc_errors import from_rpc_error
from baton.v1 import sandbox_host_pb2
from baton.v1.runs_pb2 import RUN_STATUS_RUNNING, AgentSpec, RunRecord
from tests.conftest import unique
from tests.driver.conftest import Cluster


async def test_hosts_register_with_address_and_providers(cluster: Cluster) -> None:
    hosts = {h.host_id: h for h in await cluster.cc.list_hosts()}
    for h in cluster.hosts:
        assert h.host_id in hosts
        info = hosts[h.host_id]
        assert info.address == h.address and not info.draining
        assert "local" in info.provider_kinds and info.capacity == 64


async def test_attach_unknown_run_is_unknown_run_at_once(cluster: Cluster) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await cluster.stub(cluster.hosts[0]).AttachRun(sandbox_host_pb2.AttachRunRequest(run_id="no-such-run"), timeout=5)
    exc = from_rpc_error(ei.value)
    assert isinstance(exc, JournalAttachUnavailable) and exc.reason == "unknown-run"


async def test_cancel_of_a_run_not_driven_here_says_not_driving(cluster: Cluster) -> None:
    r = await cluster.stub(cluster.hosts[0]).CancelRun(sandbox_host_pb2.CancelRunRequest(run_id="nope"), timeout=5)
    assert r.driving is False


async def test_attach_to_drive_a_run_still_starting_is_refused_without_a_claim(cluster: Cluster) -> None:
    """The host claims at once (no read first): the claim itself refuses a run whose input is
    not durable yet, and nothing about the run changes."""
    seeded, _ = await cluster.cc.create_or_resume_run(RunRecord(
        run_id=unique("run-"), thread_id=unique("thr-"), status=RUN_STATUS_RUNNING, starting=True,
        agent=AgentSpec(kind="replay", options_json="{}")))
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await cluster.stub(cluster.hosts[0]).AttachRun(
            sandbox_host_pb2.AttachRunRequest(run_id=seeded.run_id, purpose="drive"), timeout=10)
    exc = from_rpc_error(ei.value)
    assert isinstance(exc, RunClaimNotAcquired) and exc.reason == "starting"
    view = await cluster.cc.get_run(seeded.run_id)
    assert view.claim is None and view.record.starting and view.record.driver_epoch == seeded.driver_epoch
