"""A minimal HTTP/1.1 client over a raw socket, for the fuzz suite.

httpx (rightly) normalises what it sends: it re-encodes paths, refuses some header bytes and
merges nothing it is not told to. A fuzzer needs the exact bytes on the wire (``%00`` in a
path, two ``Authorization`` headers, a body that is not UTF-8) and an exact account of how
the answer ended: a complete response, or a connection the server dropped. One connection
per request (``Connection: close``), so one input's failure never touches another's.
"""
from __future__ import annotations

import asyncio
import dataclasses
import urllib.parse
from typing import Sequence

#: Content types of answers that stay open while a run or stream is live (SSE, NDJSON).
STREAMING_TYPES = ("text/event-stream", "application/x-ndjson")


@dataclasses.dataclass(frozen=True)
class Request:
    """One request as it goes on the wire (``target`` is the raw request-target)."""

    method: str
    target: bytes
    headers: Sequence[tuple[bytes, bytes]] = ()
    body: bytes = b""

    def encode(self) -> bytes:
        lines = [self.method.encode("latin-1") + b" " + self.target + b" HTTP/1.1", b"host: 127.0.0.1"]
        lines += [k + b": " + v for k, v in self.headers]
        lines += [b"content-length: " + str(len(self.body)).encode(), b"connection: close"]
        return b"\r\n".join(lines) + b"\r\n\r\n" + self.body

    def describe(self, limit: int = 300) -> str:
        """A short, exact description of the request for a failure message."""
        body = self.body if len(self.body) <= limit else self.body[:limit] + b"...(%d bytes)" % len(self.body)
        return f"{self.method} {self.target!r} headers={list(self.headers)!r} body={body!r}"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How the server answered.

    ``status`` is 0 when no status line arrived. ``complete`` is false when the connection
    ended before the response did (a drop); ``live`` when a streaming answer was still open
    at the read deadline (a run or stream that goes on: a complete answer so far).
    """

    status: int
    headers: dict[str, str]
    body: bytes
    complete: bool
    live: bool = False
    error: str = ""


class _Dropped(Exception):
    pass


async def exchange(port: int, req: Request, *, timeout: float, stream_grace: float) -> Outcome:
    """Send ``req`` to ``127.0.0.1:port`` and read the whole answer.

    Args:
        timeout: seconds the whole exchange may take (a non-streaming answer slower than
            this is reported incomplete, with ``error="timeout"``).
        stream_grace: seconds a streaming answer's body is read before it is left (``live``).
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        try:
            writer.write(req.encode())
            await writer.drain()
        except (ConnectionError, OSError):
            pass  # the server may answer (413, 400) before reading all of a body: read on
        try:
            async with asyncio.timeout(timeout):
                return await _read_response(reader, req.method, stream_grace)
        except TimeoutError:
            return Outcome(0, {}, b"", False, error="timeout")
        except (_Dropped, ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
            return Outcome(0, {}, b"", False, error=f"dropped: {exc!r}")
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionError, OSError):
            pass


async def _read_response(reader: asyncio.StreamReader, method: str, stream_grace: float) -> Outcome:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        raise _Dropped(f"connection closed after {len(exc.partial)} bytes of the head") from None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise _Dropped(f"bad status line {lines[0]!r}")
    status = int(parts[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return Outcome(status, headers, b"", True)
    streaming = headers.get("content-type", "").startswith(STREAMING_TYPES)
    try:
        if streaming:
            async with asyncio.timeout(stream_grace):
                body = await _read_body(reader, headers)
        else:
            body = await _read_body(reader, headers)
    except TimeoutError:
        return Outcome(status, headers, b"", True, live=True)
    return Outcome(status, headers, body, True)


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip() or b"x", 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers are sent
                return bytes(out)
            out += await reader.readexactly(size)
            if await reader.readexactly(2) != b"\r\n":
                raise _Dropped("bad chunk framing")
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    return await reader.read()  # delimited by the close


def encode_segment(value: str, how: int) -> str:
    """``value`` in a URL: escaped (0), "/" and "%" kept (1), escaped twice (2), or with
    every sub-delimiter kept (3)."""
    raw = value.encode("utf-8", "surrogatepass")
    if how == 0:
        return urllib.parse.quote_from_bytes(raw, safe="")
    if how == 1:
        return urllib.parse.quote_from_bytes(raw, safe="/%")
    if how == 2:
        return urllib.parse.quote(urllib.parse.quote_from_bytes(raw, safe=""), safe="")
    return urllib.parse.quote_from_bytes(raw, safe="/%:@!$&'()*+,;=~")


def header_value(value: str) -> bytes:
    """``value`` as header bytes (UTF-8, lone surrogates kept), without the bytes that would
    end the header (CR, LF) or that no HTTP parser takes (NUL): a well-framed request."""
    return value.encode("utf-8", "surrogatepass").translate(None, b"\r\n\x00")
