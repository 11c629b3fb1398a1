"""SSE and NDJSON framing of the delivery log, and a streaming response that ends on disconnect.

Wire format (docs/design.md §6, the TanStack AI durable chat transport):

- SSE (``text/event-stream``): ``id: <offset>`` then ``data: <chunk json>`` per chunk, a
  ``: keep-alive`` comment when idle, and a final ``: end`` comment when the log closed.
- NDJSON (``Accept: application/x-ndjson``): one ``{"id": "<offset>", "chunk": {...}}`` per
  line; an empty line is the keep-alive (line readers skip blank lines).
- Notices (the log cannot store) are not log data: never an ``id`` nor a
  chunk. SSE sends a comment ``: notice LOG_STORAGE_FULL <message>`` (EventSource and
  AG-UI parsers ignore comments); NDJSON a line ``{"notice": {"reason", "message"}}``
  without ``chunk`` (clients skip lines without one). A notice also serves as keep-alive.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, AsyncIterator, Literal

from starlette.types import Receive, Scope, Send

from baton import errors as e
from gateway import _grpc_wire
from gateway._compression import SHARED_MAX_BYTES, GzipStream, SharedWrites, accepts_gzip

log = logging.getLogger("gateway.sse")

# "grpc": baton.v1.RunEvent bytes (gateway._grpc_wire), for the Runs service.
Framing = Literal["sse", "ndjson", "grpc"]
NDJSON = "application/x-ndjson"
#: ``no-transform`` (RFC 9111 §5.2.2.6): no proxy may re-encode a stream (one that
#: compresses what the client took as identity may hold events back to fill its buffer).
STREAM_HEADERS = {"Cache-Control": "no-cache, no-transform", "X-Accel-Buffering": "no"}
#: Seconds a shut-down stream's last write may wait for a reader that stopped reading.
SHUTDOWN_END_WAIT = 1.0


#: The query parameter that picks the framing by URL alone (``?format=ndjson``).
FORMAT_PARAM = "format"


def choose_framing(accept: str | None, fmt: str | None = None) -> Framing:
    """NDJSON when the URL says ``?format=ndjson`` or the client asks for
    ``application/x-ndjson``, else SSE.

    TanStack's NDJSON adapters (``fetchHttpStream``, ``xhrHttpStream``) send no ``Accept``
    header, exactly like its SSE adapter, and take nothing but a URL: the URL is the only
    thing that can tell them apart, as it does for TanStack's own server helpers (one route
    per framing). ``?format=sse`` forces SSE whatever ``Accept`` says.

    Raises:
        InvalidArgument: ``format`` is neither ``sse`` nor ``ndjson``.
    """
    if fmt is not None:
        if fmt not in ("sse", "ndjson"):
            raise e.InvalidArgument("format", "must be sse or ndjson")
        return "ndjson" if fmt == "ndjson" else "sse"
    return "ndjson" if accept and NDJSON in accept.lower() else "sse"


def dumps(value: Any) -> bytes:
    """A chunk's JSON bytes as every framing carries them: compact, without ASCII escaping
    (the chunk is shown to people, byte size matters)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def chunk_frame(framing: Framing, offset: bytes | None, payload: bytes) -> bytes:
    """The one framing of a chunk: ``offset`` (ASCII digits; ``None``: no resume id, as a gap
    notice has none) and the chunk's JSON bytes (:func:`dumps`). The shared tail
    (:mod:`gateway._fanout`) and a reader's own log read both frame through this."""
    if framing == "grpc":
        return _grpc_wire.chunk_frame(offset or b"", payload)
    if framing == "ndjson":
        if offset is None:
            return b'{"chunk":%b}\n' % payload
        return b'{"id":"%b","chunk":%b}\n' % (offset, payload)
    # JSON never contains a raw newline, so one data line always suffices.
    if offset is None:
        return b"data: %b\n\n" % payload
    return b"id: %b\ndata: %b\n\n" % (offset, payload)


def frame_chunk(framing: Framing, offset: str | None, chunk: dict[str, Any]) -> bytes:
    """One chunk on the wire. ``offset=None`` sends the chunk with no resume id (a gap notice)."""
    return chunk_frame(framing, None if offset is None else offset.encode(), dumps(chunk))


def frame_keepalive(framing: Framing) -> bytes:
    if framing == "grpc":
        return _grpc_wire.KEEPALIVE
    return b"\n" if framing == "ndjson" else b": keep-alive\n\n"


def frame_notice(framing: Framing, reason: str, message: str) -> bytes:
    """A notice to the client that is not log data (see the module docstring)."""
    if framing == "grpc":
        return _grpc_wire.notice_frame(reason, message)
    if framing == "ndjson":
        return dumps({"notice": {"reason": reason, "message": message}}) + b"\n"
    text = " ".join(message.splitlines())  # one comment line: a newline would end it
    return f": notice {reason} {text}\n\n".encode()


def frame_end(framing: Framing, status: str | None = None) -> bytes:
    """Marks a clean end (the log closed), so clients can tell it from a dropped connection.

    ``status`` (the log's close status) is carried by the gRPC framing only.
    """
    if framing == "grpc":
        return _grpc_wire.end_frame(status)
    return b"" if framing == "ndjson" else b": end\n\n"


def frame_gap(framing: Framing, chunk: dict[str, Any], earliest_offset: str) -> bytes:
    """The answer to an expired offset: the ``stream.gap`` chunk, or the gRPC ``gap`` field."""
    if framing == "grpc":
        return _grpc_wire.gap_frame(earliest_offset)
    return frame_chunk(framing, None, chunk)


def media_type(framing: Framing) -> str:
    return NDJSON if framing == "ndjson" else "text/event-stream"


class StreamCloser:
    """The open streams of one gateway, and the signal that ends them all at shutdown.

    uvicorn's graceful shutdown waits for every response to complete, then cancels what is
    left: an open stream was cancelled after ``timeout_graceful_shutdown`` and logged as an
    ERROR with a traceback (one per stream). Ended here instead, each stream completes its
    response without the end marker, so its reader reconnects (to another gateway) at once.
    """

    def __init__(self) -> None:
        self.closing = asyncio.Event()
        self.open = 0

    def close_all(self) -> int:
        """End every open stream (and any opened from now on); returns how many were open."""
        self.closing.set()
        return self.open


class StreamResponse:
    """An ASGI streaming response that ends when the body ends, the client disconnects or
    the gateway shuts down (``closer``).

    Unlike ``StarletteStreamingResponse`` under ASGI spec 2.4, it always listens for
    ``http.disconnect``, so an idle reader (waiting for the next chunk) is noticed at once,
    not at its next keep-alive write: presence must go away when the client does. The body
    generator is always closed (``aclose``), so its ``finally`` (presence unregister) runs.
    A stream ended by the shutdown completes its response without the end marker (the
    client tells it from the log's end and reconnects).

    With ``compress`` (the gateway's :class:`~gateway._compression.SharedWrites`) and a
    request whose ``Accept-Encoding`` admits gzip, the body is gzip (:mod:`gateway._compression`):
    every write is flushed to a byte boundary, so each chunk is decodable when it arrives.
    The last write of a stream the shutdown ended waits at most :data:`SHUTDOWN_END_WAIT`
    for its reader, then counts as a disconnect.
    """

    def __init__(self, body: AsyncIterator[bytes], framing: Framing, headers: dict[str, str] | None = None,
                 closer: StreamCloser | None = None, *, compress: SharedWrites | None = None) -> None:
        self._body = body
        self._headers = {**STREAM_HEADERS, **(headers or {})}
        self._framing = framing
        self._closer = closer
        self._compress = compress
        self.disconnected = False
        self.shut_down = False
        self._ended = False  # the response's last message went out
        #: The body's gzip encoder when the response is compressed, else ``None``.
        self.gzip: GzipStream | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._compress is not None:
            accept = b",".join(v for k, v in scope.get("headers", ()) if k == b"accept-encoding")
            if accepts_gzip(accept.decode("latin-1")):
                self.gzip = GzipStream(self._compress)
        if self._closer is None:
            await self._serve(receive, send, None)
            return
        self._closer.open += 1
        try:
            await self._serve(receive, send, self._closer.closing)
        finally:
            self._closer.open -= 1

    async def _serve(self, receive: Receive, send: Send, closing: asyncio.Event | None) -> None:
        raw = [(b"content-type", f"{media_type(self._framing)}; charset=utf-8".encode())]
        raw += [(k.lower().encode(), v.encode()) for k, v in self._headers.items()]
        gz = self.gzip
        if self._compress is not None:
            raw.append((b"vary", b"accept-encoding"))
        if gz is not None:
            raw.append((b"content-encoding", b"gzip"))
        await send({"type": "http.response.start", "status": 200, "headers": raw})

        async def pump() -> None:
            try:
                async for data in self._body:
                    if self.disconnected:
                        return  # belt and braces: never stream on after a disconnect
                    if data:
                        if gz is None:
                            await send({"type": "http.response.body", "body": data, "more_body": True})
                        else:
                            # Counted once sent: uvicorn takes nothing of a write whose wait
                            # for the socket to drain was cancelled (a shutdown meanwhile).
                            data = gz.write_small(data) if len(data) <= SHARED_MAX_BYTES else await gz.write(data)
                            await send({"type": "http.response.body", "body": data, "more_body": True})
                            gz.sent()
                end = gz.finish() if gz is not None else b""
                await send({"type": "http.response.body", "body": end, "more_body": False})
                self._ended = True
            finally:
                await self._close_body()

        async def listen() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    self.disconnected = True
                    return

        async def shutdown() -> None:
            assert closing is not None
            await closing.wait()
            self.shut_down = True

        try:
            async with asyncio.TaskGroup() as tg:
                pump_t = tg.create_task(pump())
                listen_t = tg.create_task(listen())
                pump_t.add_done_callback(lambda _: listen_t.cancel())
                listen_t.add_done_callback(lambda _: pump_t.cancel())
                if closing is not None:
                    shut_t = tg.create_task(shutdown())
                    pump_t.add_done_callback(lambda _: shut_t.cancel())
                    shut_t.add_done_callback(lambda _: pump_t.cancel())
        except* OSError:
            # The socket went away under a write: the same as a disconnect.
            self.disconnected = True
        if self.shut_down and not self.disconnected and not self._ended:
            try:
                end = gz.finish() if gz is not None else b""
                # A reader that stopped reading would hold the write (uvicorn waits for the
                # socket to drain) until the server's graceful timeout cancelled it, logged
                # as an error: it is let go instead, as a disconnect.
                async with asyncio.timeout(SHUTDOWN_END_WAIT):
                    await send({"type": "http.response.body", "body": end, "more_body": False})
                self._ended = True
            except (OSError, TimeoutError):
                self.disconnected = True

    async def _close_body(self) -> None:
        aclose = getattr(self._body, "aclose", None)
        if aclose is not None:
            await aclose()

