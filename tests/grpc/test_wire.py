"""The hand-built ``RunEvent`` frames (gateway._grpc_wire) parse as the generated classes say."""
from __future__ import annotations

import asyncio

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
    notice = pb.RunEvent.FromString(w.notice_frame("LOG_STORAGE_FULL", "the log cannot store: é"))
    assert (notice.notice.reason, notice.notice.message) == ("LOG_STORAGE_FULL", "the log cannot store: é")
    assert not notice.chunks and not notice.HasField("end") and not notice.HasField("gap")
    ka = pb.RunEvent.FromString(w.KEEPALIVE)
    assert not ka.chunks and not ka.HasField("end") and not ka.HasField("gap")
    assert w.end_frame("x")[0] == w.END_TAG and w.gap_frame("1")[0] == w.GAP_TAG


class _Source:
    """The log-read surface the hub uses (async iteration of stored chunk bytes, ``raw``,
    ``aclose``, ``close_status``)."""

    def __init__(self, items: list[tuple[str, bytes]], gate: asyncio.Event) -> None:
        self._items, self._gate = items, gate
        self.close_status = "completed"
        self.raw = False  # the hub asks for the stored bytes

    def __aiter__(self) -> "_Source":
        return self

    async def __anext__(self) -> tuple[str, bytes]:
        assert self.raw
        if not self._items:
            raise StopAsyncIteration
        if len(self._items) == 5:
            await self._gate.wait()  # the first frames are taken before the rest arrive
        return self._items.pop(0)

    async def aclose(self) -> None:
        return None


async def test_hub_grpc_frames_stay_aligned_when_old_frames_are_dropped() -> None:
    import asyncio

    from gateway._fanout import RunHub

    gate = asyncio.Event()
    items = [(str(10 + i), b'{"type":"X","i":%d}' % i) for i in range(12)]

    class Log:
        def read(self, run_id: str, after: str) -> _Source:
            return _Source(list(items), gate)

    hub = RunHub("r", Log(), max_frames=4)
    hub.start()
    while hub.end < 7:
        await hub.changed(1.0)
    first, _, _ = hub.frames(hub.base, "grpc")  # builds the cached frames of the kept window
    assert [c.offset for c in pb.RunEvent.FromString(first).chunks] == ["13", "14", "15", "16"]
    gate.set()
    while not hub.closed:
        await hub.changed(1.0)
    assert hub.close_status == "completed" and hub.base == 8
    data, n, nxt = hub.frames(hub.base, "grpc")
    ev = pb.RunEvent.FromString(data)
    assert [c.offset for c in ev.chunks] == ["18", "19", "20", "21"] and (n, nxt) == (4, 12)
    assert [c.json for c in ev.chunks] == hub.payloads
    await hub.aclose()


async def test_hub_frames_stored_bytes_as_they_are_and_re_encodes_only_a_line_break() -> None:
    from gateway._fanout import RunHub

    gate = asyncio.Event()
    gate.set()
    stored = b'{"type":"TEXT_MESSAGE_CONTENT","delta":"h\\u00e9 \xc3\xa9 \\n"}'  # as the writer left it
    items = [("5", stored), ("6", b'{\n  "type": "X"\n}')]  # the second one no writer of baton's makes

    class Log:
        def read(self, run_id: str, after: str) -> _Source:
            return _Source(list(items), gate)

    hub = RunHub("r", Log())
    hub.start()
    while not hub.closed:
        await hub.changed(1.0)
    assert hub.payloads == [stored, b'{"type":"X"}']
    data, n, _ = hub.frames(hub.base, "sse")
    assert data == b"id: 5\ndata: " + stored + b"\n\nid: 6\ndata: {\"type\":\"X\"}\n\n" and n == 2
    await hub.aclose()
