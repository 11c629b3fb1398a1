"""Two stores (two gateways, or two workers of one) writing and reading one Durable Stream on
a real nats-server: a view behind the other's writes catches up from its last sequence (the
same view, never folded again whole), and every read from either is whole and in order."""
from __future__ import annotations

import asyncio
import functools

import nats
import pytest

from gateway.durable_streams._store import StoreConfig, StreamStore
from tests.conftest import assert_eventually, unique

pytestmark = pytest.mark.timeout(120)


async def test_a_view_catches_up_with_the_other_stores_writes_without_a_new_fold(nats: object) -> None:
    url = nats.url  # type: ignore[attr-defined]
    cfg = StoreConfig(stream=unique("DS").upper(), subject_prefix=unique("ds"))
    conns = [await nats_connect(url) for _ in range(2)]
    a, b = (StreamStore(nc, cfg) for nc in conns)
    try:
        for s in (a, b):
            await s.start()
        path = "/" + unique("s")
        await a.create(path, {"contentType": "text/plain"}, b"")
        view_b = await b.get(path)
        assert view_b is not None
        sent: list[bytes] = []
        for i in range(40):  # alternating writers, as a worker pair takes one client's appends
            data = f"{i:03d}".encode()
            await (a if i % 2 == 0 else b).append(path, data, content_type="text/plain", seq=None,
                                                  producer=None, close=False)
            sent.append(data)
            for s in (a, b):  # the writer's at once; the other's once it heard of the write
                await assert_eventually(functools.partial(whole, s, path, list(sent)), timeout=30)
        assert await b.get(path) is view_b  # caught up in place: never dropped and folded anew
        # A reader waiting in one store wakes for a write through the other.
        st = await b.get(path)
        assert st is not None
        waiting = asyncio.create_task(b.wait(st, 30))
        await a.append(path, b"end", content_type="text/plain", seq=None, producer=None, close=True)
        assert await waiting

        async def b_has_it() -> bool:
            cur = await b.get(path)
            assert cur is not None and cur.closed and cur.messages[-1].data == b"end"
            return True

        await assert_eventually(b_has_it, timeout=30)
    finally:
        for s in (a, b):
            await s.stop()
        for nc in conns:
            await nc.close()


async def nats_connect(url: str) -> nats.NATS:
    return await nats.connect(url, no_echo=True)


async def whole(store: StreamStore, path: str, sent: list[bytes]) -> bool:
    st = await store.get(path)
    assert st is not None and [m.data for m in store.read(st, "-1")] == sent
    return True
