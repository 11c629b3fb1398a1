"""The fuzz suite's judges catch what they are there to catch: a change to the seeded data,
a dropped connection, a cut body, an answer that never comes. (A judge that never fails
would make every fuzz run green.)"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator, Awaitable, Callable

import pytest

from tests.fuzz._raw_http import Request, exchange
from tests.fuzz.conftest import Names, World, assert_unchanged

NAMES = Names("oracle")

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[int]]]:
    """``port = await serve(handler)``: a raw TCP server on a free port, closed at the end."""
    servers: list[asyncio.Server] = []

    async def start(handler: Handler) -> int:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    yield start
    for s in servers:
        s.close()
        await s.wait_closed()


async def test_exchange_reports_drops_cut_bodies_and_silence(serve: Callable[[Handler], Awaitable[int]]) -> None:
    async def drop(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        w.close()

    async def cut(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
        await w.drain()
        w.close()

    silent_done = asyncio.Event()

    async def silent(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await silent_done.wait()
        w.close()

    async def fine(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        w.write(b"HTTP/1.1 404 Not Found\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
        await w.drain()
        w.close()

    req = Request("GET", b"/x")
    for handler in (drop, cut):
        out = await exchange(await serve(handler), req, timeout=5, stream_grace=1)
        assert not out.complete and out.error.startswith("dropped"), (handler.__name__, out)
    out = await exchange(await serve(silent), req, timeout=0.3, stream_grace=1)
    assert not out.complete and out.error == "timeout"
    silent_done.set()
    out = await exchange(await serve(fine), req, timeout=5, stream_grace=1)
    assert out.complete and (out.status, out.body) == (404, b"abc")


async def test_the_snapshot_sees_a_change_to_the_seeded_data(world: World) -> None:
    before = await world.snapshot()
    await assert_unchanged(world, before)
    r = await world.http.post(f"{world.auth.url}/ds{world.streams[0]}", content=b"more", headers={
        **world.owner(), "Content-Type": "application/octet-stream"})
    assert r.status_code == 204
    with pytest.raises(AssertionError, match="stored data changed"):
        await assert_unchanged(world, before)

