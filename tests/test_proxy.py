"""The TCP proxy of the fault suite: forwards, cuts, and refuses while down."""
from __future__ import annotations

import asyncio

import pytest

from baton_tools.testing.proxy import TcpProxy
from tests.conftest import assert_throughout


async def _echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    while data := await r.read(1024):
        w.write(data)
        await w.drain()
    w.close()


async def _roundtrip(port: int, payload: bytes) -> bytes:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    try:
        w.write(payload)
        await w.drain()
        async with asyncio.timeout(5):
            return await r.read(1024)
    finally:
        w.close()


@pytest.mark.timeout(20)
async def test_blip_resets_open_connections_refuses_new_ones_then_forwards() -> None:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    proxy = await TcpProxy(server.sockets[0].getsockname()[1]).start()
    try:
        assert await _roundtrip(proxy.port, b"before") == b"before"
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        w.write(b"open")
        assert await r.readexactly(4) == b"open"  # forwarded end to end
        blip = asyncio.create_task(proxy.blip(0.5))
        await asyncio.sleep(0)  # the blip has begun: down, every connection aborted
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            async with asyncio.timeout(5):
                await r.readexactly(1)
        w.close()
        with pytest.raises(ConnectionResetError):   # accepted and reset at once
            await _roundtrip(proxy.port, b"during")
        await blip
        assert await _roundtrip(proxy.port, b"after") == b"after"
    finally:
        await proxy.close()
        server.close()
        await server.wait_closed()


@pytest.mark.timeout(20)
async def test_hold_keeps_one_direction_s_bytes_until_released_in_order() -> None:
    """A one-way partition: ``hold("down")`` lets the request reach the server and keeps its
    answer; ``hold()`` lets it through, in order, on the same connection."""
    got: list[bytes] = []
    arrived = asyncio.Event()

    async def record_and_echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while data := await r.read(1024):
            got.append(data)
            arrived.set()
            w.write(data)
            await w.drain()
        w.close()

    server = await asyncio.start_server(record_and_echo, "127.0.0.1", 0)
    proxy = await TcpProxy(server.sockets[0].getsockname()[1]).start()
    try:
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        proxy.hold("down")
        w.write(b"ping")
        await w.drain()
        async with asyncio.timeout(5):
            await arrived.wait()  # the request went up
        assert got == [b"ping"]
        answer = asyncio.create_task(r.readexactly(4))

        def answer_held() -> None:
            assert not answer.done()
        await assert_throughout(answer_held, 0.3, interval=0.05)  # its answer is held
        proxy.hold()
        async with asyncio.timeout(5):
            assert await answer == b"ping"
        arrived.clear()
        proxy.hold("up")
        w.write(b"pong")
        await w.drain()

        def pong_held() -> None:
            assert got == [b"ping"]
        await assert_throughout(pong_held, 0.3, interval=0.05)  # held on its way up
        proxy.hold()
        async with asyncio.timeout(5):
            await arrived.wait()
            assert await r.readexactly(4) == b"pong"
        w.close()
    finally:
        await proxy.close()
        server.close()
