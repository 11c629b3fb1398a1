"""Coordinator test fixtures: an in-process coordinator on the shared etcd, per test prefix."""
from __future__ import annotations

from typing import AsyncIterator

import pytest

from baton.coordinator_client import CoordinatorClient
from baton_tools.testing.cluster import InProcessCoordinator, start_coordinator
from baton_tools.testing.servers import EtcdServer
from tests.conftest import unique


@pytest.fixture
async def coord(etcd: EtcdServer) -> AsyncIterator[InProcessCoordinator]:
    """A coordinator in this event loop, isolated by a unique etcd prefix."""
    h = await start_coordinator(etcd.endpoint, f"/{unique('c')}/", in_process=True)
    assert isinstance(h, InProcessCoordinator)
    try:
        yield h
    finally:
        await h.stop()


@pytest.fixture
async def cc(coord: InProcessCoordinator) -> AsyncIterator[CoordinatorClient]:
    """A client of :func:`coord` (closes its sessions at the end)."""
    async with CoordinatorClient(coord.address) as client:
        yield client


async def open_bare_session(address: str, ttl: float = 2.0) -> int:
    """Open a session over raw gRPC and never keep it alive: a host that died at once."""
    import grpc

    from baton.v1 import coordinator_pb2 as pb
    from baton.v1 import coordinator_pb2_grpc as pb_grpc

    async with grpc.aio.insecure_channel(address) as ch:
        r = await pb_grpc.CoordinatorStub(ch).OpenSession(pb.OpenSessionRequest(ttl_seconds=ttl), timeout=5)
    return int(r.session_id)
