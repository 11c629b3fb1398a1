"""Internal channels to a multi-address target spread their calls (baton/internal_auth.py
``balanced``): what lets hosts and gateways use every coordinator replica behind a headless
Kubernetes Service (``BATON_COORDINATOR=dns:///baton-coordinator-headless:7100``) instead of
all sticking to the first address, as gRPC's default pick_first does."""
from __future__ import annotations

from typing import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from baton import internal_auth
from baton_tools.testing.servers import free_port

pytestmark = pytest.mark.servers  # real gRPC servers on loopback ports


@pytest.fixture
async def two_replicas() -> AsyncIterator[str]:
    """Two servers on one port of two loopback addresses; their health answers tell them apart."""
    port = free_port()
    servers = []
    for ip, status in (("127.0.0.1", health_pb2.HealthCheckResponse.SERVING),
                       ("127.0.0.2", health_pb2.HealthCheckResponse.NOT_SERVING)):
        server = grpc.aio.server()
        servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]  # grpc_health stubs lack .aio
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        assert server.add_insecure_port(f"{ip}:{port}") == port
        await server.start()
        await servicer.set("", status)
        servers.append(server)
    try:
        yield f"ipv4:127.0.0.1:{port},127.0.0.2:{port}"
    finally:
        for server in servers:
            await server.stop(None)


async def _answers(channel: grpc.aio.Channel, calls: int) -> set[int]:
    stub = health_pb2_grpc.HealthStub(channel)
    seen = set()
    for _ in range(calls):
        r = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5, wait_for_ready=True)
        seen.add(r.status)
    return seen


async def test_calls_on_a_multi_address_target_reach_every_replica(two_replicas: str) -> None:
    async with internal_auth.insecure_channel(two_replicas, token="") as ch:
        assert await _answers(ch, 20) == {health_pb2.HealthCheckResponse.SERVING,
                                          health_pb2.HealthCheckResponse.NOT_SERVING}


async def test_without_it_every_call_goes_to_the_first_address(two_replicas: str) -> None:
    # The baseline this fixes: gRPC's default policy on the same target.
    async with grpc.aio.insecure_channel(two_replicas) as ch:
        assert await _answers(ch, 20) == {health_pb2.HealthCheckResponse.SERVING}


def test_a_single_server_keeps_the_default_policy() -> None:
    assert internal_auth.balanced("baton-coordinator:7100", ()) == []
    assert internal_auth.balanced("dns:///baton-coordinator-headless:7100", ()) == [internal_auth.ROUND_ROBIN]
