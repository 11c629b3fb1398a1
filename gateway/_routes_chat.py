"""``/api/chat``: start a run, join/resume its log, find the active run, cancel (docs/design.md §6).

Wire-compatible with the TanStack AI durable chat transport: ``POST`` carries the AG-UI run
input and the run id in ``X-Run-Id``; a dropped stream is re-requested with
``Last-Event-ID`` (the POST is re-sent as is, so a POST for an existing run resumes it
instead of starting anything); ``GET ?runId&offset=-1`` joins.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from typing import Any, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from baton import errors as e
from baton.ids import validate_id
from baton.retry import Deadline
from baton.v1 import coordinator_pb2, runs_pb2, sandbox_host_pb2
from gateway._auth import check_run_visible
from gateway._errors import CancelWaitTimeout, StartFailed, mapping_for
from gateway._hosts import RPC_TIMEOUT, HostTimedOut, try_hosts
from gateway._reader import stream_log
from gateway._sse import FORMAT_PARAM, StreamResponse, choose_framing
from gateway._state import GatewayState
from gateway._ui_messages import to_ui_messages
from baton.runs import RUN_ACCEPTED, RUN_CANCELLED, TERMINAL_PB, is_host_chunk
from gateway._validate import ChatStart, check_chat_start, check_offset, read_json_object
from gateway._views import (check_thread_visible, join_view_for, record_json, run_view_for, state_of, tenant,
                            thread_visible_for)

log = logging.getLogger("gateway.chat")

MAX_CANCEL_WAIT = 300.0
CONFIRMATION_READ_TIMEOUT = 2.0


async def _start_run(st: GatewayState, cs: ChatStart, tenant_id: str) -> runs_pb2.RunRecord:
    req = sandbox_host_pb2.StartRunRequest(
        run_id=cs.run_id,
        thread_id=cs.thread_id,
        agent=runs_pb2.AgentSpec(kind=cs.agent.kind, options_json=cs.agent.to_json()),
        messages_json=json.dumps(cs.messages, separators=(",", ":")),
        cancel_on_disconnect=cs.cancel_on_disconnect,
        tenant=tenant_id,
        interrupt_active=cs.interrupt_active,
        parent_run_id=cs.parent_run_id,
        workspace_json=cs.workspace.to_record() if cs.workspace is not None else "",
    )
    t0 = time.monotonic()
    hosts = await st.hosts.live_hosts(timeout=START_READ_TIMEOUT)
    resp: sandbox_host_pb2.StartRunResponse
    # A host whose session expired half-way through the start (a pause or a starved loop past
    # its lease) answers RUN_CLAIM_LOST; the run is left ``starting`` (or was taken over), and
    # a start with the same run id on the next host starts or joins it (StartRun is
    # idempotent by run id), so the client never sees that host's trouble.
    # A start that failed on the log (a JetStream append timed out), or whose host found no
    # new session in time after losing its own, left the run ``starting`` too: the next host
    # resumes it.
    deadline = Deadline.after(START_BUDGET)

    def start(h: coordinator_pb2.HostInfo) -> Awaitable[sandbox_host_pb2.StartRunResponse]:
        return _start_on(st, h, req, deadline)

    next_on = (e.RunClaimLost, e.SessionLost, e.LogUnavailable)
    try:
        try:
            host, resp = await try_hosts(st.hosts, hosts, start, next_on=next_on)
        except e.ThreadBusy as busy:
            if not await _finishing(st, busy.active_run_id):
                raise
            host, resp = await try_hosts(st.hosts, hosts, start, next_on=next_on)
    except e.ThreadBusy:
        st.metrics.appends.labels("thread-busy").inc()
        raise
    st.metrics.appends.labels("created" if resp.created else "existing").inc()
    log.info("run %s started on %s (created=%s) in %.3fs", cs.run_id, host.host_id, resp.created, time.monotonic() - t0)
    return resp.record


#: Seconds a start may keep asking live hosts that are slow to answer (:func:`_start_on`).
START_BUDGET = 60.0
#: Seconds a start's reads of the coordinator may take (its default is 5 s): a coordinator
#: busy with a burst of starts (200 at once on replicated etcd took longer) is slow, not
#: gone; one that is gone refuses the connection at once, whatever the timeout.
START_READ_TIMEOUT = 20.0


async def _start_on(st: GatewayState, host: coordinator_pb2.HostInfo, req: sandbox_host_pb2.StartRunRequest,
                    deadline: Deadline) -> sandbox_host_pb2.StartRunResponse:
    """``StartRun`` on ``host``; asked again while it is busy, not dead.

    A host that did not answer within ``RPC_TIMEOUT`` but is still registered (its session
    lease is live, so it is running) is busy: many starts at once on a loaded machine. Its
    start goes on regardless of our deadline (a host finishes every start it began), and a
    ``StartRun`` of the same run id on that host awaits it, so asking again neither starts
    the run twice nor gives up on a start that is about to succeed. Moving on to the next
    host instead would also be safe (the claim lets one start win) but lands the same load
    on a host that is as busy, and gives the client ``NO_HOST_AVAILABLE`` when every host
    is slow. A host that is gone (unregistered: dead, or paused past its lease), or a start
    past ``deadline``, raises, and :func:`try_hosts` moves on (a host is always asked once).

    Raises:
        HostTimedOut: the host did not answer and is gone, or ``deadline`` passed.
        Any other error of the host's ``StartRun``.
    """
    while True:
        try:
            # Every call gets the whole per-call deadline: past the budget a host tried for
            # the first time (the next one of try_hosts) is still asked once.
            return await st.hosts.call(host.address, "StartRun", req, timeout=RPC_TIMEOUT)
        except HostTimedOut:
            if deadline.expired or not await st.hosts.registered(host, timeout=START_READ_TIMEOUT):
                raise
            log.info("host %s busy: StartRun of %s not answered within %gs; asking it again",
                     host.host_id, req.run_id, RPC_TIMEOUT)


#: Seconds a start waits for the thread's previous run to write its terminal status once that
#: run's log is closed.
FINISHING_WAIT = 5.0


async def _finishing(st: GatewayState, run_id: str) -> bool:
    """Whether ``run_id`` ended: its log is closed and its record turned terminal in time.

    A host closes a run's log before it writes the terminal status (a successor finalizes a
    ``running`` record from a closed log, never the other way round), so a client that read
    to the end and at once sends the thread's next message can meet the previous run still
    ``running`` for one write's time. That run is over for the client: wait for its status
    (at most :data:`FINISHING_WAIT` seconds) instead of answering ``409 THREAD_BUSY``.

    The close record decides, in one read, whether there is anything to wait for: a log
    that is not closed is a run that goes on (``False`` at once). The wait itself cannot end
    on the close: the thread stays busy for the coordinator (its active-run index) until
    the record is terminal, so a start retried before that would be refused again. It
    follows the record's changes (``WatchRun``, whose first event is the record as it is
    now, so a status that landed before the watch began counts) instead of polling it.
    """
    try:
        if await st.log.close_record(run_id) is None:
            return False
        with st.metrics.finishing_waits.track_inprogress():
            async with asyncio.timeout(FINISHING_WAIT):
                async with contextlib.aclosing(st.coordinator.watch_run(run_id)) as changes:
                    async for change in changes:
                        # A record removed (retention) no longer holds the thread either.
                        if change.record is None or change.record.status in TERMINAL_PB:
                            return True
    except (e.BatonError, TimeoutError):
        return False
    return False


async def _check_log_stores(st: GatewayState, run_id: str) -> None:
    """Refuse a new run at once while the delivery log cannot store (issue 19).

    Its fence and ``run.accepted`` could not land, so the POST would hang; the client gets
    ``503 LOG_STORAGE_FULL`` (or ``LOG_UNAVAILABLE``) naming the cause instead.

    Raises:
        LogStorageFull: the log answers but does not store.
        LogUnavailable: JetStream does not answer.
    """
    problem = await st.log_health.problem()
    if isinstance(problem, e.LogStorageFull):
        raise e.LogStorageFull(run_id, problem.detail, problem.err_code)
    if problem is not None:
        raise e.LogUnavailable(run_id, problem.detail)


async def _start_or_explain(st: GatewayState, cs: ChatStart, tenant_id: str) -> runs_pb2.RunRecord:
    """:func:`_start_run`; a server-side failure (5xx) says whether the run exists.

    Raises:
        StartFailed: the start failed with a 5xx cause (``runExists`` in the body).
        BatonError: a client error (4xx) as is.
    """
    try:
        return await _start_run(st, cs, tenant_id)
    except e.BatonError as exc:
        m = mapping_for(exc)
        if m is None or m.status < 500:
            raise
        exists: bool | None
        if isinstance(exc, e.LogUnavailable):
            exists = True  # the host touches the log only once the record exists
        else:
            try:
                await st.coordinator.get_run(cs.run_id, timeout=2.0)
                exists = True
            except e.UnknownRun:
                exists = False
            except e.BatonError:
                exists = None
        raise StartFailed(exc, exists) from exc


def _check_same_run(record: runs_pb2.RunRecord, cs: ChatStart, tenant_id: str, auth_enabled: bool) -> None:
    """An existing record may be served to this POST only if it is the caller's run.

    Raises:
        UnknownRun: the record belongs to another tenant (they must not learn it exists).
        InvalidArgument: the run id already names a run of another thread.
    """
    check_run_visible(record, tenant_id, auth_enabled)
    if record.thread_id != cs.thread_id:
        raise e.InvalidArgument("runId", "already names a run of another thread")


async def open_start(st: GatewayState, cs: ChatStart, tenant_id: str, after: str
                     ) -> tuple[str, Callable[[], Awaitable[None]] | None]:
    """The start path shared by ``POST /api/chat`` and gRPC ``Runs.StartRun``.

    Starts the run on a host, or, when the run id exists (a retry or a reconnect), checks
    it is the caller's run of the same thread and starts nothing (the takeover trigger
    looks at it as a join would).

    Args:
        after: the offset to serve from when the run exists (``-1``: from the start).

    Returns:
        ``(after, on_disconnect)``: where to serve the log from, and what to run when the
        client leaves before the log closed (cancel, for ``cancel_on_disconnect``).

    Raises:
        UnknownRun, UnknownThread, InvalidArgument, ThreadBusy, NoHostAvailable, …
    """
    try:
        view = await st.coordinator.get_run(cs.run_id, timeout=START_READ_TIMEOUT)
    except e.UnknownRun:
        view = None
    if view is not None and not view.record.starting:
        # A retried POST or a transport reconnect: serve the existing run, start nothing.
        _check_same_run(view.record, cs, tenant_id, st.settings.auth_enabled)
        st.takeovers.consider(cs.run_id, view.record, view.claim)
    else:
        # No run, or one whose start failed half-way (still ``starting``): StartRun creates
        # or resumes it, idempotently by run id; a start in progress elsewhere is joined.
        if view is not None:
            _check_same_run(view.record, cs, tenant_id, st.settings.auth_enabled)
        else:
            await thread_visible_for(st, tenant_id, cs.thread_id, must_exist=False)
        try:
            await _check_log_stores(st, cs.run_id)
        except e.LogUnavailable as exc:
            raise StartFailed(exc, view is not None) from exc
        record = await _start_or_explain(st, cs, tenant_id)
        # A concurrent POST with the same run id may have created the record between our
        # lookup and StartRun (the host then answers with that record, unchanged): the same
        # checks as for a record found above, or another tenant's or thread's log is served.
        _check_same_run(record, cs, tenant_id, st.settings.auth_enabled)
        after = "-1"

    on_disconnect = None
    if cs.cancel_on_disconnect:
        async def on_disconnect() -> None:
            # The run was started with detachOnDisconnect: false: the client leaving cancels it.
            log.info("client of run %s left; cancelling it (detachOnDisconnect: false)", cs.run_id)
            st.spawn(_cancel(st, cs.run_id, "client-disconnected"), name=f"cancel:{cs.run_id}")
    return after, on_disconnect


async def start_chat(request: Request) -> Response | StreamResponse:
    """``POST /api/chat``: validate, start the run on a host, stream its log from the start."""
    st = state_of(request)
    t = tenant(request)
    body = await read_json_object(request, st.settings.max_body_bytes)
    cs = check_chat_start(body, request.headers, request.query_params, replay_dirs=st.settings.replay_dirs,
                          default_agent=st.settings.default_agent, max_messages=st.settings.max_messages,
                          workspace_dirs=st.settings.workspace_dirs)
    resume = request.headers.get("last-event-id")
    after, on_disconnect = await open_start(st, cs, t, check_offset(resume) if resume else "-1")
    framing = choose_framing(request.headers.get("accept"), request.query_params.get(FORMAT_PARAM))
    return StreamResponse(stream_log(st, cs.run_id, after, framing, on_disconnect=on_disconnect), framing,
                          headers={"X-Run-Id": cs.run_id})


async def join_chat(request: Request) -> Response | StreamResponse:
    """``GET /api/chat?runId&offset`` (or ``Last-Event-ID``): the log strictly after the offset.

    Without ``runId`` but with ``threadId`` it answers the TanStack hydration probe
    ``{messages, activeRun}``.
    """
    st = state_of(request)
    t = tenant(request)
    q = request.query_params
    run_id = q.get("runId")
    if not run_id:
        if q.get("threadId") and q.get("offset") is None:
            return await _hydrate(request, q["threadId"])
        raise e.DurableRunIdRequired()
    validate_id(run_id, "runId")
    offset = request.headers.get("last-event-id") or q.get("offset")
    if offset is None:
        raise e.InvalidArgument("offset", "is required: ?offset=-1 reads from the start; "
                                "reconnect with a Last-Event-ID header")
    after = check_offset(offset)
    framing = choose_framing(request.headers.get("accept"), q.get(FORMAT_PARAM))
    view = await join_view_for(st, t, run_id)
    st.takeovers.consider(run_id, view.record if view else None, view.claim if view else None)
    if (framing == "sse" and request.headers.get("last-event-id") is not None
            and await closed_after(st, run_id, after)):
        # A reconnect to a log that closed with nothing after the offset: 204 is how the
        # SSE spec lets a server stop an EventSource from reconnecting for ever.
        return Response(status_code=204, headers={"X-Run-Id": run_id})
    return StreamResponse(stream_log(st, run_id, after, framing, gone=view is not None and await log_gone(st, view.record)),
                          framing,
                          headers={"X-Run-Id": run_id})


async def closed_after(st: GatewayState, run_id: str, after: str) -> bool:
    """Whether the run's log is closed with no chunk after ``after`` (a decimal offset).

    Raises:
        LogUnavailable: JetStream did not answer.
    """
    if after in ("-1", "now"):
        return False
    tail = await st.log.last_record(run_id)
    if tail is None or tail.kind != "close":
        return False
    reader = st.log.read(run_id, after=after)
    try:
        async with asyncio.timeout(CONFIRMATION_READ_TIMEOUT):
            async for _item in reader:
                return False
    except (TimeoutError, e.BatonError):
        return False  # let the stream itself answer (a gap, or the rest)
    finally:
        await reader.aclose()
    return True


async def log_gone(st: GatewayState, record: runs_pb2.RunRecord) -> bool:
    """Whether a terminal run's whole log is gone (expired): readers then get a gap, not a wait.

    A run that is not terminal yet may simply not have written; a terminal run always wrote
    at least its close record, so an empty log means retention removed it.
    """
    if record.status not in TERMINAL_PB:
        return False
    try:
        return await st.log.last_record(record.run_id) is None
    except e.BatonError:
        return False


async def visible_active(st: GatewayState, tenant_id: str, thread_id: str) -> runs_pb2.RunRecord | None:
    """The thread's active run if ``tenant_id`` may see it, else ``None``."""
    rec = await st.coordinator.find_active_run(thread_id)
    if rec is None or (st.settings.auth_enabled and rec.tenant != tenant_id):
        return None
    return rec  # type: ignore[no-any-return]


async def _visible_active(request: Request, thread_id: str) -> runs_pb2.RunRecord | None:
    return await visible_active(state_of(request), tenant(request), thread_id)


async def _hydrate(request: Request, thread_id: str) -> Response:
    st = state_of(request)
    validate_id(thread_id, "threadId")
    await check_thread_visible(request, thread_id, must_exist=False)
    rec = await _visible_active(request, thread_id)
    msgs: list[dict[str, Any]] | None = None
    if rec is not None:
        # A run is going: the client re-plays its log from the start (joinRun), so the
        # transcript to show is what came before it: the run's input (the conversation
        # so far plus the new user message), never a partial answer it would show twice.
        msgs = await _run_input(st, rec.run_id)
    if msgs is None:
        saved, _rev = await st.transcripts.load(thread_id)
        msgs = list(saved or [])
    return JSONResponse({"messages": to_ui_messages(msgs), "activeRun": {"runId": rec.run_id} if rec else None})


async def _host_chunk_value(st: GatewayState, run_id: str, name: str, *, first: bool) -> tuple[bool, Any]:
    """``(found, value)`` of the run's ``name`` host chunk, read from the log's start.

    ``first``: stop at the first one; else the last one stored before the read caught up
    (bounded by ``CONFIRMATION_READ_TIMEOUT``). Not readable in time counts as not found.
    """
    found: list[Any] = []

    async def scan() -> None:
        reader = st.log.read(run_id, after="-1")
        try:
            async for _offset, chunk in reader:
                if is_host_chunk(chunk, name):
                    found[:] = [chunk.get("value")]
                    if first:
                        return
        finally:
            await reader.aclose()

    try:
        async with asyncio.timeout(CONFIRMATION_READ_TIMEOUT):
            await scan()
    except (TimeoutError, e.BatonError):
        pass
    return (True, found[0]) if found else (False, None)


async def _run_input(st: GatewayState, run_id: str) -> list[dict[str, Any]] | None:
    """The input messages of a run, from its ``run.accepted`` chunk (``None``: not readable in time)."""
    found, value = await _host_chunk_value(st, run_id, RUN_ACCEPTED, first=True)
    if not found:
        return None
    messages = value.get("messages") if isinstance(value, dict) else None
    return [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []


async def active_run(request: Request) -> Response:
    """``GET /api/chat/active?threadId=…`` → ``{"runId": … | null}``."""
    thread_id = request.query_params.get("threadId")
    if not thread_id:
        raise e.InvalidArgument("threadId", "is required")
    validate_id(thread_id, "threadId")
    tenant(request)
    rec = await _visible_active(request, thread_id)
    return JSONResponse({"runId": rec.run_id if rec else None})


async def _cancel(st: GatewayState, run_id: str, reason: str) -> runs_pb2.RunRecord:
    """Durable cancel (the flag in the record) + the fast path to the driving host.

    A run with no live claim is handed to a live host to finalize (DESIGN §5.5: a cancel
    of a run whose host is dead is carried out by whoever takes the claim).
    """
    rec = await st.coordinator.request_run_cancel(run_id, reason=reason)
    view = await st.coordinator.get_run(run_id)
    if view.claim is not None:
        address = await st.hosts.address_of(view.claim.host_id)
        if address is not None:
            try:
                await st.hosts.call(address, "CancelRun", sandbox_host_pb2.CancelRunRequest(run_id=run_id, reason=reason))
            except e.BatonError as exc:
                # The durable flag reaches the driver through WatchRun anyway.
                log.warning("fast-path cancel of run %s on %s failed: %s", run_id, view.claim.host_id, exc)
    else:
        st.takeovers.consider(run_id, view.record, None)
    return rec  # type: ignore[no-any-return]


async def _confirmation(st: GatewayState, run_id: str) -> dict[str, Any] | None:
    """The ``run.cancelled`` chunk's value (what the host confirmed), read from the log."""
    found, value = await _host_chunk_value(st, run_id, RUN_CANCELLED, first=False)
    if not found:
        return None
    return value if isinstance(value, dict) else {"value": value}


def check_cancel_timeout(raw: float | None, default: float) -> float:
    """The seconds a cancel with ``wait`` waits: ``raw`` in (0, MAX_CANCEL_WAIT], or ``default``.

    Raises:
        InvalidArgument: out of range or not finite.
    """
    if raw is None:
        return default
    if not math.isfinite(raw) or not 0 < raw <= MAX_CANCEL_WAIT:
        raise e.InvalidArgument("timeout", f"must be in (0, {MAX_CANCEL_WAIT:g}] seconds")
    return raw


async def cancel_run(st: GatewayState, tenant_id: str, run_id: str | None, thread_id: str | None, *,
                     wait: bool, timeout: float) -> tuple[str, Any | None, dict[str, Any] | None]:
    """The cancel shared by ``POST /api/chat/cancel`` and gRPC ``Runs.CancelRun``.

    Args:
        run_id: the run to cancel; else ``thread_id``'s active run.
        wait: wait until the run is terminal (up to ``timeout`` seconds).

    Returns:
        ``(run_id, view, confirmation)``; ``view`` (the terminal ``RunView``) and the host's
        ``run.cancelled`` value only with ``wait``.

    Raises:
        InvalidArgument: neither id. UnknownRun: no such (visible) run or active run.
        CancelWaitTimeout: with ``wait``, the run was not terminal in time.
    """
    by_thread = not run_id
    if run_id:
        validate_id(run_id, "runId")
    elif thread_id:
        validate_id(thread_id, "threadId")
        rec = await visible_active(st, tenant_id, thread_id)
        if rec is None:
            raise e.UnknownRun(f"(active run of thread {thread_id})")
        run_id = rec.run_id
    else:
        raise e.InvalidArgument("runId", "send a runId or a threadId")
    try:
        view = await run_view_for(st, tenant_id, run_id)
    except e.UnknownRun:
        if by_thread:
            raise
        # No run by that id (yet): a client that minted the id may send its Stop before its
        # POST landed. The coordinator keeps the intent (tenant-scoped, expiring); a start
        # that comes later is born cancelled. Another tenant's run stays unknown.
        if await st.coordinator.user_cancel(run_id, tenant_id, "user") is None:
            log.info("cancel of run %s before its start: intent recorded", run_id)
            view = None
        else:
            view = await run_view_for(st, tenant_id, run_id)  # created meanwhile
    if view is not None and view.record.status not in TERMINAL_PB:
        await _cancel(st, run_id, "user")
    if not wait:
        return run_id, None, None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            view = await st.coordinator.get_run(run_id)
            if view.record.status in TERMINAL_PB:
                break
        except e.UnknownRun:
            pass  # an intent waiting for its start
        if loop.time() >= deadline:
            raise CancelWaitTimeout(run_id, timeout)
        await asyncio.sleep(min(0.05, max(deadline - loop.time(), 0)))
    return run_id, view, await _confirmation(st, run_id)


async def cancel_chat(request: Request) -> Response:
    """``POST /api/chat/cancel`` ``{runId | threadId}`` → 202; ``?wait=true`` → 200 once terminal, else 504."""
    st = state_of(request)
    t = tenant(request)
    body = await read_json_object(request, st.settings.max_body_bytes)
    q = request.query_params
    run_id = body.get("runId") or q.get("runId")
    thread_id = body.get("threadId") or q.get("threadId")
    if run_id is not None and not isinstance(run_id, str) or thread_id is not None and not isinstance(thread_id, str):
        raise e.InvalidArgument("runId", "runId and threadId must be strings")
    wait = q.get("wait", "false").lower() in ("1", "true", "yes")
    raw_timeout = None
    if "timeout" in q:
        try:
            raw_timeout = float(q["timeout"])
        except ValueError:
            raise e.InvalidArgument("timeout", "must be a number of seconds") from None
    if run_id:
        validate_id(run_id, "runId")
    elif thread_id:
        validate_id(thread_id, "threadId")
    timeout = check_cancel_timeout(raw_timeout, st.settings.cancel_wait)
    run_id, view, confirmation = await cancel_run(st, t, run_id, thread_id, wait=wait, timeout=timeout)
    if view is None:
        return JSONResponse({"runId": run_id, "cancelRequested": True}, status_code=202)
    out = record_json(view.record, view.claim, view.reap_at)
    out["confirmation"] = confirmation
    return JSONResponse(out, status_code=200)
