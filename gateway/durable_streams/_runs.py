"""A run's delivery log as a read-only Durable Stream: ``/ds/runs/<runId>``.

The stream is the run's chunks, in JSON mode (one AG-UI event per message). Its offsets are
the log's own: ``0000000000000000_<stream sequence, 16 digits>``, so a protocol client
resumes exactly where baton's own readers would. The stream is closed once the log's close
record is stored (the run ended). Writes are refused (405): only the run's fenced writer
appends to its log. Tenancy is the gateway's: another tenant's run is 404.

The ``/ds`` edge of the run service (:class:`gateway._service.RunService`): reads are the
service's (:class:`gateway._reader.RunRead`), served from the run's shared tail like every
HTTP and gRPC reader of the run, with a presence key while a live read (SSE, long-poll)
waits, and a GET looks at the run for a takeover as a join does. A catch-up read is bounded
by the log's tail at request time, whatever that record's kind.

Joining from a snapshot (docs/api.md "Joining from a snapshot"): ``offset=snapshot`` reads
the run's latest snapshot's events, then the chunks after the offset it covers, as one
stream; ``Stream-Next-Offset`` (and an SSE control event's offset) is a real log offset, so
the client reads on from it exactly once. A run without a snapshot yet is read from the
start. A read from the start (``offset=-1`` or none) of a compacted log gets the
``CUSTOM stream.compacted`` event, then the final snapshot, then what follows: never a
silent gap.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from baton import errors as e
from baton.ids import validate_id
from baton.keep import check_keep_ttl
from baton.runs import TERMINAL_PB
from gateway._service import _keep
from gateway._reader import CaughtUp, Chunks, End, Failed, Gap, RunRead, SnapshotStep
from gateway._snapshots import ServedSnapshot, log_compacted
from gateway.durable_streams import _protocol as P
from gateway.durable_streams._routes import DSSettings, text

CONTENT_TYPE = "application/json"
SNAPSHOT = "snapshot"  # the read offset of a join from the latest snapshot
KEEP_PARAM = "keepTtl"  # a read's keep-alive, as on /api/chat's join


def to_ds(seq: int) -> str:
    """The protocol offset of a log position (the stream sequence of the last record read)."""
    return P.make_offset(seq)


def from_ds(offset: str) -> str:
    """A protocol read offset as a log offset (``-1``, ``now`` or a decimal sequence)."""
    if offset in ("-1", "now"):
        return offset
    seq = P.offset_position(offset)
    return str(seq) if seq > 0 else "-1"


async def _opened(read: RunRead) -> RunRead:
    """Open ``read``; an offset older than retention or a log that does not answer is the
    request's error (mapped to its status), not a stream.

    Raises:
        OffsetExpired, LogUnavailable.
    """
    first = await read.open()
    if first is None:
        return read
    await read.aclose()
    if isinstance(first, Gap):
        raise e.OffsetExpired(read.run_id, read.after, first.earliest)
    raise e.LogUnavailable(read.run_id, "reading the log failed")


def _json_array(payloads: list[bytes]) -> bytes:
    return b"[" + b",".join(payloads) + b"]"


class RunLogs:
    """Serves ``/ds/runs/<runId>`` through the gateway's run service.

    Args:
        runs: the run service (``gateway._service.RunService``).
        settings: the protocol's limits.
    """

    def __init__(self, runs: Any, settings: DSSettings) -> None:
        self._runs = runs
        self._log = runs.state.log
        self._settings = settings

    async def handle(self, request: Request, raw_id: str, tenant: str) -> Response:
        """Dispatch a request for one run's log."""
        run_id = validate_id(raw_id, "runId")
        method = request.method.upper()
        # ``keepTtl`` (seconds) on a GET keeps the run that long should it be detached, as on
        # a join of /api/chat (docs/api.md "Keeping a detached run"); checked before anything.
        keep_ttl = 0.0
        if method == "GET" and KEEP_PARAM in request.query_params:
            keep_ttl = check_keep_ttl(request.query_params[KEEP_PARAM], KEEP_PARAM)
        # 404 for unknown or other tenants' runs; a read looks at the run for a takeover.
        view = await self._runs.read_view(tenant, run_id, reading=method == "GET")
        if method in ("PUT", "POST", "DELETE"):
            return text(405, "A run's log is read-only: only the run's fenced writer appends to it",
                        {"allow": "GET, HEAD, OPTIONS"})
        if keep_ttl > 0 and view.record.status not in TERMINAL_PB:
            try:
                await _keep.keep_run(self._runs.state, tenant, _keep.KeepRequest(run_id, keep_ttl))
            except e.RunEnded:
                pass  # it ended meanwhile: nothing to keep, the read serves its end
        tail = await self._log.last_record(run_id)
        tail_seq = tail.offset if tail is not None else 0
        closed = tail is not None and tail.kind == "close"
        public = request.url.path
        if method == "HEAD":
            headers = {P.NEXT_OFFSET: to_ds(tail_seq), "content-type": CONTENT_TYPE, "cache-control": "no-store",
                       "etag": P.etag(public, "-1", to_ds(tail_seq), closed)}
            if closed:
                headers[P.CLOSED] = "true"
            return Response(b"", status_code=200, headers=headers)
        if method != "GET":
            return text(405, "Method not allowed")
        q = request.query_params
        offset = q.get("offset")
        live = q.get("live")
        cursor = q.get("cursor")
        if offset is not None and offset != SNAPSHOT and (offset == "" or not P.valid_read_offset(offset)):
            raise P.ProtocolError(400, "Invalid offset format")
        if len(q.getlist("offset")) > 1:
            raise P.ProtocolError(400, "Multiple offset parameters not allowed")
        if live is not None and live not in ("long-poll", "sse"):
            raise P.ProtocolError(400, "Invalid live mode")
        if live is not None and offset is None:
            raise P.ProtocolError(400, "Live modes require an offset")
        after = "-1" if offset == SNAPSHOT else from_ds(offset or "-1")
        if after == "now":
            after = str(tail_seq) if tail_seq else "-1"
        snap = await self._snapshot(run_id, offset or "-1")
        if snap is not None:
            after = str(snap.offset)
        start_seq = int(after) if after != "-1" else 0
        if live == "sse":
            read = self._runs.read(run_id, after)
            read.snapshot = snap  # its own read from the snapshot's offset, not the shared tail
            read = await _opened(read)
            return StreamingResponse(self._sse(read, start_seq, tail_seq, cursor),
                                     headers={"content-type": "text/event-stream", "cache-control": "no-cache"})
        items, end, closed = await self._catch_up(run_id, after, start_seq, tail_seq, closed)
        if snap is not None:
            items[:0] = snap.events
        if not items and live == "long-poll":
            if not closed:
                items, end, closed = await self._long_poll(run_id, after, start_seq)
            if not items:
                headers = {P.NEXT_OFFSET: to_ds(end), P.UP_TO_DATE: "true", P.CURSOR: P.response_cursor(cursor)}
                if closed:
                    headers[P.CLOSED] = "true"
                return Response(b"", status_code=204, headers=headers)
        headers = {P.NEXT_OFFSET: to_ds(end), P.UP_TO_DATE: "true", "content-type": CONTENT_TYPE}
        if closed:
            headers[P.CLOSED] = "true"
        if live == "long-poll":
            headers[P.CURSOR] = P.response_cursor(cursor)
        tag = P.etag(public, offset or "-1", to_ds(end), closed)
        headers["etag"] = tag
        if request.headers.get("if-none-match") == tag:
            return Response(b"", status_code=304, headers={"etag": tag})
        return Response(_json_array(items), status_code=200, headers=headers)

    async def _snapshot(self, run_id: str, offset: str) -> ServedSnapshot | None:
        """What a read from ``offset`` starts with: the latest snapshot for ``snapshot``, the
        final one after the ``stream.compacted`` event for the start of a compacted log, else
        nothing.

        Raises:
            LogUnavailable: JetStream did not answer.
        """
        state = self._runs.state
        if offset == SNAPSHOT:
            return await state.snapshots.latest(self._log, run_id)  # type: ignore[no-any-return]
        if offset == "-1" and await log_compacted(self._log, run_id):
            served = await state.snapshots.latest(self._log, run_id)
            return served.compacted() if served is not None else None
        return None

    async def _catch_up(self, run_id: str, after: str, start_seq: int, tail_seq: int,
                        closed: bool) -> tuple[list[bytes], int, bool]:
        """Chunks after ``after`` up to the tail known now: ``(chunk JSON, end seq, closed)``."""
        if tail_seq <= start_seq:
            return [], max(tail_seq, start_seq), closed
        items: list[bytes] = []
        # Not a live reader: no presence key for a read that ends at the tail.
        async with await _opened(self._runs.read(run_id, after, until=tail_seq, presence=False)) as read:
            while True:
                step = await read.next(self._settings.long_poll_timeout)
                if isinstance(step, Chunks):
                    items += [payload for _, payload in step.items()]
                elif isinstance(step, (CaughtUp, End)):
                    return items, tail_seq, closed
                elif isinstance(step, (Gap, Failed)):
                    raise e.LogUnavailable(run_id, "reading the log failed")

    async def _long_poll(self, run_id: str, after: str, start_seq: int) -> tuple[list[bytes], int, bool]:
        """Wait up to the long-poll timeout for chunks after ``after``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.long_poll_timeout
        async with await _opened(self._runs.read(run_id, after)) as read:
            while (left := deadline - loop.time()) > 0:
                step = await read.next(left)
                if step is None:
                    break
                if isinstance(step, Chunks):
                    if step.count:
                        return [payload for _, payload in step.items()], step.position, False
                    continue  # only the position moved
                if isinstance(step, End):
                    return [], step.position or await self._tail(run_id, start_seq), True
                raise e.LogUnavailable(run_id, "reading the log failed")
        return [], start_seq, False

    async def _tail(self, run_id: str, default: int) -> int:
        tail = await self._log.last_record(run_id)
        return tail.offset if tail is not None else default

    async def _sse(self, read: RunRead, start_seq: int, tail_seq: int, cursor: str | None) -> AsyncIterator[bytes]:
        """Data events for each chunk, control events with offsets; ends once the run's log closes."""
        current = start_seq
        try:
            if start_seq >= tail_seq:
                yield P.control_event(to_ds(max(start_seq, tail_seq)), cursor=P.response_cursor(cursor),
                                      up_to_date=True, closed=False)
            while True:
                step = await read.next(self._settings.long_poll_timeout)
                if step is None:
                    yield P.control_event(to_ds(current), cursor=P.response_cursor(cursor), up_to_date=True,
                                          closed=False)
                    continue
                if isinstance(step, SnapshotStep):
                    snap = step.snapshot
                    current = max(current, snap.offset)
                    payload = b"[" + b",".join(snap.events) + b"]"
                    yield P.sse_event("data", payload.decode()) + P.control_event(
                        to_ds(current), cursor=P.response_cursor(cursor), up_to_date=current >= tail_seq,
                        closed=False)
                    continue
                if isinstance(step, Chunks):
                    items = step.items()
                    out = bytearray()
                    for i, (seq, payload) in enumerate(items):
                        current = seq
                        up = i == len(items) - 1 and step.position >= tail_seq
                        out += P.sse_event("data", f"[{payload.decode()}]") + P.control_event(
                            to_ds(current), cursor=P.response_cursor(cursor), up_to_date=up, closed=False)
                    if out:
                        yield bytes(out)
                    continue
                if isinstance(step, End):
                    end = max(current, step.position or await self._tail(read.run_id, current))
                    yield P.control_event(to_ds(end), cursor=None, up_to_date=True, closed=True)
                return  # a failed read ends without the close: the client reads again from its offset
        finally:
            await read.aclose()
