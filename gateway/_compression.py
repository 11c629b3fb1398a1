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

A write's bytes depend only on the text before it (its preset dictionary) and its own, so
readers of one run at the same place, given the same chunk, are given the same bytes: the
last small writes are kept (:class:`SharedWrites`) and a reader whose last :data:`WINDOW`
bytes and next write equal one of them sends its bytes without compressing again (a
thousand readers of a run's live tail: one compression per chunk). A write larger than
:data:`SHARED_MAX_BYTES` starts without a dictionary (it loses back-references to 4 KiB
before it, nothing more), so it is the same bytes whatever came before: readers given the
same large chunk, or the same catch-up batch, share one compression, made off the event
loop from :data:`OFF_LOOP_BYTES` on (zlib lets go of the GIL), so a tool result of many MiB
does not stall other streams (the loop still hashes it to find it, and sums its CRC-32, once
per reader: a MiB costs about a millisecond there).

Only what was sent counts: a write's CRC, length and tail are taken by
:meth:`GzipStream.sent` once the server took its bytes, so a stream ended while a write waited (a gateway shut down
under a reader that stopped reading) ends with the trailer of what the client has.
"""
from __future__ import annotations

import asyncio
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor

#: magic, CM=8 (deflate), FLG=0, MTIME=0 (none), XFL=0, OS=255 (unknown): RFC 1952 §2.3.
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
#: A final deflate block with no data (BFINAL=1, fixed codes, end-of-block): ends every
#: stream (each write's compressor went with it).
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


#: Small writes kept for readers at the same place (:class:`SharedWrites`).
SHARED_WRITES = 64
#: Bytes of a small write's dictionary in its key (:class:`SharedWrites`).
KEY_TAIL = 64
#: The largest write compressed after the stream's tail (a reader's live chunk is one
#: frame); a larger one starts afresh and is shared by its bytes alone.
SHARED_MAX_BYTES = 16 << 10
#: Bytes of large writes kept at most (their text and their compressed bytes).
SHARED_LARGE_BYTES = 32 << 20
#: A write at least this large is compressed in a worker thread (about 2 ms of CPU here;
#: a smaller one is compressed on the loop, once for the readers given it).
OFF_LOOP_BYTES = 64 << 10
#: Threads compressing large writes (the machine's cores are what they can use).
LARGE_WRITE_THREADS = 2
#: The longest ``Accept-Encoding`` value looked at (real ones are about 30 bytes): a longer
#: one gets identity, which is always acceptable, without parsing it.
MAX_ACCEPT_ENCODING = 1024


class SharedWrites:
    """The bytes of the last writes, for readers given the same text at the same place.

    Deflate is deterministic: the same preset dictionary and the same input, with the same
    level, window and memLevel, give the same bytes. A small write's entry is used only
    when both its dictionary and its input equal the writer's, byte for byte (the key holds
    the dictionary's last :data:`KEY_TAIL` bytes only, which narrows the look-up at the cost
    of a few dozen bytes where a CRC-32 of the whole window cost more than a hit saves in a
    burst); a large write's, when its input does. First in,
    first out: :data:`SHARED_WRITES` small ones, :data:`SHARED_LARGE_BYTES` of large ones (a
    write larger than that is shared only by the readers that ask while it is made). One per
    gateway (its lifespan's state), used from its event loop; :meth:`close` when it stops.
    Large writes are compressed by a pool of its own (:data:`LARGE_WRITE_THREADS`), so a
    storm of them never queues the loop's own uses of its default executor (name look-ups).
    """

    __slots__ = ("_small", "_large", "_large_bytes", "_size", "_pool", "hits")

    def __init__(self, size: int = SHARED_WRITES) -> None:
        self._small: dict[tuple[bytes, bytes], tuple[bytes, bytes]] = {}
        self._large: dict[bytes, asyncio.Future[bytes]] = {}
        self._large_bytes = 0
        self._size = size
        self._pool: ThreadPoolExecutor | None = None
        self.hits = 0

    def close(self) -> None:
        """Let the pool's threads go (a write compressing finishes first); drop what is kept."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        self._small.clear()
        self._large.clear()
        self._large_bytes = 0

    def compress(self, zdict: bytes, data: bytes) -> bytes:
        """``data`` (at most :data:`SHARED_MAX_BYTES`) deflated after ``zdict`` and
        sync-flushed: a kept write's bytes, or made and kept."""
        key = (zdict[-KEY_TAIL:], data)
        kept = self._small.get(key)
        if kept is not None and kept[0] == zdict:
            self.hits += 1
            return kept[1]
        body = _deflate(zdict, data)
        if key not in self._small and len(self._small) >= self._size:
            del self._small[next(iter(self._small))]
        self._small[key] = (zdict, body)
        return body

    async def compress_large(self, data: bytes) -> bytes:
        """``data`` (over :data:`SHARED_MAX_BYTES`) deflated afresh and sync-flushed: a
        kept write's bytes, or one compression for every reader waiting for it, off the
        event loop from :data:`OFF_LOOP_BYTES` on.

        Raises:
            MemoryError: as zlib does (every waiter gets it; it is not kept).
        """
        made = self._large.get(data)
        if made is not None:
            self.hits += 1
        else:
            loop = asyncio.get_running_loop()
            if len(data) >= OFF_LOOP_BYTES:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(LARGE_WRITE_THREADS, thread_name_prefix="gzip-large-write")
                # zlib lets go of the GIL while it compresses: the loop serves the other
                # streams meanwhile.
                made = loop.run_in_executor(self._pool, _deflate, b"", data)
            else:
                made = loop.create_future()
                made.set_result(_deflate(b"", data))
            self._large[data] = made
            self._large_bytes += 2 * len(data)
            while self._large_bytes > SHARED_LARGE_BYTES and len(self._large) > 1:
                oldest = next(iter(self._large))
                del self._large[oldest]
                self._large_bytes -= 2 * len(oldest)
            made.add_done_callback(lambda f: self._settled(data, f))
        # Shielded: a reader that goes away while it waits does not cancel the others' wait.
        return await asyncio.shield(made)

    def _settled(self, data: bytes, made: asyncio.Future[bytes]) -> None:
        """A large write's compression ended: forget it when it failed, or when it alone is
        over the bound (kept only for the readers that asked while it was made)."""
        failed = made.cancelled() or made.exception() is not None
        if (failed or 2 * len(data) > SHARED_LARGE_BYTES) and self._large.get(data) is made:
            del self._large[data]
            self._large_bytes -= 2 * len(data)


def _deflate(zdict: bytes, data: bytes) -> bytes:
    """``data`` as raw deflate blocks after the preset dictionary ``zdict``, sync-flushed."""
    if zdict:
        deflate = zlib.compressobj(LEVEL, zlib.DEFLATED, -WINDOW_BITS, MEM_LEVEL, zdict=zdict)
    else:
        deflate = zlib.compressobj(LEVEL, zlib.DEFLATED, -WINDOW_BITS, MEM_LEVEL)
    return deflate.compress(data) + deflate.flush(zlib.Z_SYNC_FLUSH)


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether an ``Accept-Encoding`` value admits gzip (RFC 9110 §12.5.3).

    ``gzip`` (or ``x-gzip``) with a weight above 0, or ``*`` above 0 when gzip is not
    named. A weight that is not a number refuses the coding it is on (identity is always
    acceptable, so a bad header costs bytes, never the stream), as does a value longer than
    :data:`MAX_ACCEPT_ENCODING`.
    """
    if not accept_encoding or len(accept_encoding) > MAX_ACCEPT_ENCODING:
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

    ``write_small(data)`` (at most :data:`SHARED_MAX_BYTES`) or ``await write(data)`` → the
    bytes to send for one piece (the header first), decodable on arrival; ``sent()`` once
    the server took them; ``finish()`` → the last bytes (the final block and the trailer of
    what was sent). Between writes it holds the stream's last :data:`WINDOW` bytes of text
    and two integers. One per response.
    """

    __slots__ = ("_tail", "_crc", "_size", "_started", "_pending", "_shared")

    def __init__(self, shared: SharedWrites) -> None:
        self._shared = shared
        #: The sent text's last bytes (at most :data:`WINDOW`): the next write's preset
        #: dictionary.
        self._tail = b""
        self._crc = 0
        self._size = 0
        self._started = False  # the header was sent
        #: The last write's (crc, size, tail), until :meth:`sent`.
        self._pending: tuple[int, int, bytes] | None = None

    def write_small(self, data: bytes) -> bytes:
        """The encoded bytes of ``data`` (at most :data:`SHARED_MAX_BYTES`), ending at a byte
        boundary the client can inflate up to; they count once :meth:`sent` says the server
        took them (another write before that replaces this one: it was not sent)."""
        head = b"" if self._started else GZIP_HEADER
        if not data:
            self._pending = (self._crc, self._size, self._tail)
            return head
        body = self._shared.compress(self._tail, data)
        tail = data[-WINDOW:] if len(data) >= WINDOW else (self._tail + data)[-WINDOW:]
        self._pending = (zlib.crc32(data, self._crc), (self._size + len(data)) & 0xFFFFFFFF, tail)
        return head + body if head else body

    async def write(self, data: bytes) -> bytes:
        """:meth:`write_small`, or for a larger ``data`` its shared compression
        (:meth:`SharedWrites.compress_large`)."""
        if len(data) <= SHARED_MAX_BYTES:
            return self.write_small(data)
        head = b"" if self._started else GZIP_HEADER
        body = await self._shared.compress_large(data)
        size = (self._size + len(data)) & 0xFFFFFFFF
        self._pending = (zlib.crc32(data, self._crc), size, data[-WINDOW:])
        return head + body if head else body

    def sent(self) -> None:
        """The last write's bytes went out: they count for the next write and the trailer."""
        if self._pending is not None:
            self._crc, self._size, self._tail = self._pending
            self._pending = None
            self._started = True

    def finish(self) -> bytes:
        """The stream's last bytes: the header when none was sent, the final block and the
        trailer (CRC-32 and length of what was sent). The same bytes until the stream is
        dropped, so a final write that did not go out can be sent again."""
        self._pending = None
        head = b"" if self._started else GZIP_HEADER
        return head + FINAL_EMPTY_BLOCK + struct.pack("<II", self._crc, self._size)
