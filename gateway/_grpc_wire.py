"""The ``baton.v1.RunEvent`` wire bytes of log chunks, built without protobuf objects.

The shared tail (:mod:`gateway._fanout`) frames each chunk once per framing; for gRPC a
frame is the encoding of one ``RunEvent.chunks`` entry, and the concatenation of frames is
itself a valid ``RunEvent`` (repeated fields concatenate), so a reader takes every waiting
chunk in one message with no per-reader encoding. The Runs servicer sends these bytes as
they are (its streaming methods have no response serializer). The encodings are checked
against the generated classes in tests/grpc/test_wire.py.
"""
from __future__ import annotations

# Field tags (field number << 3 | wire type 2 = length-delimited).
_CHUNKS = 0x0A   # RunEvent.chunks = 1
_GAP = 0x12      # RunEvent.gap = 2
_END = 0x1A      # RunEvent.end = 3
_NOTICE = 0x22   # RunEvent.notice = 4
_F1 = 0x0A       # LogChunk.offset = 1, LogGap.earliest_offset = 1, LogEnd.status = 1
_F2 = 0x12       # LogChunk.json = 2


_SMALL = tuple(bytes((i,)) for i in range(0x80))


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n]
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: int, value: bytes) -> bytes:
    return bytes((tag,)) + _varint(len(value)) + value


def chunk_frame(offset: bytes, payload: bytes) -> bytes:
    """One ``RunEvent.chunks`` entry: ``offset`` (ASCII digits) and the chunk's JSON bytes."""
    if len(offset) >= 0x80:  # never for a stream sequence; kept correct anyway
        return _field(_CHUNKS, _field(_F1, offset) + _field(_F2, payload))
    # One formatting call per chunk (this runs once per chunk per reader batch):
    # tag, length, then LogChunk's offset and json fields.
    vp = _varint(len(payload))
    inner = 3 + len(offset) + len(vp) + len(payload)
    return b"\n%b\n%b%b\x12%b%b" % (_varint(inner), _SMALL[len(offset)], offset, vp, payload)


def gap_frame(earliest_offset: str) -> bytes:
    """A whole ``RunEvent`` with ``gap`` set."""
    return _field(_GAP, _field(_F1, earliest_offset.encode()) if earliest_offset else b"")


def end_frame(status: str | None) -> bytes:
    """A whole ``RunEvent`` with ``end`` set (present even when the status is unknown)."""
    return _field(_END, _field(_F1, status.encode()) if status else b"")


def notice_frame(reason: str, message: str) -> bytes:
    """A whole ``RunEvent`` with ``notice`` set (no chunk: it also serves as keep-alive)."""
    return _field(_NOTICE, _field(_F1, reason.encode()) + _field(_F2, message.encode()))


KEEPALIVE = b""  # an empty RunEvent
END_TAG = _END
GAP_TAG = _GAP
