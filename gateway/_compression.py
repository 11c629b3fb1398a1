"""gzip for the gateway's long-lived streams: each write decodable when it arrives, and no
compressor held between writes.

A stream's body is a gzip member (RFC 1952) written here, not by :mod:`gzip`: a 10-byte
header, raw deflate (RFC 1951) blocks, then the CRC-32 and the length (mod 2**32) of what
was compressed. Every write ends with a sync flush (an empty stored block), so the client
inflates all of it at once: nothing of an event waits in the compressor for the next.

Each write is compressed by a deflate state of its own, made for it and let go after it,
primed with the stream's last :data:`WINDOW` bytes as its preset dictionary (zlib
``deflateSetDictionary``): the client's inflater holds exactly those bytes, so a write
refers back to them (an AG-UI chunk repeats ``"type":``, ``"messageId":`` and the id of
the one before) as one long-lived state would. Continuing a deflate stream with a new
compressor primed by the previous block's tail is how pigz compresses blocks in parallel
(pigz.c, ``deflateSetDictionary`` on each block). A stream between writes holds its
:data:`WINDOW` bytes of text only: a long-lived state is 30 KB, and a gateway's thousand
readers of one run, each given the same chunk at once, would all hold one (measured with
a state kept per stream: the gateway's RSS grew 2.1× what it grew with plain readers, in
bench/gateway.py's ``gateway_gzip``).
"""
from __future__ import annotations

import struct
import zlib

#: magic, CM=8 (deflate), FLG=0, MTIME=0 (none), XFL=0, OS=255 (unknown): RFC 1952 §2.3.
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
#: A final deflate block with no data (BFINAL=1, fixed codes, end-of-block): ends a
#: stream whose compressor was let go.
FINAL_EMPTY_BLOCK = b"\x03\x00"
WINDOW_BITS = 12
#: Bytes a write may refer back to (4 KiB). On the claude-stream-json corpus as AG-UI SSE
#: frames, one write per frame: 0.337 of the bytes at 10 µs a frame here (a 2 KiB window:
#: 0.395; zlib's 32 KiB with one state kept: 0.23, at 260 KB a stream).
WINDOW = 1 << WINDOW_BITS
#: zlib's memLevel: its hash table and pending buffer, zeroed for every write (4 KB each).
MEM_LEVEL = 4
#: zlib's level 1: on the corpus 0.337 of the bytes at 10 µs a frame, where level 3 gives
#: 0.327 at 16 µs (the preset dictionary is hashed again at each level's pace).
LEVEL = 1


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether an ``Accept-Encoding`` value admits gzip (RFC 9110 §12.5.3).

    ``gzip`` (or ``x-gzip``) with a weight above 0, or ``*`` above 0 when gzip is not
    named. A weight that is not a number refuses the coding it is on (identity is always
    acceptable, so a bad header costs bytes, never the stream).
    """
    if not accept_encoding:
        return False
    named: float | None = None
    star: float | None = None
    for item in accept_encoding.split(","):
        coding, _, params = item.partition(";")
        coding = coding.strip().lower()
        weight = _weight(params)
        if coding in ("gzip", "x-gzip"):
            named = weight if named is None else max(named, weight)
        elif coding == "*":
            star = weight
    if named is not None:
        return named > 0
    return star is not None and star > 0


def _weight(params: str) -> float:
    """The ``q`` of one coding's parameters: 1 when absent, 0 when malformed."""
    for param in params.split(";"):
        name, eq, value = param.partition("=")
        if eq and name.strip().lower() == "q":
            try:
                q = float(value.strip())
            except ValueError:
                return 0.0
            return q if 0.0 <= q <= 1.0 else 0.0
    return 1.0


class GzipStream:
    """One response body as a gzip member, written piece by piece.

    ``write`` → the bytes to send for one piece (the header first), decodable on arrival;
    ``finish`` → the last bytes (the final block and the trailer). Between writes it holds
    the stream's last :data:`WINDOW` bytes of text and two integers. One per response.
    """

    __slots__ = ("_tail", "_crc", "_size", "_started", "_finished")

    def __init__(self) -> None:
        #: The stream's last bytes of text (at most :data:`WINDOW`): the next write's
        #: preset dictionary.
        self._tail = b""
        self._crc = 0
        self._size = 0
        self._started = False
        self._finished = False

    def write(self, data: bytes) -> bytes:
        """The encoded bytes of ``data``, ending at a byte boundary the client can inflate
        up to. Raises ``RuntimeError`` after :meth:`finish`."""
        if self._finished:
            raise RuntimeError("gzip stream already finished")
        head = b""
        if not self._started:
            self._started = True
            head = GZIP_HEADER
        if not data:
            return head
        if self._tail:
            deflate = zlib.compressobj(LEVEL, zlib.DEFLATED, -WINDOW_BITS, MEM_LEVEL, zdict=self._tail)
        else:
            deflate = zlib.compressobj(LEVEL, zlib.DEFLATED, -WINDOW_BITS, MEM_LEVEL)
        body = deflate.compress(data) + deflate.flush(zlib.Z_SYNC_FLUSH)
        self._crc = zlib.crc32(data, self._crc)
        self._size = (self._size + len(data)) & 0xFFFFFFFF
        self._tail = data[-WINDOW:] if len(data) >= WINDOW else (self._tail + data)[-WINDOW:]
        return head + body if head else body

    def finish(self) -> bytes:
        """The stream's last bytes: the final block and the trailer (CRC-32, length);
        ``b""`` when called again."""
        if self._finished:
            return b""
        self._finished = True
        head = b"" if self._started else GZIP_HEADER
        self._started = True
        self._tail = b""
        return head + FINAL_EMPTY_BLOCK + struct.pack("<II", self._crc, self._size)
