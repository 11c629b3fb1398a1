"""HTTP handlers of the Durable Streams protocol (PROTOCOL.md §5): PUT, POST, GET, HEAD, DELETE.

Every refusal is a :class:`~gateway.durable_streams._protocol.ProtocolError` mapped here to
its status with a plain-text reason; nothing a client sends reaches a 500.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable, Mapping

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope

from gateway.durable_streams import _protocol as P
from gateway.durable_streams._model import Message, StreamState, Verdict
from gateway.durable_streams._store import StreamStore


@dataclass(frozen=True)
class DSSettings:
    """Protocol limits.

    Attributes:
        long_poll_timeout: seconds a long-poll (or an idle SSE wait) holds before answering.
        max_append_bytes: largest request body; more is refused with 413.
        public_url: the ``/ds`` base URL as clients reach it (``https://baton.example/ds``),
            for ``Location``; empty: the address the gateway accepted the connection on.
    """

    long_poll_timeout: float = 20.0
    max_append_bytes: int = 1_000_000
    public_url: str = ""


def location(scope: Scope, public: str, public_url: str = "") -> str:
    """The ``Location`` of a created stream: ``public`` (the stream path under ``/ds``, as sent)
    under ``public_url``, else under the address and port the connection was accepted on
    (ASGI ``server``) and ``root_path``.

    Never the request's ``Host`` header: a client (or whoever stands before the gateway) must
    not choose where the answer points. The conformance suite wants an absolute URL.
    """
    if public_url:
        return public_url.rstrip("/") + public
    root: str = scope.get("root_path", "")
    server = scope.get("server")
    if not server:
        return root + public
    host, port = server
    if ":" in host:
        host = f"[{host}]"
    return f"{scope.get('scheme', 'http')}://{host}:{port}{root}{public}"


def text(status: int, body: str = "", headers: Mapping[str, str] | None = None) -> Response:
    """A plain-text response."""
    return Response(body, status_code=status, headers=dict(headers or {}), media_type="text/plain")


DRAIN_LIMIT = 64 << 20  # read (and drop) this much of a refused body so the client sees the 413


async def read_body(receive: Receive, limit: int) -> bytes:
    """The request body (read from the ASGI ``receive``), refused with 413 past ``limit`` bytes.

    A refused body is still read (and dropped) up to :data:`DRAIN_LIMIT`: answering while
    the client is still sending makes most HTTP clients report a connection error instead
    of the 413.

    Raises:
        ProtocolError: 413 past ``limit``.
        ClientDisconnect: the client went away before the body ended (as Starlette's
            ``Request.stream``).
    """
    chunks: list[bytes] = []
    seen = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            continue
        chunk = message.get("body", b"")
        seen += len(chunk)
        if seen <= limit and chunk:
            chunks.append(chunk)
        if not message.get("more_body", False) or seen > DRAIN_LIMIT:
            break
    if seen > limit:
        raise P.ProtocolError(413, "Payload too large")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)  # one chunk: no copy


class Reply:
    """A bodiless answer given as raw ASGI headers (lower-case names), sent as is.

    What an accepted append returns: no Starlette ``Response`` (header dict, lower-casing,
    content-length) to build on the protocol's hottest path. Like Starlette's
    ``Response(b"")``, a 200 carries ``content-length: 0`` and a 204 none.
    """

    __slots__ = ("status_code", "raw_headers")

    def __init__(self, status_code: int, raw_headers: list[tuple[bytes, bytes]]) -> None:
        self.status_code = status_code
        self.raw_headers = raw_headers
        if status_code == 200:
            raw_headers.append(_CONTENT_LENGTH_0)


_CONTENT_LENGTH_0 = (b"content-length", b"0")
_NEXT_OFFSET = P.NEXT_OFFSET.lower().encode()
_CLOSED_RAW = (P.CLOSED.lower().encode(), b"true")
_PRODUCER_EPOCH = P.PRODUCER_EPOCH.lower().encode()
_PRODUCER_SEQ = P.PRODUCER_SEQ.lower().encode()
_CLOSED_KEY = P.CLOSED.lower()
_SEQ_KEY = P.SEQ.lower()


class Handlers:
    """The protocol's methods over one :class:`StreamStore`.

    ``path`` arguments are store paths (tenant-qualified by the app); ``public`` is the path
    as the client wrote it (ETags and ``Location`` use it).
    """

    def __init__(self, store: StreamStore, settings: DSSettings) -> None:
        self.store = store
        self.settings = settings

    async def put(self, request: Request, path: str, public: str, qualify: Callable[[str], str]) -> Response:
        h = request.headers
        forked_from = h.get(P.FORKED_FROM)
        ct = P.sanitize_create_content_type(h.get("content-type"))
        if ct is None and not forked_from:
            ct = P.DEFAULT_CONTENT_TYPE
        ttl_raw, exp_raw = h.get(P.TTL), h.get(P.EXPIRES_AT)
        if ttl_raw is not None and exp_raw is not None:
            raise P.ProtocolError(400, "Cannot specify both Stream-TTL and Stream-Expires-At")
        ttl = P.parse_ttl(ttl_raw) if ttl_raw is not None else None
        exp_ts = P.parse_expires_at(exp_raw) if exp_raw is not None else None
        fork_offset = h.get(P.FORK_OFFSET)
        if fork_offset is not None and not P.valid_offset(fork_offset):
            raise P.ProtocolError(400, "Invalid Stream-Fork-Offset format")
        sub_raw = h.get(P.FORK_SUB_OFFSET)
        sub = 0
        if sub_raw is not None:
            if not forked_from:
                raise P.ProtocolError(400, "Stream-Fork-Sub-Offset requires Stream-Forked-From")
            sub = P.parse_ttl(sub_raw) if sub_raw and sub_raw.isdigit() else -1
            if sub < 0 or (sub_raw != "0" and sub_raw.startswith("0")):
                raise P.ProtocolError(400, "Invalid Stream-Fork-Sub-Offset format")
        body = await read_body(request.receive, self.settings.max_append_bytes)
        cfg: dict[str, object] = {
            "contentType": ct, "ttl": ttl, "expiresAt": exp_raw, "expiresTs": exp_ts,
            "closed": h.get(P.CLOSED) == "true",
            "forkedFrom": qualify(forked_from) if forked_from else None,
            "forkOffset": fork_offset, "forkSubOffset": sub,
        }
        st, created = await self.store.create(path, cfg, body)
        headers = {"content-type": st.content_type or P.DEFAULT_CONTENT_TYPE, P.NEXT_OFFSET: st.offset}
        if created:
            headers["location"] = location(request.scope, public, self.settings.public_url)
        if st.closed:
            headers[P.CLOSED] = "true"
        return Response(b"", status_code=201 if created else 200, headers=headers)

    async def head(self, path: str, public: str) -> Response:
        st = await self.store.get(path)
        if st is None:
            return text(404)
        if st.soft_deleted:
            return text(410)
        headers = {P.NEXT_OFFSET: st.offset, "cache-control": "no-store",
                   "etag": P.etag(public, "-1", st.offset, st.closed)}
        if st.content_type:
            headers["content-type"] = st.content_type
        if st.closed:
            headers[P.CLOSED] = "true"
        if st.ttl is not None:
            headers[P.TTL] = str(st.ttl)
        if st.expires_at:
            headers[P.EXPIRES_AT] = st.expires_at
        return Response(b"", status_code=200, headers=headers)

    async def delete(self, path: str) -> Response:
        await self.store.delete(path)
        return Response(b"", status_code=204)

    async def post(self, h: Mapping[str, str], receive: Receive, path: str) -> Response | Reply:
        """An append (or a close). ``h``: the request headers by lower-case name."""
        close = h.get(_CLOSED_KEY) == "true"
        producer = P.parse_producer(h)
        body = await read_body(receive, self.settings.max_append_bytes)
        if not body and close:
            st, verdict = await self.store.close(path, producer)
            if verdict is not None and verdict.status != "accepted":
                return _refused(st, verdict, producer, closed=True)
            headers = {P.NEXT_OFFSET: st.offset, P.CLOSED: "true"}
            if producer is not None:
                headers |= {P.PRODUCER_EPOCH: str(producer.epoch), P.PRODUCER_SEQ: str(producer.seq)}
            return Response(b"", status_code=204, headers=headers)
        if not body:
            raise P.ProtocolError(400, "Empty body")
        ct = h.get("content-type")
        if not ct:
            raise P.ProtocolError(400, "Content-Type header is required")
        st, offset, verdict = await self.store.append(
            path, body, content_type=ct, seq=h.get(_SEQ_KEY), producer=producer, close=close
        )
        if verdict is not None and verdict.status != "accepted":
            return _refused(st, verdict, producer, closed=st.closed)
        raw = [(_NEXT_OFFSET, offset.encode())]
        if close:
            raw.append(_CLOSED_RAW)
        if producer is not None:
            raw += [(_PRODUCER_EPOCH, str(producer.epoch).encode()), (_PRODUCER_SEQ, str(producer.seq).encode())]
            return Reply(200, raw)
        return Reply(204, raw)

    async def get(self, request: Request, path: str, public: str) -> Response:
        q = request.query_params
        offsets = q.getlist("offset")
        offset = offsets[0] if offsets else None
        live = q.get("live")
        cursor = q.get("cursor")
        if offset is not None:
            if offset == "":
                raise P.ProtocolError(400, "Empty offset parameter")
            if len(offsets) > 1:
                raise P.ProtocolError(400, "Multiple offset parameters not allowed")
            if not P.valid_read_offset(offset):
                raise P.ProtocolError(400, "Invalid offset format")
        if live is not None and live not in ("long-poll", "sse"):
            raise P.ProtocolError(400, "Invalid live mode")
        st = await self.store.get(path, touch=True)
        if st is None:
            raise P.ProtocolError(404, "Stream not found")
        if st.soft_deleted:
            raise P.ProtocolError(410, "Stream is gone")
        if live in ("long-poll", "sse") and offset is None:
            raise P.ProtocolError(400, f"{'SSE' if live == 'sse' else 'Long-poll'} requires offset parameter")
        if (live != "long-poll" and offset is not None and len(offset) == len(st.offset) and offset > st.offset
                and P.valid_offset(offset)):
            # Past this view: an offset another gateway answered before this one heard of
            # the append. Read on the view JetStream has: a catch-up read's answer, or SSE
            # (which goes on from the tail when asked past it), would send the reader back
            # to this view's end, to read again what it has. A long-poll waits for the view.
            # Only an offset of the form gateways answer (another is answered from the view);
            # requests at once share the leader reads (StreamStore.latest).
            st = await self.store.latest(path)
            if st is None:
                raise P.ProtocolError(404, "Stream not found")
            if st.soft_deleted:
                raise P.ProtocolError(410, "Stream is gone")
        if live == "sse":
            start = st.offset if offset == "now" else offset
            assert start is not None
            return self._sse(path, st, start, cursor)
        if offset == "now" and live is None:
            headers = {P.NEXT_OFFSET: st.offset, P.UP_TO_DATE: "true", "cache-control": "no-store"}
            if st.content_type:
                headers["content-type"] = st.content_type
            if st.closed:
                headers[P.CLOSED] = "true"
            return Response(b"[]" if P.is_json(st.content_type) else b"", status_code=200, headers=headers)
        after = st.offset if offset == "now" else offset
        msgs = self.store.read(st, after)
        if live == "long-poll" and not msgs:
            if st.closed:
                return Response(b"", status_code=204, headers={
                    P.NEXT_OFFSET: st.offset, P.UP_TO_DATE: "true", P.CLOSED: "true"})
            st, msgs = await self._long_poll(path, st, after)
            if st is None:
                raise P.ProtocolError(404, "Stream not found")
            if not msgs:
                headers = {P.NEXT_OFFSET: after if after not in (None, "-1") else st.offset,
                           P.UP_TO_DATE: "true", P.CURSOR: P.response_cursor(cursor)}
                if st.closed:
                    headers[P.CLOSED] = "true"
                return Response(b"", status_code=204, headers=headers)
        end = msgs[-1].offset if msgs else st.offset
        at_tail = end == st.offset
        closed = st.closed and at_tail
        headers = {P.NEXT_OFFSET: end, P.UP_TO_DATE: "true"} if at_tail else {P.NEXT_OFFSET: end}
        if st.content_type:
            headers["content-type"] = st.content_type
        if live == "long-poll":
            headers[P.CURSOR] = P.response_cursor(cursor)
        if closed:
            headers[P.CLOSED] = "true"
        tag = P.etag(public, offset or "-1", end, closed)
        headers["etag"] = tag
        if request.headers.get("if-none-match") == tag:
            return Response(b"", status_code=304, headers={"etag": tag})
        data = [m.data for m in msgs]
        body = P.format_json(data) if P.is_json(st.content_type) else b"".join(data)
        return Response(body, status_code=200, headers=headers)

    async def _long_poll(self, path: str, st: StreamState, after: str | None) -> tuple[StreamState | None, list[Message]]:
        loop_deadline = self.settings.long_poll_timeout
        import time

        end = time.monotonic() + loop_deadline
        cur: StreamState | None = st
        while cur is not None:
            remaining = end - time.monotonic()
            if remaining <= 0:
                return cur, []
            await self.store.wait(cur, remaining)
            cur = await self.store.get(path, touch=True)
            if cur is None or cur.soft_deleted:
                return None, []
            msgs = self.store.read(cur, after)
            if msgs or cur.closed:
                return cur, msgs
        return None, []

    def _sse(self, path: str, st: StreamState, start: str, cursor: str | None) -> Response:
        ct = P.normalize_content_type(st.content_type)
        b64 = not (ct.startswith("text/") or ct == "application/json")
        headers = {"content-type": "text/event-stream", "cache-control": "no-cache", "connection": "keep-alive"}
        if b64:
            headers[P.SSE_DATA_ENCODING] = "base64"
        return StreamingResponse(self._sse_events(path, st, start, cursor, b64), headers=headers)

    async def _sse_events(self, path: str, st: StreamState, start: str, cursor: str | None,
                          b64: bool) -> AsyncIterator[bytes]:
        current = start
        is_json = P.is_json(st.content_type)
        cur: StreamState | None = st
        first = True
        while cur is not None:
            msgs = self.store.read(cur, current)
            out = bytearray()
            for m in msgs:
                if b64:
                    payload = base64.b64encode(m.data).decode()
                elif is_json:
                    payload = P.format_json([m.data]).decode()
                else:
                    payload = m.data.decode("utf-8", errors="replace")
                # Every data event is followed by its control event (the offset after it).
                current = m.offset
                at_tail = current == cur.offset
                closed = cur.closed and at_tail
                out += P.sse_event("data", payload) + P.control_event(
                    current, cursor=None if closed else P.response_cursor(cursor), up_to_date=at_tail, closed=closed)
            if not msgs:
                # Nothing after ``current``: the reader is at the tail, or asked for an offset
                # past it (as the reference server does, it goes on from the tail). Left past
                # the tail it was never "at" it, never waited, and spun the event loop.
                current = cur.offset
            at_tail = current == cur.offset
            closed = cur.closed and at_tail
            if not msgs and (first or closed):
                out += P.control_event(current, cursor=None if closed else P.response_cursor(cursor),
                                       up_to_date=at_tail, closed=closed)
            first = False
            if out:
                yield bytes(out)
            if closed:
                return
            if at_tail:
                while not await self.store.wait(cur, self.settings.long_poll_timeout):
                    # Idle: a keep-alive control event, still up to date.
                    yield P.control_event(current, cursor=P.response_cursor(cursor), up_to_date=True, closed=False)
            cur = await self.store.get(path, touch=True)
            if cur is not None and cur.soft_deleted:
                return


def _refused(st: StreamState, v: Verdict, producer: P.Producer | None, *, closed: bool) -> Response:
    """The answer to a producer request that was not applied (PROTOCOL.md §5.2.1)."""
    assert producer is not None
    if v.status == "duplicate":
        # The tail, as on every successful append (§5.2): a client that resent an append whose
        # answer it lost (TanStack's durableStream adapter does, once) needs it to go on. The
        # reference server leaves it out.
        headers = {P.PRODUCER_EPOCH: str(producer.epoch), P.PRODUCER_SEQ: str(v.last_seq), P.NEXT_OFFSET: st.offset}
        if closed:
            headers[P.CLOSED] = "true"
        return Response(b"", status_code=204, headers=headers)
    if v.status == "stale_epoch":
        return text(403, "Stale producer epoch", {P.PRODUCER_EPOCH: str(v.current_epoch)})
    if v.status == "invalid_epoch_seq":
        return text(400, "New epoch must start with sequence 0")
    return text(409, "Producer sequence gap",
                {P.PRODUCER_EXPECTED_SEQ: str(v.expected), P.PRODUCER_RECEIVED_SEQ: str(v.received)})


Handler = Callable[[], Awaitable[Response]]
