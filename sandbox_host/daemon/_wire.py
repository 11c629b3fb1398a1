"""``FileChunk`` (``baton.v1.SandboxDaemon.ReadFile``'s answer) on the wire without a protobuf
message in between (pure).

A journal catch-up streams megabytes: building a ``FileChunk`` copies its bytes into the
message and serializing copies them again, and on the host parsing one and reading its
``data`` copies twice more. These write and read the same protobuf encoding directly (field 1
``data``, length-delimited; field 2 ``offset`` and field 3 ``size``, varints), one copy each
way; any encoding they do not expect (fields reordered or repeated, unknown fields) is read by
protobuf itself.
"""
from __future__ import annotations

from typing import NamedTuple

from baton.v1 import sandbox_daemon_pb2 as pb


class Chunk(NamedTuple):
    """One ``FileChunk``: ``data`` starts at byte ``offset`` of the file; ``size`` is the
    file's size in bytes just after the daemon read it, on a follow (0: not told, as by a
    daemon from before the field)."""

    data: bytes
    offset: int
    size: int = 0


_INT64_LIMIT = 1 << 63


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def encode_chunk(chunk: Chunk | pb.FileChunk) -> bytes:
    """The ``FileChunk`` encoding of ``chunk`` (its data copied once).

    Raises:
        ValueError: a negative offset (never: offsets are file positions).
    """
    if isinstance(chunk, pb.FileChunk):
        return chunk.SerializeToString()
    data, offset, size = chunk
    if offset < 0 or size < 0:
        raise ValueError("a chunk's offset and size are never negative")
    if size:
        return b"".join((b"\x0a", _varint(len(data)), data, b"\x10", _varint(offset), b"\x18", _varint(size)))
    return b"".join((b"\x0a", _varint(len(data)), data, b"\x10", _varint(offset)))


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise IndexError("truncated varint")
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, i
        shift += 7


def decode_chunk(buf: bytes) -> Chunk:
    """A ``FileChunk`` from its encoding (its data copied once when laid out as
    :func:`encode_chunk` writes it; else parsed by protobuf).

    Raises:
        google.protobuf.message.DecodeError: not a ``FileChunk``.
    """
    try:
        data, offset, i = b"", 0, 0
        if buf[:1] == b"\x0a":
            n, i = _read_varint(buf, 1)
            if i + n > len(buf):
                raise IndexError("truncated data")
            data, i = buf[i:i + n], i + n
        if buf[i:i + 1] == b"\x10":
            offset, i = _read_varint(buf, i + 1)
        size = 0
        if buf[i:i + 1] == b"\x18":
            size, i = _read_varint(buf, i + 1)
        # int64 fields: a value from 2**63 up is negative (or over-long) on the wire, for
        # protobuf's own reading below.
        if i == len(buf) and offset < _INT64_LIMIT and size < _INT64_LIMIT:
            return Chunk(data, offset, size)
    except IndexError:
        pass
    msg = pb.FileChunk.FromString(buf)
    return Chunk(msg.data, msg.offset, msg.size)


__all__ = ["Chunk", "decode_chunk", "encode_chunk"]
