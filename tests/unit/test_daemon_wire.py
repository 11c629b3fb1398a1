"""``FileChunk`` written and read without a protobuf message (sandbox_host/daemon/_wire.py):
the same bytes as protobuf's own encoding, and any other encoding read by protobuf."""
from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError

from baton.v1 import sandbox_daemon_pb2 as pb
from sandbox_host.daemon._wire import Chunk, decode_chunk, encode_chunk


@pytest.mark.parametrize("offset", [0, 1, 127, 128, 300, 1 << 40])
@pytest.mark.parametrize("data", [b"", b"a", b"x" * 200, b"\n" * 70000])
def test_round_trip_and_protobuf_agree(data: bytes, offset: int) -> None:
    wire = encode_chunk(Chunk(data, offset))
    msg = pb.FileChunk.FromString(wire)
    assert (msg.data, msg.offset) == (data, offset)
    assert decode_chunk(wire) == (data, offset)
    assert decode_chunk(pb.FileChunk(data=data, offset=offset).SerializeToString()) == (data, offset)
    assert encode_chunk(pb.FileChunk(data=data, offset=offset)) == pb.FileChunk(data=data, offset=offset).SerializeToString()


def test_other_layouts_are_read_by_protobuf() -> None:
    reordered = b"\x10\x05" + b"\x0a\x02hi"  # offset first
    assert decode_chunk(reordered) == (b"hi", 5)
    with_unknown = encode_chunk(Chunk(b"hi", 5)) + b"\x18\x01"
    assert decode_chunk(with_unknown) == (b"hi", 5)
    with pytest.raises(DecodeError):
        decode_chunk(b"\x0a\x05hi")  # truncated
    with pytest.raises(ValueError):
        encode_chunk(Chunk(b"", -1))
