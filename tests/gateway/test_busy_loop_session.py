"""A busy event loop does not cost a host its session (docs/operating.md "Overload"): the
lease is refreshed from a thread and channel of its own (:mod:`baton.keepalive`).

Real coordinator subprocess and etcd. The event loop is kept busy (pure Python work, as a
burst of starts makes it) for twice the lease's TTL: a session refreshed from the loop loses
its lease, one refreshed from its own thread does not.
"""
from __future__ import annotations

import time
from typing import Any

from baton.coordinator_client import CoordinatorClient
from baton.v1 import coordinator_pb2
from tests.conftest import assert_eventually

TTL = 2


def _busy(seconds: float) -> float:
    """Hold the event loop with pure Python work for ``seconds``; returns when it ended."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return time.monotonic()


async def test_a_busy_loop_keeps_a_session_refreshed_from_its_own_thread(coordinator: Any) -> None:
    async with CoordinatorClient(coordinator.address) as cc:
        threaded = await cc.open_session(ttl=TTL, owner="busy-threaded", own_thread=True)
        plain = await cc.open_session(ttl=TTL, owner="busy-plain")
        try:
            freed = _busy(2 * TTL)
            # The loop is free again: the plain session finds its lease gone; the threaded one
            # is refreshed after the busy spell and holds.
            await assert_eventually(lambda: plain.lost.is_set(), timeout=3 * TTL)
            await assert_eventually(lambda: threaded._thread._last_ok > freed, timeout=3 * TTL)
            assert not threaded.lost.is_set()
        finally:
            await threaded.close()
            await plain.close()
        assert threaded.lost.is_set()  # closed: its lease revoked


async def test_a_threaded_session_reports_its_lease_gone(coordinator: Any) -> None:
    """When the coordinator revokes the lease, the thread says so on the loop."""
    async with CoordinatorClient(coordinator.address) as cc:
        s = await cc.open_session(ttl=TTL, owner="revoked", own_thread=True)
        await cc._unary("CloseSession", coordinator_pb2.CloseSessionRequest(session_id=s.id), 5)
        await assert_eventually(lambda: s.lost.is_set(), timeout=3 * TTL)
        await s.close()
