"""``FileChunk`` written and read without a protobuf message (sandbox_host/daemon/_wire.py):
the same bytes as protobuf's own encoding, and any other encoding read by protobuf."""
from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError

from baton.v1 import sandbox_daemon_pb2 as pb
from sandbox_host.daemon._wire import Chunk, decode_chunk, encode_chunk


@pytest.mark.parametrize("size", [0, 5, 1 << 40])
@pytest.mark.parametrize("offset", [0, 1, 127, 128, 300, 1 << 40])
@pytest.mark.parametrize("data", [b"", b"a", b"x" * 200, b"\n" * 70000])
def test_round_trip_and_protobuf_agree(data: bytes, offset: int, size: int) -> None:
    wire = encode_chunk(Chunk(data, offset, size))
    msg = pb.FileChunk.FromString(wire)
    assert (msg.data, msg.offset, msg.size) == (data, offset, size)
    assert decode_chunk(wire) == (data, offset, size)
    theirs = pb.FileChunk(data=data, offset=offset, size=size)
    assert decode_chunk(theirs.SerializeToString()) == (data, offset, size)
    assert encode_chunk(theirs) == theirs.SerializeToString()


def test_a_daemon_that_does_not_tell_the_size() -> None:
    """An older daemon's chunk (no field 3) reads as size 0: not told."""
    assert decode_chunk(b"\x0a\x02hi\x10\x05") == Chunk(b"hi", 5, 0)


@pytest.mark.parametrize("wire", [
    b"\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # offset -1
    b"\x0a\x01x\x10\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",  # offset -2**63
    b"\x0a\x01x\x10\x00\x18\xfb\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # size -5
    b"\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f",  # an over-long varint: protobuf keeps 64 bits
])
def test_negative_and_over_long_values_read_as_protobuf_reads_them(wire: bytes) -> None:
    """int64 on the wire: what no daemon of ours sends (encode_chunk refuses negatives), read
    as protobuf reads it, not as a huge unsigned number."""
    msg = pb.FileChunk.FromString(wire)
    assert decode_chunk(wire) == (msg.data, msg.offset, msg.size)
    assert msg.offset < 0 or msg.size < 0


def test_other_layouts_are_read_by_protobuf() -> None:
    reordered = b"\x10\x05" + b"\x0a\x02hi"  # offset first
    assert decode_chunk(reordered) == (b"hi", 5, 0)
    with_unknown = encode_chunk(Chunk(b"hi", 5, 9)) + b"\x20\x01"  # a field 4
    assert decode_chunk(with_unknown) == (b"hi", 5, 9)
    with pytest.raises(DecodeError):
        decode_chunk(b"\x0a\x05hi")  # truncated
    with pytest.raises(ValueError):
        encode_chunk(Chunk(b"", -1))
    with pytest.raises(ValueError):
        encode_chunk(Chunk(b"", 0, -1))
