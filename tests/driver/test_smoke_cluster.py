"""The host process starts, registers with its address, and refuses bad input at the edge."""
from __future__ import annotations

import grpc
import pytest

from baton.errors import JournalAttachUnavailable
from baton.grpc_errors import from_rpc_error
from baton.v1 import sandbox_host_pb2
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
