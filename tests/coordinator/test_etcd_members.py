"""The coordinator's etcd client on a 3-member cluster: whichever member it
talks to dies, its next calls reach a survivor (gRPC's address list, reconnecting in
≤ 1 s), and a lease granted before keeps being refreshed."""
from __future__ import annotations

import asyncio
import pathlib
from typing import AsyncIterator

import pytest

from baton.errors import StoreUnavailable
from baton.retry import Deadline, retry
from baton_tools.testing.replicated import EtcdCluster
from coordinator import _etcd as E

pytestmark = pytest.mark.servers


@pytest.fixture
async def members(tmp_path: pathlib.Path) -> AsyncIterator[EtcdCluster]:
    c = EtcdCluster(tmp_path / "etcd")
    await asyncio.to_thread(c.start)
    try:
        yield c
    finally:
        await asyncio.to_thread(c.kill)


async def _put_get(etcd: E.Etcd, key: bytes, value: bytes, budget: float = 20.0) -> bytes:
    d = Deadline.after(budget)

    async def once() -> bytes:
        await etcd.txn([], [E.put(key, value)], timeout=d.cap(2.0))
        kvs, _ = await etcd.range(key, timeout=d.cap(2.0))
        return bytes(kvs[0].value)
    return await retry(once, deadline=d, retry_on=(StoreUnavailable,), first_pause=0.05, max_pause=0.2)


@pytest.mark.timeout(120)
async def test_each_member_killed_in_turn_the_client_reaches_a_survivor(members: EtcdCluster) -> None:
    etcd = E.Etcd(members.endpoints.split(","))
    try:
        lease, _ = await etcd.grant(30, timeout=5)
        keepalive = etcd.keepalive_stream()
        assert await _put_get(etcd, b"/members/k", b"before") == b"before"
        for i, member in enumerate(members.members):
            await asyncio.to_thread(member.kill)
            assert await _put_get(etcd, b"/members/k", f"without m{i}".encode()) == f"without m{i}".encode()
            ttl = await retry(lambda: keepalive.refresh(lease, timeout=2.0), deadline=Deadline.after(20),
                              retry_on=(StoreUnavailable,), first_pause=0.05, max_pause=0.2)
            assert ttl > 0
            await asyncio.to_thread(member.start)
            await asyncio.to_thread(members.leader)  # quorum of 3 again before the next kill
        keepalive.close()
    finally:
        await etcd.close()
