"""gzip of the gateway's streams (gateway/_compression.py, gateway/_sse.py): every write
decodes on arrival, a stream that rested and went on is one valid gzip member, and
``Accept-Encoding`` is read as RFC 9110 says."""
from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from typing import Any, AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway._compression import WINDOW, GzipStream, accepts_gzip
from gateway._settings import GatewaySettings
from gateway._sse import StreamResponse


@pytest.mark.parametrize("header, admitted", [
    ("gzip, deflate, br, zstd", True),  # Chromium, Firefox
    ("gzip, deflate", True),  # httpx, undici's fetch
    ("gzip", True),  # Go's net/http Transport
    ("GZIP;Q=0.5", True),
    ("x-gzip", True),
    ("*", True),
    ("br;q=1, *;q=0.1", True),
    (None, False),
    ("", False),
    ("identity", False),
    ("br, zstd", False),
    ("gzip;q=0", False),
    ("gzip;q=0.000", False),
    ("*;q=0", False),
    ("gzip;q=0, *", False),  # gzip named refused: the star does not bring it back
    ("gzip;q=soon", False),  # a malformed weight refuses its coding
    ("gzip;q=2", False),
    ("deflate, gzip;q=0.001", True),
])
def test_accept_encoding(header: str | None, admitted: bool) -> None:
    assert accepts_gzip(header) is admitted


def _frames(n: int) -> list[bytes]:
    return [b"id: %d\ndata: %s\n\n" % (1000 + i, json.dumps(
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "msg-1", "delta": f"word {i} of the answer "}).encode())
        for i in range(n)]


def test_each_write_decodes_when_it_arrives_and_the_whole_is_one_gzip_member() -> None:
    gz, inflate = GzipStream(), zlib.decompressobj(16 + zlib.MAX_WBITS)
    sent = b""
    for frame in _frames(50):
        wire = gz.write(frame)
        assert inflate.decompress(wire) == frame  # nothing of it waits for the next write
        sent += wire
    sent += gz.finish()
    assert gzip.decompress(sent) == b"".join(_frames(50))  # gzip checks the CRC and the length
    assert gz.finish() == b""


def test_each_write_refers_back_to_what_the_client_holds() -> None:
    """A write's compressor is its own, primed with the text before it: frames compress as
    in one stream, not each alone."""
    frames = _frames(40)
    gz = GzipStream()
    wire = b"".join(gz.write(f) for f in frames) + gz.finish()
    alone = sum(len(zlib.compress(f)) for f in frames)
    assert gzip.decompress(wire) == b"".join(frames)
    assert len(wire) < 0.5 * alone
    assert len(wire) < 0.4 * sum(map(len, frames))


def test_an_empty_stream_and_a_stream_finished_twice() -> None:
    assert gzip.decompress(GzipStream().finish()) == b""
    gz = GzipStream()
    wire = gz.write(b"data: x\n\n") + gz.write(b"")
    assert gzip.decompress(wire + gz.finish()) == b"data: x\n\n"
    assert gz.finish() == b""
    with pytest.raises(RuntimeError):
        gz.write(b"more")


def test_a_stream_holds_a_window_of_text_between_writes() -> None:
    gz = GzipStream()
    big = bytes(range(256)) * (3 * WINDOW // 256 + 1)
    wire = gz.write(big)
    assert len(gz._tail) == WINDOW
    wire += gz.write(b"tail") + gz.write(big[-100:])
    assert len(gz._tail) == WINDOW and gz._tail.endswith(b"tail" + big[-100:])
    assert gzip.decompress(wire + gz.finish()) == big + b"tail" + big[-100:]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=3 * WINDOW), st.sampled_from(_frames(3))), max_size=30))
def test_any_writes_decode_to_what_was_written(pieces: list[bytes]) -> None:
    gz, inflate = GzipStream(), zlib.decompressobj(16 + zlib.MAX_WBITS)
    wire = b""
    for data in pieces:
        out = gz.write(data)
        assert inflate.decompress(out) == data
        wire += out
    wire += gz.finish()
    assert gzip.decompress(wire) == b"".join(pieces)


def test_the_setting() -> None:
    assert GatewaySettings.from_env({}).http_compression is True
    assert GatewaySettings.from_env({"BATON_HTTP_COMPRESSION": "off"}).http_compression is False
    with pytest.raises(ValueError, match="BATON_HTTP_COMPRESSION"):
        GatewaySettings.from_env({"BATON_HTTP_COMPRESSION": "br"})


async def _serve(response: StreamResponse, accept_encoding: bytes | None) -> tuple[dict[str, bytes], list[bytes]]:
    """The response's head and body writes, as an ASGI server would get them."""
    scope: dict[str, Any] = {"type": "http", "headers": [] if accept_encoding is None
                             else [(b"accept-encoding", accept_encoding)]}
    sent: list[dict[str, Any]] = []
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await never.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await response(scope, receive, send)
    return dict(sent[0]["headers"]), [m["body"] for m in sent[1:]]


async def _body(frames: list[bytes]) -> AsyncIterator[bytes]:
    for f in frames:
        yield f


async def test_a_stream_is_gzip_only_when_enabled_and_admitted() -> None:
    frames = _frames(5)
    head, body = await _serve(StreamResponse(_body(frames), "sse", compress=True), b"gzip, deflate")
    assert head[b"content-encoding"] == b"gzip" and head[b"vary"] == b"accept-encoding"
    assert gzip.decompress(b"".join(body)) == b"".join(frames)
    assert len(body) == len(frames) + 1  # one write per frame, then the trailer

    head, body = await _serve(StreamResponse(_body(frames), "sse", compress=True), None)
    assert b"content-encoding" not in head and head[b"vary"] == b"accept-encoding"
    assert b"".join(body) == b"".join(frames)

    head, body = await _serve(StreamResponse(_body(frames), "sse", compress=False), b"gzip")
    assert b"content-encoding" not in head and b"vary" not in head
    assert b"".join(body) == b"".join(frames)
