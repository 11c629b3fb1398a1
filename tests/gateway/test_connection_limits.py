"""Connection hygiene of the HTTP port (gateway/_connection.py), with raw sockets: a head
dripped a byte at a time, a body that stalls, more connections from one address than the
cap. Each test asserts what the client sees (the socket closed, the 408 or 429 it got) and
that a well-behaved client on another connection is served all along.

Real coordinator, NATS and gateway (no host needed).
"""
from __future__ import annotations

import asyncio
import json
import urllib.parse
from typing import Any

import httpx
import pytest

from gateway._connection import ConnectionLimits
from tests.conftest import assert_eventually, unique
from tests.gateway.conftest import Gateway

STEP = 0.05  # seconds a dripping client waits for the server's answer before its next byte


@pytest.fixture
async def http() -> Any:
    """The well-behaved client, one connection per request: these gateways close a
    keep-alive connection idle for their 0.5 s head budget, and a pooled connection reused
    just as the server closes it fails the request (the race every keep-alive client has
    with a server's idle timeout; on a loaded machine it was hit)."""
    async with httpx.AsyncClient(trust_env=False, timeout=10,
                                 limits=httpx.Limits(max_keepalive_connections=0)) as client:
        yield client


async def connect(gw: Gateway) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    u = urllib.parse.urlsplit(gw.url)
    return await asyncio.open_connection(u.hostname, u.port)


async def read_to_eof(reader: asyncio.StreamReader, timeout: float = 10.0) -> bytes:
    """Everything the server sends until it closes (a reset counts as the close)."""
    out = b""
    try:
        async with asyncio.timeout(timeout):
            while chunk := await reader.read(65536):
                out += chunk
    except ConnectionResetError:
        pass
    return out


async def closed_while_dripping(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes,
                                timeout: float = 10.0) -> tuple[int, bytes]:
    """Send ``data`` one byte at a time, each once the server said nothing for STEP seconds,
    until the server closes: ``(bytes sent, what the server sent)``. Fails if the server
    took every byte and is still open at ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    sent = 0
    while loop.time() < deadline:
        try:
            async with asyncio.timeout(STEP):
                got = await reader.read(65536)
        except TimeoutError:
            if sent < len(data):
                writer.write(data[sent:sent + 1])
                sent += 1
            continue
        except ConnectionResetError:
            return sent, b""
        return sent, got + await read_to_eof(reader)
    raise AssertionError(f"still open after {timeout}s and {sent} of {len(data)} bytes")


async def get_healthz(gw: Gateway) -> bytes:
    """A whole ``GET /healthz`` on a raw connection of its own (``connection: close``)."""
    reader, writer = await connect(gw)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
        return await read_to_eof(reader)
    finally:
        writer.close()


async def test_a_head_sent_a_byte_at_a_time_is_cut_off(make_gateway: Any, http: httpx.AsyncClient) -> None:
    gw = await make_gateway(connections=ConnectionLimits(header_timeout=0.5))
    head = b"GET /healthz HTTP/1.1\r\nhost: t\r\n" + b"x-drip: " + b"a" * 1000 + b"\r\n\r\n"
    reader, writer = await connect(gw)
    try:
        # A normal client is served while the dripping one is open.
        assert (await http.get(f"{gw.url}/healthz")).status_code == 200
        sent, answer = await closed_while_dripping(reader, writer, head)
    finally:
        writer.close()
    assert 0 < sent < len(head), sent  # it was taking bytes, and closed before the head was whole
    assert answer == b""  # closed, not answered: the request never began
    assert (await http.get(f"{gw.url}/healthz")).status_code == 200


async def test_a_connection_that_sends_nothing_is_closed(make_gateway: Any) -> None:
    gw = await make_gateway(connections=ConnectionLimits(header_timeout=0.5))
    reader, writer = await connect(gw)
    try:
        assert await read_to_eof(reader) == b""
    finally:
        writer.close()


async def test_the_head_budget_starts_again_after_each_response(make_gateway: Any) -> None:
    # A keep-alive connection's second request gets a full budget, and a drip in it is cut off too.
    gw = await make_gateway(connections=ConnectionLimits(header_timeout=0.5))
    reader, writer = await connect(gw)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n")
        async with asyncio.timeout(10):
            status = await reader.readline()
            assert status.startswith(b"HTTP/1.1 200"), status
            length = 0
            while (line := await reader.readline()) != b"\r\n":
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
        sent, answer = await closed_while_dripping(reader, writer, b"GET /healthz HTTP/1.1\r\nhost: t\r\n" + b"x" * 1000)
        assert sent > 0 and answer == b""
    finally:
        writer.close()


async def test_a_stalled_body_gets_408_and_nothing_is_created(make_gateway: Any, http: httpx.AsyncClient) -> None:
    gw = await make_gateway(connections=ConnectionLimits(body_timeout=0.5))
    path = f"/ds/{unique('stall')}"
    reader, writer = await connect(gw)
    try:
        writer.write(f"PUT {path} HTTP/1.1\r\nhost: t\r\ncontent-type: text/plain\r\n"
                     "content-length: 100\r\n\r\n".encode() + b"0123456789")
        answer = await read_to_eof(reader)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), answer
    assert json.loads(body)["reason"] == "REQUEST_TIMEOUT"
    assert (await http.get(f"{gw.url}{path}?offset=-1")).status_code == 404


async def test_a_body_that_keeps_coming_is_not_cut_off(make_gateway: Any, http: httpx.AsyncClient) -> None:
    # Slow but steady: each byte resets the stall timer. The whole body takes longer than
    # the timeout, and the stream is created with it.
    gw = await make_gateway(connections=ConnectionLimits(body_timeout=0.5, header_timeout=0.5))
    path = f"/ds/{unique('steady')}"
    body = b"x" * 20  # 20 bytes, one per STEP (0.05 s): 1 s in all
    reader, writer = await connect(gw)
    try:
        writer.write(f"PUT {path} HTTP/1.1\r\nhost: t\r\ncontent-type: text/plain\r\n"
                     f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode())
        sent, answer = await closed_while_dripping(reader, writer, body)
    finally:
        writer.close()
    assert sent == len(body)
    assert answer.startswith(b"HTTP/1.1 201 "), answer
    r = await http.get(f"{gw.url}{path}?offset=-1")
    assert r.status_code == 200 and r.content == body


async def test_an_sse_response_outlives_both_timeouts(make_gateway: Any, http: httpx.AsyncClient) -> None:
    gw = await make_gateway(connections=ConnectionLimits(header_timeout=0.3, body_timeout=0.3))
    path = f"{gw.url}/ds/{unique('sse')}"
    assert (await http.put(path, headers={"content-type": "text/plain"})).status_code == 201
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str | None] = asyncio.Queue()

    async def read(resp: httpx.Response) -> None:
        async for line in resp.aiter_lines():
            lines.put_nowait(line)
        lines.put_nowait(None)  # the response ended

    async def until(text: str, *, not_before: float = 0.0) -> None:
        # Read events until `text` arrives; append it once the clock passed `not_before`.
        appended = False
        while True:
            if not appended and loop.time() >= not_before:
                r = await http.post(path, content=text.encode(), headers={"content-type": "text/plain"})
                assert r.status_code == 204
                appended = True
            try:
                async with asyncio.timeout(0.1):
                    line = await lines.get()
            except TimeoutError:
                continue
            assert line is not None, "the SSE response ended"
            if line == f"data:{text}":
                return

    async with httpx.AsyncClient(trust_env=False, timeout=10) as reader:
        async with reader.stream("GET", f"{path}?offset=-1&live=sse") as resp:
            assert resp.status_code == 200
            async with asyncio.timeout(15), asyncio.TaskGroup() as tg:
                task = tg.create_task(read(resp))
                await until("first")
                # Idle well past both timeouts (3 x 0.3 s), then the same response carries more.
                await until("second", not_before=loop.time() + 1.0)
                task.cancel()


async def test_connections_past_the_per_client_cap_get_429(make_gateway: Any) -> None:
    gw = await make_gateway(connections=ConnectionLimits(per_client=2))
    held = [await connect(gw)]

    async def second_one_is_admitted() -> bool:
        # The readiness probe's connection may still be counted for a moment after it closed.
        reader, writer = await connect(gw)
        writer.write(b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n")
        async with asyncio.timeout(10):
            status = await reader.readline()
            if status.startswith(b"HTTP/1.1 200"):
                head = (await reader.readuntil(b"\r\n\r\n")).decode().lower()
                length = int(head.split("content-length:")[1].split("\r\n")[0])
                await reader.readexactly(length)
                held.append((reader, writer))  # served, and kept alive: it holds its place
                return True
        writer.close()
        return False

    await assert_eventually(second_one_is_admitted)
    try:
        # The third from this address: 429 and closed, even before it sent anything.
        reader, writer = await connect(gw)
        try:
            answer = await read_to_eof(reader)
        finally:
            writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 429 "), answer
        assert json.loads(body)["reason"] == "TOO_MANY_CONNECTIONS"
        # The two held connections are served.
        for reader, writer in held:
            writer.write(b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n")
            async with asyncio.timeout(10):
                assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    finally:
        for _, writer in held:
            writer.close()

    async def admitted_again() -> bool:
        return (await get_healthz(gw)).startswith(b"HTTP/1.1 200")

    await assert_eventually(admitted_again)  # once they are gone, a new one is served


async def test_a_client_whose_request_is_on_its_way_past_the_cap_reads_the_429(make_gateway: Any) -> None:
    # httpx's async client sends its request as the connection opens: it read a reset where
    # the gateway answered and closed before the request came in.
    gw = await make_gateway(connections=ConnectionLimits(per_client=1))
    reader, writer = await connect(gw)
    writer.write(b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n")
    async with asyncio.timeout(10):
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")  # it holds the one place
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
            r = await client.post(f"{gw.url}/api/chat/cancel", json={"runId": "r", "pad": "x" * 20000})
        assert r.status_code == 429 and r.json()["reason"] == "TOO_MANY_CONNECTIONS", r.text
    finally:
        writer.close()
