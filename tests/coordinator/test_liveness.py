"""Fast failover on one in-process coordinator and a real etcd: which ends of a
keep-alive stream revoke the session. Processes and SIGKILL: tests/faults/test_blink.py."""
from __future__ import annotations

import asyncio

import pytest

from baton.coordinator_client import CoordinatorClient
from baton_tools.testing.cluster import InProcessCoordinator
from baton_tools.testing.servers import free_port
from coordinator._liveness import Verdict, probe
from tests.conftest import assert_eventually


def _refusing_address() -> str:
    """A loopback port nothing listens on (free, and outside the ephemeral range)."""
    return f"127.0.0.1:{free_port()}"


async def _listener() -> tuple[asyncio.Server, str]:
    srv = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    return srv, f"127.0.0.1:{srv.sockets[0].getsockname()[1]}"


@pytest.mark.unit
async def test_probe_verdicts() -> None:
    srv, alive = await _listener()
    async with srv:
        assert await probe(alive) is Verdict.ALIVE
    assert await probe(_refusing_address()) is Verdict.GONE
    assert await probe("not an address") is Verdict.UNKNOWN
    assert await probe("no-such-host.invalid:80", timeout=2.0) is Verdict.UNKNOWN
    # A client's probe_address is free text: a port out of range is not definite either
    # (it raised OverflowError out of the arming task).
    for bad in ("127.0.0.1:70000", "127.0.0.1:-1", "[::1]:99999999999999999999", "\x00:1", ":1"):
        assert await probe(bad) is Verdict.UNKNOWN, bad


def _drop_stream(session: object) -> None:
    """End the keep-alive stream without CloseSession, as a process that died does (the
    client's own ``lost`` fires; the lease is the coordinator's to judge)."""
    session._task.cancel()  # type: ignore[attr-defined]


async def _lease_ttl(coord: InProcessCoordinator, session_id: int) -> int:
    return await coord.server.etcd.time_to_live(session_id, timeout=5)  # type: ignore[no-any-return]


async def test_a_dead_process_is_revoked_and_a_live_one_is_not(coord: InProcessCoordinator) -> None:
    ff = coord.server.fast_failover
    srv, alive = await _listener()
    async with CoordinatorClient(coord.address, token="") as cc:
        live = await cc.open_session(ttl=30, owner="live", probe_address=alive)
        dead = await cc.open_session(ttl=30, owner="dead", probe_address=_refusing_address())
        gone_listener, later_dead = await _listener()
        dying = await cc.open_session(ttl=30, owner="dying", probe_address=later_dead)
        # Armed: a connect there succeeded once (not for "dead", whose address never answered).
        await assert_eventually(lambda: sum(ff.outcomes.values()) == 0 and ff.armed >= 2)
        gone_listener.close()
        await gone_listener.wait_closed()
        for s in (live, dead, dying):
            _drop_stream(s)
        await assert_eventually(lambda: ff.outcomes["revoked"] == 1 and ff.outcomes["alive"] == 1)
        assert await _lease_ttl(coord, dying.id) == -1  # revoked at once, not after 30 s
        assert await _lease_ttl(coord, live.id) > 0  # alive: the TTL decides
        assert await _lease_ttl(coord, dead.id) > 0  # never armed: the TTL decides
    srv.close()
    await srv.wait_closed()


async def test_a_stream_that_is_no_longer_the_keeper_does_not_revoke(coord: InProcessCoordinator) -> None:
    """The process reconnected its keep-alive (to any replica) since: its new stream wrote
    its own token, so the old stream's judgement, even on a refused connect, revokes nothing."""
    ff = coord.server.fast_failover
    srv, alive = await _listener()
    async with CoordinatorClient(coord.address, token="") as cc:
        s = await cc.open_session(ttl=30, owner="moved", probe_address=alive)
        await assert_eventually(lambda: ff.armed >= 1)
        await ff.judge(b"an-older-stream", s.id, _refusing_address())
        assert ff.outcomes["moved"] == 1
        assert await _lease_ttl(coord, s.id) > 0
    srv.close()
    await srv.wait_closed()


async def test_a_lease_that_is_not_a_session_is_never_revoked_for_a_caller(coord: InProcessCoordinator) -> None:
    """A keep-alive (or CloseSession) naming a lease id that is not a session's (the
    election's, a cancel intent's: lease ids are guessable) must neither refresh it nor get
    it revoked."""
    from baton import internal_auth
    from baton.v1 import coordinator_pb2 as cpb
    from baton.v1 import coordinator_pb2_grpc

    ff = coord.server.fast_failover
    other, _ = await coord.server.etcd.grant(30, timeout=5)  # someone else's lease
    srv, alive = await _listener()
    async with CoordinatorClient(coord.address, token="") as cc:
        marker = await cc.open_session(ttl=30, owner="marker", probe_address=alive)
        await assert_eventually(lambda: ff.armed >= 1)  # the real session arms (calibration)
        armed_before = ff.armed
        async with internal_auth.insecure_channel(coord.address, token="") as ch:
            stub = coordinator_pb2_grpc.CoordinatorStub(ch)
            call = stub.KeepAlive()
            for _ in range(3):
                await call.write(cpb.KeepAliveRequest(session_id=other, probe_address=alive))
                # Not refreshed either: a keep-alive cannot hold another lease up forever.
                assert (await call.read()).ttl_seconds == 0
            # An (unwanted) arming would be a background task spawned before the answer was
            # written: wait for every such task to end, then nothing may have been armed.
            await assert_eventually(lambda: not ff._tasks)
            assert ff.armed == armed_before
            srv.close()
            await srv.wait_closed()
            call.cancel()  # the stream breaks and the probe address now refuses
            await stub.CloseSession(cpb.CloseSessionRequest(session_id=other))
        assert 0 < await _lease_ttl(coord, other) <= 30
        await marker.close()  # a real session still closes (CloseSession revokes it)
        assert await _lease_ttl(coord, marker.id) == -1


async def test_a_process_that_listens_after_its_session_opened_is_armed_before_the_next_refresh(
        coord: InProcessCoordinator) -> None:
    """A gateway opens its session before its server listens (uvicorn binds after the app's
    start-up): the refused arming connect is tried again within moments, not at the next
    refresh a third of the TTL later, so a process that dies early is still revoked at once."""
    ff = coord.server.fast_failover
    address = _refusing_address()
    host, port = address.rsplit(":", 1)
    async with CoordinatorClient(coord.address, token="") as cc:
        s = await cc.open_session(ttl=90, owner="late-listener", probe_address=address)  # refresh every 30 s
        await assert_eventually(lambda: ff._tasks)  # its arming began, and was refused
        assert ff.armed == 0
        srv = await asyncio.start_server(lambda r, w: w.close(), host, int(port))
        try:
            await assert_eventually(lambda: ff.armed == 1, timeout=20)  # well before the refresh at 30 s
        finally:
            srv.close()
            await srv.wait_closed()
        _drop_stream(s)  # now it dies: the refused connect is definite
        await assert_eventually(lambda: ff.outcomes["revoked"] == 1)
        assert await _lease_ttl(coord, s.id) == -1


async def test_a_listener_that_outlives_the_stream_for_a_moment_is_still_revoked(coord: InProcessCoordinator) -> None:
    """A process being killed closes its files in order: its keep-alive connection (opened
    before it listened) ends while its listening socket still accepts for a moment. The
    connect made then is accepted; the coordinator probes again shortly, meets the refusal,
    and revokes (one accepted connect used to leave the runs to the TTL)."""
    ff = coord.server.fast_failover
    accepted = asyncio.Event()

    def on_connect(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        accepted.set()
        w.close()

    srv = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    address = f"127.0.0.1:{srv.sockets[0].getsockname()[1]}"
    async with CoordinatorClient(coord.address, token="") as cc:
        s = await cc.open_session(ttl=90, owner="dying-slowly", probe_address=address)
        await assert_eventually(lambda: ff.armed == 1)
        accepted.clear()  # the arming connect
        _drop_stream(s)
        await assert_eventually(accepted.is_set)  # the judge's first connect: accepted
        srv.close()  # the listener goes after the stream
        await srv.wait_closed()
        await assert_eventually(lambda: ff.outcomes["revoked"] == 1)
        assert ff.outcomes["revoked-after-recheck"] == 1
        assert await _lease_ttl(coord, s.id) == -1
