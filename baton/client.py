"""Async Python client of the gateway's HTTP API (httpx).

::

    async with GatewayClient("http://127.0.0.1:8080", api_key=None) as gw:
        async for ev in gw.start("run-1", "thread-1", [{"id": "m1", "role": "user", "content": "hi"}]):
            print(ev.offset, ev.chunk["type"])      # reconnects on its own with Last-Event-ID
        async for ev in gw.join("run-1"): ...       # the whole log, from the start
        async for ev in gw.stream("run-1", after="42"): ...
        await gw.cancel(run_id="run-1", wait=True)  # -> the final run view
        await gw.get_run("run-1"); await gw.active_run("thread-1"); await gw.messages("thread-1")

Errors come back as the domain exceptions of :mod:`baton.errors` (rebuilt from the
response's ``reason`` and metadata, the same table as gRPC), or :class:`GatewayHTTPError`
for anything else. A stream ends when the run's log closes; a dropped connection (or a
response that ends without the end marker) is re-opened after the last offset seen, so
every chunk is yielded exactly once, in order.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping

import httpx

from baton import errors as e
from baton.grpc_errors import TABLE as _GRPC_TABLE
from baton.ids import validate_id
from baton.runs import STREAM_GAP, is_host_chunk
from baton.sse import Comment, aiter_sse

_BY_REASON = {m.reason: m for m in _GRPC_TABLE}
TERMINAL_TYPES = frozenset({"RUN_FINISHED", "RUN_ERROR"})


class GatewayHTTPError(e.BatonError):
    """An HTTP error with no domain exception behind it.

    Attributes:
        status: the HTTP status.
        reason: the body's ``reason`` (e.g. ``UNAUTHENTICATED``), or ``""``.
        body: the decoded JSON body (or ``{"error": <text>}``).
    """

    def __init__(self, status: int, reason: str, body: Mapping[str, Any]) -> None:
        self.status = status
        self.reason = reason
        self.body = dict(body)
        super().__init__(f"HTTP {status} {reason}: {body.get('error', '')}")


class StreamGap(e.BatonError):
    """The offset asked for is older than what retention kept (a ``stream.gap`` chunk came).

    Attributes:
        run_id: the run.
        earliest_offset: the earliest offset still stored.
    """

    def __init__(self, run_id: str, earliest_offset: str) -> None:
        self.run_id = run_id
        self.earliest_offset = earliest_offset
        super().__init__(f"log of run {run_id!r} no longer holds the offset asked for; earliest is {earliest_offset}")


@dataclass(frozen=True)
class StreamEvent:
    """One chunk of a run's delivery log and its offset (an opaque resume token)."""

    offset: str
    chunk: dict[str, Any]


def _error_from(resp: httpx.Response, body: bytes) -> BaseException:
    try:
        data = json.loads(body) if body else {}
        if not isinstance(data, dict):
            data = {"error": str(data)}
    except ValueError:
        data = {"error": body.decode(errors="replace")[:500]}
    reason = str(data.get("reason", ""))
    m = _BY_REASON.get(reason)
    if m is not None:
        meta = {k: str(v) for k, v in data.items() if k not in ("error", "reason")}
        if reason == "THREAD_BUSY" and "active_run_id" not in meta and "activeRunId" in data:
            meta["active_run_id"] = str(data["activeRunId"])
        return m.from_meta(meta)
    return GatewayHTTPError(resp.status_code, reason, data)


class GatewayClient:
    """Client of one gateway.

    Args:
        base_url: e.g. ``http://127.0.0.1:8080``.
        api_key: bearer key when the gateway has ``BATON_API_KEYS``.
        timeout: connect/read timeout of plain requests, seconds (streams have no read timeout:
            keep-alives arrive at least every ``BATON_SSE_KEEPALIVE`` seconds).
        reconnect_delay: seconds between stream reconnect attempts.
        max_reconnects: consecutive reconnects without progress before giving up.
        transport: an ``httpx`` transport (tests).
    """

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float = 30.0,
                 reconnect_delay: float = 0.25, max_reconnects: int = 20,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout,
                                       transport=transport, trust_env=False)
        self._reconnect_delay = reconnect_delay
        self._max_reconnects = max_reconnects

    async def __aenter__(self) -> "GatewayClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # --- plain requests -------------------------------------------------------------------

    async def _json(self, method: str, url: str, *, ok: tuple[int, ...] = (200,), **kw: Any) -> Any:
        resp = await self._http.request(method, url, **kw)
        if resp.status_code not in ok:
            raise _error_from(resp, resp.content)
        return resp.json()

    async def get_run(self, run_id: str) -> dict[str, Any]:
        """``GET /api/runs/{runId}``. Raises ``UnknownRun``."""
        return await self._json("GET", f"/api/runs/{_quote(run_id)}")  # type: ignore[no-any-return]

    async def active_run(self, thread_id: str) -> str | None:
        """The thread's running run id, or ``None``."""
        data = await self._json("GET", "/api/chat/active", params={"threadId": thread_id})
        return data.get("runId")  # type: ignore[no-any-return]

    async def messages(self, thread_id: str) -> list[dict[str, Any]]:
        """The thread's saved transcript."""
        data = await self._json("GET", f"/api/threads/{_quote(thread_id)}/messages")
        return list(data.get("messages", []))

    async def fork_thread(self, thread_id: str, run_id: str, new_thread_id: str | None = None) -> dict[str, Any]:
        """Fork a thread at one of its ended runs: ``{threadId, forkedFrom, messages}``.

        Raises:
            UnknownThread, UnknownRun, InvalidArgument (the run left no workspace, or has not
            ended), ThreadExists (``new_thread_id`` is taken).
        """
        body: dict[str, Any] = {"runId": run_id}
        if new_thread_id is not None:
            body["newThreadId"] = new_thread_id
        return await self._json("POST", f"/api/threads/{_quote(thread_id)}/fork", ok=(201,),  # type: ignore[no-any-return]
                                json=body)

    async def delete_thread(self, thread_id: str) -> None:
        """Delete a thread's workspace and saved transcript. Raises ``UnknownThread``, ``ThreadBusy``."""
        resp = await self._http.request("DELETE", f"/api/threads/{_quote(thread_id)}")
        if resp.status_code != 204:
            raise _error_from(resp, resp.content)

    async def answer_approval(self, run_id: str, approval_id: str, approved: bool, message: str | None = None,
                              updated_input: dict[str, Any] | None = None) -> dict[str, Any]:
        """Answer a tool approval the run's agent asked for (docs/hitl.md): the approval as
        stored (``{id, state: "answered", decision, approved, ...}``).

        Raises:
            ApprovalNotFound; ApprovalAlreadyAnswered (its ``approval`` holds the first answer
            as JSON text); RunEnded; InvalidArgument.
        """
        body: dict[str, Any] = {"approved": approved}
        if message is not None:
            body["message"] = message
        if updated_input is not None:
            body["updatedInput"] = updated_input
        data = await self._json("POST", f"/api/runs/{_quote(run_id)}/approvals/{_quote(approval_id)}", json=body)
        return data["approval"]  # type: ignore[no-any-return]

    async def steer(self, run_id: str, content: str, input_id: str | None = None) -> str:
        """Send a message into the run's running turn; returns its input id (pass the same
        ``input_id`` on a retry: it is delivered once).

        Raises:
            UnknownRun, RunEnded, SteerUnsupported, TooManyInputs, InvalidArgument.
        """
        body: dict[str, Any] = {"content": content}
        if input_id is not None:
            body["id"] = input_id
        data = await self._json("POST", f"/api/runs/{_quote(run_id)}/messages", ok=(202,), json=body)
        return str(data["inputId"])

    async def agents(self) -> dict[str, Any]:
        """The agents and replay journals the gateway offers."""
        return await self._json("GET", "/api/agents")  # type: ignore[no-any-return]

    async def cancel(self, run_id: str | None = None, thread_id: str | None = None, *, wait: bool = False,
                     timeout: float | None = None) -> dict[str, Any]:
        """Cancel a run (by id, or the thread's active run).

        Args:
            wait: return only once the run is terminal (the final run view, with the
                host's ``confirmation``), else at once (``{"runId", "cancelRequested",
                "runKnown"}``). A run id with no run answers at once, ``runKnown`` false
                (the cancel is kept for its start).
            timeout: seconds the gateway waits when ``wait``.

        Raises:
            UnknownThread: by thread, a thread with no run. UnknownRun: another tenant's run,
                or no active run on the thread.
            GatewayHTTPError: 504 when ``wait`` timed out.
        """
        body = {"runId": run_id} if run_id else {"threadId": thread_id}
        params: dict[str, str] = {}
        if wait:
            params["wait"] = "true"
            if timeout is not None:
                params["timeout"] = str(timeout)
        http_timeout = None if wait else self._http.timeout
        return await self._json("POST", "/api/chat/cancel", ok=(200, 202), json=body, params=params,  # type: ignore[no-any-return]
                                timeout=http_timeout)

    async def send(self, run_id: str, thread_id: str, messages: list[dict[str, Any]], *, multitask: str,
                   agent: Mapping[str, Any] | None = None, workspace: Mapping[str, Any] | None = None
                   ) -> dict[str, Any]:
        """Send a message to a thread that may be busy (docs/hitl.md), without reading the run.

        ``multitask``: ``enqueue`` | ``interrupt`` | ``steer`` (``reject`` is :meth:`start`'s).

        Returns:
            ``{"runId", "threadId", "status": "queued", "position"}`` (queued),
            ``{"runId": <active run>, "inputId", "status": "steered"}``, or
            ``{"runId", "status": "started"}`` when the run started at once (read it with
            :meth:`join`; it goes on without a reader).

        Raises:
            InvalidArgument, UnknownThread, RunEnded, SteerUnsupported.
        """
        validate_id(run_id, "runId")
        validate_id(thread_id, "threadId")
        body: dict[str, Any] = {"threadId": thread_id, "runId": run_id, "messages": messages, "multitask": multitask}
        if agent is not None:
            body["agent"] = dict(agent)
        if workspace is not None:
            body["workspace"] = dict(workspace)
        async with self._http.stream("POST", "/api/chat", json=body, headers={"X-Run-Id": run_id}) as resp:
            if resp.status_code == 202:
                return json.loads(await resp.aread())  # type: ignore[no-any-return]
            if resp.status_code != 200:
                raise _error_from(resp, await resp.aread())
        return {"runId": run_id, "status": "started"}

    async def list_queue(self, thread_id: str) -> list[dict[str, Any]]:
        """The thread's queued runs, next first: ``[{runId, strategy, position, enqueuedAt, prompt}]``."""
        data = await self._json("GET", f"/api/threads/{_quote(thread_id)}/queue")
        return list(data["queue"])

    async def cancel_queued(self, thread_id: str, run_id: str) -> None:
        """Take a queued run out of its thread's queue. Raises ``UnknownRun`` when it is not queued."""
        await self._json("DELETE", f"/api/threads/{_quote(thread_id)}/queue/{_quote(run_id)}")

    # --- streams --------------------------------------------------------------------------

    def start(self, run_id: str, thread_id: str, messages: list[dict[str, Any]], *,
              agent: Mapping[str, Any] | None = None, workspace: Mapping[str, Any] | None = None,
              detach_on_disconnect: bool = True, ndjson: bool = False) -> AsyncIterator[StreamEvent]:
        """Start a run and stream its log from the start, reconnecting on drops.

        Args:
            workspace: the thread's workspace, on its first run: ``{"git": URL, "ref"?,
                "credential"?, "setup"?}`` or ``{"dir": PATH, "setup"?}`` (docs/api.md,
                "Workspaces"); a thread's later runs continue in it and name none.

        Raises:
            InvalidArgument: a bad ``run_id`` or ``thread_id`` (at once, before any request:
                the run id also travels in a header, where an HTTP server refuses a control
                character before baton sees it).

        Raises (while iterating):
            ThreadBusy: the thread has another active run (``.active_run_id``).
            InvalidArgument, DurableRunIdRequired: bad input.
        """
        validate_id(run_id, "runId")
        validate_id(thread_id, "threadId")
        body: dict[str, Any] = {"threadId": thread_id, "runId": run_id, "messages": messages}
        if agent is not None:
            body["agent"] = dict(agent)
        if workspace is not None:
            body["workspace"] = dict(workspace)
        if not detach_on_disconnect:
            body["detachOnDisconnect"] = False
        first = ("POST", "/api/chat", {"json": body, "headers": {"X-Run-Id": run_id}})
        return self._resumable(run_id, "-1", first, ndjson)

    def stream(self, run_id: str, after: str = "-1", *, ndjson: bool = False) -> AsyncIterator[StreamEvent]:
        """The run's log strictly after ``after``, until it closes (reconnecting on drops)."""
        return self._resumable(run_id, after, None, ndjson)

    def join(self, run_id: str, *, ndjson: bool = False) -> AsyncIterator[StreamEvent]:
        """The run's whole log (``offset=-1``), until it closes."""
        return self.stream(run_id, "-1", ndjson=ndjson)

    async def _resumable(self, run_id: str, after: str, first: tuple[str, str, dict[str, Any]] | None,
                         ndjson: bool) -> AsyncIterator[StreamEvent]:
        last = after
        stalls = 0
        request = first
        while True:
            item: Any = None
            progressed = False
            ended = False
            try:
                if request is None:
                    request = ("GET", "/api/chat", {"params": {"runId": run_id, "offset": last}})
                method, url, kw = request
                headers = dict(kw.get("headers", {}))
                headers["Accept"] = "application/x-ndjson" if ndjson else "text/event-stream"
                if last != "-1":
                    headers["Last-Event-ID"] = last
                kw = {**kw, "headers": headers}
                timeout = httpx.Timeout(self._http.timeout.connect, read=None)
                async with self._http.stream(method, url, timeout=timeout, **kw) as resp:
                    if resp.status_code == 204:
                        return  # the log closed with nothing after our offset
                    if resp.status_code != 200:
                        raise _error_from(resp, await resp.aread())
                    parse = _ndjson_events(resp) if ndjson else _sse_events(resp)
                    async for item in parse:
                        if item is _END_MARK:
                            break
                        offset, chunk = item
                        if offset is None:
                            if is_host_chunk(chunk, STREAM_GAP):
                                raise StreamGap(run_id, str(chunk.get("value", {}).get("earliestOffset", "")))
                            continue
                        progressed = True
                        last = offset
                        yield StreamEvent(offset, chunk)
                    # SSE: only the end marker means the log closed. NDJSON has no marker:
                    # the gateway ends a response cleanly only when the log closed.
                    ended = item is _END_MARK if not ndjson else True
                if ended:
                    return
            except (httpx.TransportError, httpx.RemoteProtocolError):
                pass
            # Reconnect with the same request and Last-Event-ID (a re-sent POST resumes the
            # existing run and starts nothing, as with the TanStack transport).
            stalls = 0 if progressed else stalls + 1
            if stalls > self._max_reconnects:
                raise GatewayHTTPError(0, "STREAM_STALLED",
                                       {"error": f"no progress on run {run_id!r} after {stalls} reconnects"})
            await asyncio.sleep(self._reconnect_delay)


_END_MARK = object()


async def _sse_events(resp: httpx.Response) -> AsyncIterator[Any]:
    """``(offset | None, chunk)`` per SSE event, then ``_END_MARK`` on the ``: end`` comment.

    The offset is the event's own ``id`` (not the spec's persisting last id): a chunk the
    gateway sends without one (``stream.gap``) has no offset to resume after.
    """
    async for item in aiter_sse(resp.aiter_bytes()):
        if isinstance(item, Comment):
            if item.text.strip() == "end":
                yield _END_MARK
                return
            continue
        yield item.id, json.loads(item.data)


async def _ndjson_events(resp: httpx.Response) -> AsyncIterator[Any]:
    async for line in resp.aiter_lines():
        if not line.strip():
            continue
        env = json.loads(line)
        if "chunk" not in env:
            continue  # a notice (e.g. {"notice": {"reason": "LOG_STORAGE_FULL", ...}}): not log data
        yield env.get("id"), env["chunk"]


def _quote(value: str) -> str:
    from urllib.parse import quote

    return quote(value, safe="")
