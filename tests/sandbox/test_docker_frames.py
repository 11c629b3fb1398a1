"""The Engine API's multiplexed exec stream, decoded without an engine (pure)."""
from __future__ import annotations

import struct

import pytest

from sandbox_host.providers._docker_stream import FrameDecoder

pytestmark = pytest.mark.unit


def _frame(kind: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxL", kind, len(payload)) + payload


def test_frames_split_anywhere_give_their_payloads_in_order() -> None:
    wire = _frame(1, b"12\n") + _frame(1, b"") + _frame(2, b"err") + _frame(1, b"x" * 70_000)
    for piece in (1, 3, 7, 8, 9, 4096, len(wire)):
        dec = FrameDecoder()
        out = b"".join(dec.feed(wire[i:i + piece]) for i in range(0, len(wire), piece))
        assert out == b"12\nerr" + b"x" * 70_000


def test_an_incomplete_frame_gives_nothing_until_it_completes() -> None:
    dec = FrameDecoder()
    wire = _frame(1, b"hello")
    assert dec.feed(wire[:6]) == b""
    assert dec.feed(wire[6:-1]) == b""
    assert dec.feed(wire[-1:]) == b"hello"
