"""The coordinator client across replicas: two bugs the nemesis found.

A coordinator that ends a call as CANCELLED (the nemesis saw it when a coordinator was
restarted: its shutdown ends streams and steps down before the gRPC server stops, and the
calls then in flight came back CANCELLED): the client raises ``StoreUnavailable``, a
``BatonError`` its callers handle, never the raw ``AioRpcError``. Before, the gateway's
reader removal let it escape as an unhandled exception out of an SSE response, and its
queue sweep logged it raw.

The server here is a plain gRPC server answering the coordinator's method name with that
status: the shutdown's timing cannot be hit on purpose, the status it produced can.
"""
from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from baton.coordinator_client import CoordinatorClient
from baton.errors import BatonError, StoreUnavailable
from baton.v1.runs_pb2 import RunRecord, RunStatus
from baton_tools.testing.cluster import InProcessCoordinator
from baton_tools.testing.servers import free_port
from tests.conftest import assert_eventually, unique

pytestmark = pytest.mark.timeout(30)


async def _server_that_cancels(port: int) -> grpc.aio.Server:
    async def cancelled(request: bytes, context: Any) -> bytes:
        await context.abort(grpc.StatusCode.CANCELLED, "CANCELLED")
        return b""

    handler = grpc.method_handlers_generic_handler("baton.v1.Coordinator", {
        "UnregisterReader": grpc.unary_unary_rpc_method_handler(cancelled)})
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


async def test_a_call_the_coordinator_ends_cancelled_is_store_unavailable() -> None:
    port = free_port()
    server = await _server_that_cancels(port)
    client = CoordinatorClient(f"127.0.0.1:{port}", token="")
    try:
        with pytest.raises(StoreUnavailable, match="CANCELLED") as info:
            await client.unregister_reader("run-1", "reader-1", timeout=20)
        assert isinstance(info.value, BatonError)
    finally:
        await client.close()
        await server.stop(grace=None)


async def test_a_session_opens_through_the_second_replica_when_the_first_is_down(
        coord: InProcessCoordinator) -> None:
    """Found by the nemesis: a host restarted while the coordinator replica it dials first
    did not answer could not start at all (``OpenSession`` was tried on one replica; every
    new process starts on the first), though the other replica served."""
    dead = f"127.0.0.1:{free_port()}"  # nothing listens: UNAVAILABLE at once
    async with CoordinatorClient(f"{dead},{coord.address}", token="") as client:
        session = await client.open_session(ttl=5, owner="host-x", timeout=20)
        assert session.id and not session.lost.is_set()


async def test_a_call_that_could_not_connect_is_sent_once_the_replica_serves(
        coord: InProcessCoordinator) -> None:
    """Seen on a machine at ten times its cores: a TCP handshake to a serving coordinator
    timed out once and a one-try call (``CreateOrResumeRun``) failed with it. A call whose
    channel never connected was never sent, so the client asks again within its budget."""
    await coord.stop()  # the replica is down when the call is made
    async with CoordinatorClient(coord.address, token="") as client:
        call = asyncio.ensure_future(client.create_or_resume_run(
            RunRecord(run_id=unique("run-"), thread_id=unique("th-")), timeout=30))

        async def connect_failed() -> bool:
            channels = client._channels  # its state shows the failed connect
            assert channels and channels[0].get_state() == grpc.ChannelConnectivity.TRANSIENT_FAILURE
            assert not call.done(), call.exception()
            return True

        await assert_eventually(connect_failed, 20)
        await coord.start()
        record, created = await call
        assert created and record.status == RunStatus.RUN_STATUS_RUNNING
