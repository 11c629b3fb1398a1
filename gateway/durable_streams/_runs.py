"""A run's delivery log as a read-only Durable Stream: ``/ds/runs/<runId>``.

The stream is the run's chunks, in JSON mode (one AG-UI event per message). Its offsets are
the log's own: ``0000000000000000_<stream sequence, 16 digits>``, so a protocol client
resumes exactly where baton's own readers would. The stream is closed once the log's close
record is stored (the run ended). Reads go through baton's one log reader
(:class:`baton.log.LogReader`); writes are refused (405): only the run's fenced writer
appends to its log. Tenancy is the gateway's: another tenant's run is 404.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from baton import errors as e
from baton.ids import validate_id
from baton.log import LogReader
from gateway._views import run_view_for
from gateway.durable_streams import _protocol as P
from gateway.durable_streams._routes import DSSettings, text

CONTENT_TYPE = "application/json"
_END = object()


def to_ds(seq: int) -> str:
    """The protocol offset of a log position (the stream sequence of the last record read)."""
    return P.make_offset(seq)


def from_ds(offset: str) -> str:
    """A protocol read offset as a log offset (``-1``, ``now`` or a decimal sequence)."""
    if offset in ("-1", "now"):
        return offset
    seq = P.offset_position(offset)
    return str(seq) if seq > 0 else "-1"


class _Feed:
    """A log reader pumped into a bounded queue by a task this object owns, so waits can
    time out without cancelling the reader (``("chunk", seq, value)``, then ``_END``)."""

    def __init__(self, reader: LogReader, maxsize: int = 256) -> None:
        self.reader = reader
        self.queue: asyncio.Queue[Any] = asyncio.Queue(maxsize)
        self._task = asyncio.get_running_loop().create_task(self._pump(), name=f"ds-run-feed:{reader.run_id}")

    async def _pump(self) -> None:
        try:
            async for offset, chunk in self.reader:
                await self.queue.put((int(offset), chunk))
        except e.BatonError:
            pass  # the read failed (LogUnavailable, OffsetExpired): the reader gets the end below
        # Waits for room like every chunk did: a full queue at the close must not drop the end.
        await self.queue.put(_END)

    async def aclose(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        await self.reader.aclose()


class RunLogs:
    """Serves ``/ds/runs/<runId>`` from the gateway's delivery log and coordinator."""

    def __init__(self, state: Any, settings: DSSettings) -> None:
        self._st = state
        self._settings = settings

    async def handle(self, request: Request, raw_id: str, tenant: str) -> Response:
        """Dispatch a request for one run's log."""
        run_id = validate_id(raw_id, "runId")
        await run_view_for(self._st, tenant, run_id)  # 404 for unknown or other tenants' runs
        method = request.method.upper()
        if method in ("PUT", "POST", "DELETE"):
            return text(405, "A run's log is read-only: only the run's fenced writer appends to it",
                        {"allow": "GET, HEAD, OPTIONS"})
        tail = await self._st.log.last_record(run_id)
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
        if offset is not None and (offset == "" or not P.valid_read_offset(offset)):
            raise P.ProtocolError(400, "Invalid offset format")
        if len(q.getlist("offset")) > 1:
            raise P.ProtocolError(400, "Multiple offset parameters not allowed")
        if live is not None and live not in ("long-poll", "sse"):
            raise P.ProtocolError(400, "Invalid live mode")
        if live is not None and offset is None:
            raise P.ProtocolError(400, "Live modes require an offset")
        after = from_ds(offset or "-1")
        if after == "now":
            after = str(tail_seq) if tail_seq else "-1"
        start_seq = int(after) if after != "-1" else 0
        if live == "sse":
            return StreamingResponse(self._sse(run_id, after, start_seq, tail_seq, cursor),
                                     headers={"content-type": "text/event-stream", "cache-control": "no-cache"})
        items, end, closed = await self._catch_up(run_id, after, start_seq, tail_seq, closed)
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
        body = "[" + ",".join(json.dumps(c, separators=(",", ":"), ensure_ascii=False) for c in items) + "]"
        return Response(body.encode(), status_code=200, headers=headers)

    async def _catch_up(self, run_id: str, after: str, start_seq: int, tail_seq: int,
                        closed: bool) -> tuple[list[Any], int, bool]:
        """Chunks after ``after`` up to the tail known now: ``(chunks, end seq, closed)``."""
        if tail_seq <= start_seq:
            return [], max(tail_seq, start_seq), closed
        items: list[Any] = []
        async with self._st.log.read(run_id, after) as reader:
            reader.until = tail_seq
            async for _, chunk in reader:
                items.append(chunk)
        return items, tail_seq, closed

    async def _long_poll(self, run_id: str, after: str, start_seq: int) -> tuple[list[Any], int, bool]:
        """Wait up to the long-poll timeout for chunks after ``after``."""
        feed = _Feed(self._st.log.read(run_id, after))
        try:
            try:
                async with asyncio.timeout(self._settings.long_poll_timeout):
                    first = await feed.queue.get()
            except TimeoutError:
                return [], start_seq, False
            if first is _END:
                tail = await self._st.log.last_record(run_id)
                return [], tail.offset if tail else start_seq, True
            items = [first[1]]
            end = first[0]
            while not feed.queue.empty():
                nxt = feed.queue.get_nowait()
                if nxt is _END:
                    break
                end = nxt[0]
                items.append(nxt[1])
            return items, end, False
        finally:
            await feed.aclose()

    async def _sse(self, run_id: str, after: str, start_seq: int, tail_seq: int,
                   cursor: str | None) -> AsyncIterator[bytes]:
        """Data events for each chunk, control events with offsets; ends once the run's log closes."""
        feed = _Feed(self._st.log.read(run_id, after))
        current = start_seq
        try:
            if start_seq >= tail_seq:
                yield P.control_event(to_ds(max(start_seq, tail_seq)), cursor=P.response_cursor(cursor),
                                      up_to_date=True, closed=False)
            while True:
                try:
                    async with asyncio.timeout(self._settings.long_poll_timeout):
                        item = await feed.queue.get()
                except TimeoutError:
                    yield P.control_event(to_ds(current), cursor=P.response_cursor(cursor), up_to_date=True,
                                          closed=False)
                    continue
                if item is _END:
                    tail = await self._st.log.last_record(run_id)
                    end = max(current, tail.offset if tail else current)
                    yield P.control_event(to_ds(end), cursor=None, up_to_date=True, closed=True)
                    return
                current = item[0]
                payload = json.dumps(item[1], separators=(",", ":"), ensure_ascii=False)
                up = current >= tail_seq and feed.queue.empty()
                yield P.sse_event("data", f"[{payload}]") + P.control_event(
                    to_ds(current), cursor=P.response_cursor(cursor), up_to_date=up, closed=False)
        finally:
            await feed.aclose()

