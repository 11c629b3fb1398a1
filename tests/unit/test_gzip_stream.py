"""gzip of the gateway's streams (gateway/_compression.py, gateway/_sse.py): every write
decodes on arrival, a stream that rested and went on is one valid gzip member, and
``Accept-Encoding`` is read as RFC 9110 says."""
from __future__ import annotations

import asyncio
import gzip
import json
import os
import zlib
from typing import Any, AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway._compression import SHARED_MAX_BYTES, WINDOW, GzipStream, SharedWrites, accepts_gzip
from gateway._settings import GatewaySettings
from gateway._sse import StreamCloser, StreamResponse
from tests.conftest import assert_eventually


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
    ("identity, " * 200 + "gzip", False),  # longer than anyone sends: identity, unparsed
])
def test_accept_encoding(header: str | None, admitted: bool) -> None:
    assert accepts_gzip(header) is admitted


def _frames(n: int) -> list[bytes]:
    return [b"id: %d\ndata: %s\n\n" % (1000 + i, json.dumps(
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "msg-1", "delta": f"word {i} of the answer "}).encode())
        for i in range(n)]


async def _write(gz: GzipStream, data: bytes) -> bytes:
    """A write the server took."""
    out = await gz.write(data)
    gz.sent()
    return out


async def test_each_write_decodes_when_it_arrives_and_the_whole_is_one_gzip_member() -> None:
    gz, inflate = GzipStream(SharedWrites()), zlib.decompressobj(16 + zlib.MAX_WBITS)
    sent = b""
    for frame in _frames(50):
        wire = await _write(gz, frame)
        assert inflate.decompress(wire) == frame  # nothing of it waits for the next write
        sent += wire
    end = gz.finish()
    assert gzip.decompress(sent + end) == b"".join(_frames(50))  # gzip checks the CRC and the length
    assert gz.finish() == end  # the same bytes, to send again if the first did not go out


async def test_only_what_was_sent_counts() -> None:
    """A write the server did not take (a shutdown while it waited to drain) is not in the
    trailer, and the next write is compressed after what the client has."""
    gz = GzipStream(SharedWrites())
    frames = _frames(4)
    wire = await _write(gz, frames[0])
    await gz.write(frames[1])  # never sent
    wire += await _write(gz, frames[2])
    await gz.write(frames[3])  # never sent either
    assert gzip.decompress(wire + gz.finish()) == frames[0] + frames[2]
    assert gzip.decompress(GzipStream(SharedWrites()).finish()) == b""
    unsent = GzipStream(SharedWrites())
    await unsent.write(frames[0])  # the header went with it, unsent: the end brings its own
    assert gzip.decompress(unsent.finish()) == b""


async def test_each_write_refers_back_to_what_the_client_holds() -> None:
    """A write's compressor is its own, primed with the text before it: frames compress as
    in one stream, not each alone."""
    frames = _frames(40)
    gz = GzipStream(SharedWrites())
    wire = b"".join([await _write(gz, f) for f in frames]) + gz.finish()
    alone = sum(len(zlib.compress(f)) for f in frames)
    assert gzip.decompress(wire) == b"".join(frames)
    assert len(wire) < 0.5 * alone
    assert len(wire) < 0.4 * sum(map(len, frames))


async def test_a_stream_holds_a_window_of_text_between_writes() -> None:
    gz = GzipStream(SharedWrites())
    big = bytes(range(256)) * (3 * WINDOW // 256 + 1)
    wire = await _write(gz, big)
    assert len(gz._tail) == WINDOW
    wire += await _write(gz, b"tail") + await _write(gz, big[-100:]) + await _write(gz, b"")
    assert len(gz._tail) == WINDOW and gz._tail.endswith(b"tail" + big[-100:])
    assert gzip.decompress(wire + gz.finish()) == big + b"tail" + big[-100:]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.binary(max_size=2 * WINDOW), st.sampled_from(_frames(3)),
                                    st.binary(min_size=SHARED_MAX_BYTES + 1, max_size=SHARED_MAX_BYTES + 9)),
                          st.booleans()), max_size=20))
def test_any_writes_decode_to_what_was_sent(pieces: list[tuple[bytes, bool]]) -> None:
    async def run() -> None:
        gz, inflate = GzipStream(SharedWrites()), zlib.decompressobj(16 + zlib.MAX_WBITS)
        wire, sent = b"", b""
        for data, taken in pieces:
            out = await gz.write(data)
            if taken:  # the server took it: the client has it
                gz.sent()
                assert inflate.decompress(out) == data
                wire += out
                sent += data
        assert gzip.decompress(wire + gz.finish()) == sent

    asyncio.run(run())


async def test_readers_at_the_same_place_share_a_write_and_no_one_else_does() -> None:
    shared = SharedWrites()
    frames = _frames(30)
    early, late = GzipStream(shared), GzipStream(shared)
    early_wire = b"".join([await _write(early, f) for f in frames[:10]])
    late_wire = await _write(late, b"".join(frames[:10]))  # one catch-up write, then the live tail
    hits = shared.hits
    for f in frames[10:]:
        a, b = await _write(early, f), await _write(late, f)
        assert a == b  # the same last 4 KiB and the same chunk: the same bytes
        early_wire += a
        late_wire += b
    assert shared.hits - hits == 20  # compressed once for both
    for wire in (early_wire + early.finish(), late_wire + late.finish()):
        assert gzip.decompress(wire) == b"".join(frames)


async def test_a_kept_write_is_used_only_after_the_same_text() -> None:
    shared = SharedWrites()
    # Two pasts that end alike: the same key, not the same dictionary.
    one, other = b"B" * 100 + b"A" * 100, b"C" * 100 + b"A" * 100
    data = b"B" * 60 + b"A" * 60  # after ``one``, its Bs are a reference back into it
    made = shared.compress(one, data)
    again = shared.compress(other, data)
    assert shared.hits == 0 and again != made
    assert zlib.decompressobj(-zlib.MAX_WBITS, zdict=other).decompress(again) == data
    assert zlib.decompressobj(-zlib.MAX_WBITS, zdict=one).decompress(made) == data
    assert shared.compress(other, data) == again and shared.hits == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(_frames(4) + [b"", b"x" * 70])), max_size=60))
def test_streams_sharing_writes_each_decode_to_their_own(writes: list[tuple[int, bytes]]) -> None:
    async def run() -> None:
        shared = SharedWrites(size=4)
        streams = [GzipStream(shared) for _ in range(4)]
        wires, sent = [b""] * 4, [b""] * 4
        for i, data in writes:
            wires[i] += await _write(streams[i], data)
            sent[i] += data
        for i in range(4):
            assert gzip.decompress(wires[i] + streams[i].finish()) == sent[i]

    asyncio.run(run())


async def test_a_large_write_is_made_once_off_the_loop_for_every_reader_given_it() -> None:
    """Readers with different pasts given the same large chunk share one compression, made
    in a worker thread: the loop runs while it is made, and a reader that goes away while it
    waits does not take it from the others."""
    shared = SharedWrites()
    big = os.urandom(3 << 20).hex().encode()  # 6 MiB of a tool result's hex: tens of ms to deflate
    readers = [GzipStream(shared) for _ in range(3)]
    pasts = [await _write(gz, f) for gz, f in zip(readers, _frames(3))]
    writes = [asyncio.create_task(gz.write(big)) for gz in readers]
    await asyncio.sleep(0)  # each reader's write began
    assert not any(w.done() for w in writes)  # the loop is free while the thread compresses
    writes[0].cancel()  # this reader went away
    outs = await asyncio.gather(*writes[1:])
    assert outs[0] == outs[1] and shared.hits == 2
    for gz, past, out, frame in zip(readers[1:], pasts[1:], outs, _frames(3)[1:]):
        gz.sent()
        assert gzip.decompress(past + out + gz.finish()) == frame + big


def test_the_setting() -> None:
    assert GatewaySettings.from_env({}).http_compression is True
    assert GatewaySettings.from_env({"BATON_HTTP_COMPRESSION": "off"}).http_compression is False
    with pytest.raises(ValueError, match="BATON_HTTP_COMPRESSION"):
        GatewaySettings.from_env({"BATON_HTTP_COMPRESSION": "br"})


async def _connected() -> dict[str, Any]:
    """An ASGI ``receive`` of a client that stays connected."""
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}


async def _serve(response: StreamResponse, accept_encoding: bytes | None) -> tuple[dict[str, bytes], list[bytes]]:
    """The response's head and body writes, as an ASGI server would get them."""
    scope: dict[str, Any] = {"type": "http", "headers": [] if accept_encoding is None
                             else [(b"accept-encoding", accept_encoding)]}
    sent: list[dict[str, Any]] = []
    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await response(scope, _connected, send)
    return dict(sent[0]["headers"]), [m["body"] for m in sent[1:]]


async def _body(frames: list[bytes]) -> AsyncIterator[bytes]:
    for f in frames:
        yield f


async def test_a_stream_is_gzip_only_when_enabled_and_admitted() -> None:
    frames = _frames(5)
    head, body = await _serve(StreamResponse(_body(frames), "sse", compress=SharedWrites()), b"gzip, deflate")
    assert head[b"content-encoding"] == b"gzip" and head[b"vary"] == b"accept-encoding"
    assert gzip.decompress(b"".join(body)) == b"".join(frames)
    assert len(body) == len(frames) + 1  # one write per frame, then the trailer

    head, body = await _serve(StreamResponse(_body(frames), "sse", compress=SharedWrites()), None)
    assert b"content-encoding" not in head and head[b"vary"] == b"accept-encoding"
    assert b"".join(body) == b"".join(frames)

    head, body = await _serve(StreamResponse(_body(frames), "sse"), b"gzip")
    assert b"content-encoding" not in head and b"vary" not in head
    assert b"".join(body) == b"".join(frames)


class _DrainingSend:
    """An ASGI ``send`` as uvicorn's: a message that must wait for the socket to drain waits
    *before* any of it is written, so a cancel there writes none of it."""

    def __init__(self, waits: Any) -> None:
        self.waits = waits  # (message, messages written so far) -> whether it waits to drain
        self.wire: list[dict[str, Any]] = []
        self.waiting = asyncio.Event()
        self.drained = asyncio.Event()

    async def __call__(self, message: dict[str, Any]) -> None:
        if not self.drained.is_set() and self.waits(message, len(self.wire)):
            self.waiting.set()
            await self.drained.wait()
        self.wire.append(message)


@pytest.mark.parametrize("waiting", ["a chunk", "the end"])
async def test_a_shutdown_while_a_write_waits_ends_with_the_trailer_of_what_was_sent(waiting: str) -> None:
    """The gateway shuts down while a reader that stopped reading holds a write back: the
    client gets a whole gzip member of what it has (then reconnects for the rest)."""
    frames = _frames(3)
    if waiting == "a chunk":
        def waits(message: dict[str, Any], written: int) -> bool:
            return written == 2  # the second chunk (after the head and the first)
    else:
        def waits(message: dict[str, Any], written: int) -> bool:
            return message["type"] == "http.response.body" and not message["more_body"]
    closer = StreamCloser()
    send = _DrainingSend(waits)
    response = StreamResponse(_body(frames), "sse", closer=closer, compress=SharedWrites())
    served = asyncio.create_task(response({"type": "http", "headers": [(b"accept-encoding", b"gzip")]},
                                          _connected, send))
    await send.waiting.wait()
    closer.close_all()
    await assert_eventually(lambda: response.shut_down)
    send.drained.set()  # the client reads again
    await served
    ends = [m for m in send.wire if m["type"] == "http.response.body" and not m["more_body"]]
    assert len(ends) == 1
    body = b"".join(m["body"] for m in send.wire if m["type"] == "http.response.body")
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    got = inflate.decompress(body)
    assert inflate.eof and not inflate.unused_data  # a whole member: CRC and length checked
    assert got == (frames[0] if waiting == "a chunk" else b"".join(frames))


async def test_large_writes_kept_are_bounded_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    import gateway._compression as compression

    monkeypatch.setattr(compression, "SHARED_LARGE_BYTES", 10 * (SHARED_MAX_BYTES + 1))
    shared = SharedWrites()
    pieces = [bytes([i]) * (SHARED_MAX_BYTES + 1) for i in range(20)]
    for p in pieces:
        assert zlib.decompressobj(-zlib.MAX_WBITS).decompress(await shared.compress_large(p)) == p
    assert shared._large_bytes <= compression.SHARED_LARGE_BYTES
    assert list(shared._large) == pieces[-5:]  # the newest, two bytes each (text, compressed)
    assert shared._large_bytes == 2 * sum(map(len, pieces[-5:]))


async def test_the_end_goes_once_when_the_shutdown_comes_as_it_is_sent() -> None:
    closer = StreamCloser()
    sent: list[dict[str, Any]] = []
    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message["more_body"]:
            closer.close_all()  # the gateway begins to shut down as the end goes out

    response = StreamResponse(_body(_frames(1)), "sse", closer=closer, compress=SharedWrites())
    await response({"type": "http", "headers": [(b"accept-encoding", b"gzip")]}, _connected, send)
    assert response.shut_down  # it did see the shutdown
    ends = [m for m in sent if m["type"] == "http.response.body" and not m["more_body"]]
    assert len(ends) == 1  # a second would be an ASGI error after the response completed
    assert gzip.decompress(b"".join(m["body"] for m in sent if m["type"] == "http.response.body")) == _frames(1)[0]


async def test_a_shutdown_lets_go_of_a_reader_that_never_reads_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The end of a shut-down stream waits for its reader at most SHUTDOWN_END_WAIT, then
    the stream counts as disconnected (the server would otherwise cancel it at its graceful
    timeout and log an error)."""
    import gateway._sse as sse

    monkeypatch.setattr(sse, "SHUTDOWN_END_WAIT", 0.05)
    closer = StreamCloser()
    send = _DrainingSend(lambda message, written: written == 2)
    response = StreamResponse(_body(_frames(3)), "sse", closer=closer, compress=SharedWrites())
    served = asyncio.create_task(response({"type": "http", "headers": [(b"accept-encoding", b"gzip")]},
                                          _connected, send))
    await send.waiting.wait()
    closer.close_all()
    async with asyncio.timeout(10):
        await served  # never drained: it ends all the same
    assert response.shut_down and response.disconnected
    assert not any(m["type"] == "http.response.body" and not m["more_body"] for m in send.wire)


async def test_a_write_over_the_bound_is_shared_only_while_it_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """A catch-up of a long run in one write may be larger than all that is kept: readers
    asking for it at once share it, and it is not kept after (nor anything before it)."""
    import gateway._compression as compression

    monkeypatch.setattr(compression, "SHARED_LARGE_BYTES", 3 * compression.OFF_LOOP_BYTES)
    shared = SharedWrites()
    small = b"s" * (SHARED_MAX_BYTES + 1)
    await shared.compress_large(small)
    huge = os.urandom(compression.OFF_LOOP_BYTES).hex().encode()  # 2 × OFF_LOOP_BYTES: over the bound
    outs = await asyncio.gather(*(shared.compress_large(huge) for _ in range(3)))
    assert outs[0] == outs[1] == outs[2] and shared.hits == 2  # made once for the three
    assert list(shared._large) == [] and shared._large_bytes == 0
    shared.close()
