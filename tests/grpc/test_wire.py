"""The hand-built ``RunEvent`` frames (gateway._grpc_wire) parse as the generated classes say."""
from __future__ import annotations

from baton.v1 import runs_service_pb2 as pb
from gateway import _grpc_wire as w


def test_frames_concatenate_into_one_run_event() -> None:
    big = b'{"type":"TEXT_MESSAGE_CONTENT","delta":"' + "é".encode() * 300 + b'"}'
    data = w.chunk_frame(b"7", b'{"type":"RUN_STARTED"}') + w.chunk_frame(b"123456789012", big)
    ev = pb.RunEvent.FromString(data)
    assert [(c.offset, c.json) for c in ev.chunks] == [("7", b'{"type":"RUN_STARTED"}'), ("123456789012", big)]
    assert not ev.HasField("end") and not ev.HasField("gap")
    assert data == pb.RunEvent(chunks=[pb.LogChunk(offset="7", json=b'{"type":"RUN_STARTED"}'),
                                       pb.LogChunk(offset="123456789012", json=big)]).SerializeToString()


def test_end_gap_and_keepalive() -> None:
    end = pb.RunEvent.FromString(w.end_frame("completed"))
    assert end.HasField("end") and end.end.status == "completed" and not end.chunks
    unknown = pb.RunEvent.FromString(w.end_frame(None))
    assert unknown.HasField("end") and unknown.end.status == ""
    gap = pb.RunEvent.FromString(w.gap_frame("42"))
    assert gap.HasField("gap") and gap.gap.earliest_offset == "42" and not gap.HasField("end")
    ka = pb.RunEvent.FromString(w.KEEPALIVE)
    assert not ka.chunks and not ka.HasField("end") and not ka.HasField("gap")
    assert w.end_frame("x")[0] == w.END_TAG and w.gap_frame("1")[0] == w.GAP_TAG
