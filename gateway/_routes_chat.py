"""``/api/chat``: start a run, join/resume its log, find the active run, cancel (docs/design.md §6).

Wire-compatible with the TanStack AI durable chat transport: ``POST`` carries the AG-UI run
input and the run id in ``X-Run-Id``; a dropped stream is re-requested with
``Last-Event-ID`` (the POST is re-sent as is, so a POST for an existing run resumes it
instead of starting anything); ``GET ?runId&offset=-1`` joins.

The HTTP edge only: JSON and query strings become the run service's requests
(:mod:`gateway._http_input`), the service does the work, and its answers are rendered here.
"""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from baton import errors as e
from baton.ids import validate_id
from baton.keep import check_keep_ttl
from baton.telemetry import bind_fields, remote_parent
from gateway._http_input import cancel_request_of, check_chat_start, only_fields, read_json_object
from gateway._reader import stream_log
from gateway._service import JoinRequest, check_offset
from gateway._service._queue import Queued, Steered, queued_view
from gateway._sse import FORMAT_PARAM, StreamResponse, choose_framing
from gateway._paging import check_cursor, check_limit, window
from gateway._views import record_json, service_of, state_of, tenant


async def start_chat(request: Request) -> Response | StreamResponse:
    """``POST /api/chat``: validate, start the run on a host, stream its log from the start.

    A busy thread: ``multitask`` (docs/hitl.md) ``reject`` → 409 ``THREAD_BUSY``; ``enqueue``
    → 202 ``{runId, threadId, status: "queued", position}``; ``interrupt`` → the active run is
    cancelled and this run's log streams once it started; ``steer`` → 202 ``{runId: <the
    active run>, inputId, status: "steered"}``."""
    st = state_of(request)
    t = tenant(request)
    body = await read_json_object(request, st.settings.max_body_bytes)
    req = check_chat_start(body, request.headers, request.query_params, replay_dirs=st.settings.replay_dirs,
                           default_agent=st.settings.default_agent, max_messages=st.settings.max_messages,
                           workspace_dirs=st.settings.workspace_dirs)
    resume = request.headers.get("last-event-id")
    bind_fields(run_id=req.run_id, thread_id=req.thread_id)  # this request's task: its lines
    with remote_parent(request.headers.get("traceparent")):  # a client that traces its call
        read = await service_of(request).start_or_queue(t, req, resume_after=check_offset(resume) if resume else "-1")
    if isinstance(read, Queued):
        # A busy thread and multitask enqueue (or an interrupt whose run has not started yet).
        return JSONResponse({"runId": read.run_id, "threadId": read.thread_id, "status": "queued",
                             "position": read.position}, status_code=202, headers={"X-Run-Id": read.run_id})
    if isinstance(read, Steered):
        return JSONResponse({"runId": read.run_id, "inputId": read.input_id, "status": "steered"},
                            status_code=202, headers={"X-Run-Id": read.run_id})
    framing = choose_framing(request.headers.get("accept"), request.query_params.get(FORMAT_PARAM))
    return StreamResponse(stream_log(read, framing), framing, headers={"X-Run-Id": req.run_id}, closer=st.streams,
                          compress=st.gzip)


#: ``?snapshot=1``: serve a from-start join (``offset=-1``) from the latest snapshot.
SNAPSHOT_PARAM = "snapshot"
#: ``?keepTtl=<seconds>``: keep the run that long should it be detached (clamped; docs/api.md).
KEEP_PARAM = "keepTtl"
#: ``?messages=N``: a join from the snapshot gets only the snapshot's newest N messages.
MESSAGES_PARAM = "messages"


async def join_chat(request: Request) -> Response | StreamResponse:
    """``GET /api/chat?runId&offset`` (or ``Last-Event-ID``): the log strictly after the offset.

    ``offset=snapshot`` (or ``offset=-1&snapshot=1``) joins from the run's latest snapshot:
    its events, then every chunk after the offset it covers (docs/api.md); with
    ``messages=N`` the snapshot holds only its newest N messages, after a ``CUSTOM
    snapshot.window`` event naming what was left out. ``keepTtl`` (seconds) also keeps
    the run that long should it be detached (a keep-alive).

    Without ``runId`` but with ``threadId`` it answers the TanStack hydration probe
    ``{messages, activeRun}``.
    """
    service = service_of(request)
    t = tenant(request)
    q = request.query_params
    run_id = q.get("runId")
    if not run_id:
        if q.get("threadId") and q.get("offset") is None:
            return await _hydrate(request, q["threadId"])
        raise e.DurableRunIdRequired()
    validate_id(run_id, "runId")
    bind_fields(run_id=run_id)
    offset = request.headers.get("last-event-id") or q.get("offset")
    if offset is None:
        raise e.InvalidArgument("offset", "is required: ?offset=-1 reads from the start; "
                                "reconnect with a Last-Event-ID header")
    after = check_offset(offset)
    if after == "-1" and q.get(SNAPSHOT_PARAM) in ("1", "true") and request.headers.get("last-event-id") is None:
        # The app's connection URL opts a from-start join in to the snapshot (TanStack's
        # joinRun always asks for offset=-1 and keeps the URL's other parameters).
        after = "snapshot"
    keep_ttl = check_keep_ttl(q[KEEP_PARAM], KEEP_PARAM) if KEEP_PARAM in q else 0.0
    # ``messages=N``: a join from the snapshot gets its newest N messages (docs/api.md).
    newest = check_limit(q.get(MESSAGES_PARAM), MESSAGES_PARAM)
    framing = choose_framing(request.headers.get("accept"), q.get(FORMAT_PARAM))
    read = await service.join(t, JoinRequest(run_id, after, keep_ttl=keep_ttl, messages=newest))
    if framing == "sse" and request.headers.get("last-event-id") is not None:
        # Opened here, not by the stream's first step: its offset check reads the log's tail,
        # which then tells whether the log closed (no second look at it).
        try:
            first = await read.open()
            closed = await service.closed_after(run_id, after, tail_read=first is None and read.log_tail_read,
                                                tail=read.log_tail)
        except BaseException:
            await read.aclose()
            raise
        if closed:
            # A reconnect to a log that closed with nothing after the offset: 204 is how the
            # SSE spec lets a server stop an EventSource from reconnecting for ever.
            await read.aclose()
            return Response(status_code=204, headers={"X-Run-Id": run_id})
    st = state_of(request)
    return StreamResponse(stream_log(read, framing), framing, headers={"X-Run-Id": run_id},
                          closer=st.streams, compress=st.gzip)


async def _hydrate(request: Request, thread_id: str) -> Response:
    """The TanStack hydration: ``{messages, activeRun, page}``, ``?limit`` and ``?before``
    paging newest first (``page.truncated`` and its ``cursor``, sent back as ``before``)."""
    validate_id(thread_id, "threadId")
    q = request.query_params
    limit = check_limit(q.get("limit"))
    check_cursor(q.get("before"))
    msgs, rec = await service_of(request).thread_ui(tenant(request), thread_id)
    page = window(msgs, limit, q.get("before"))
    return JSONResponse({"messages": page.messages, "activeRun": {"runId": rec.run_id} if rec else None,
                         "page": {"truncated": True, "cursor": page.cursor} if page.cursor else {"truncated": False}})


async def active_run(request: Request) -> Response:
    """``GET /api/chat/active?threadId=…`` → ``{"runId": … | null}``."""
    thread_id = request.query_params.get("threadId")
    if not thread_id:
        raise e.InvalidArgument("threadId", "is required")
    validate_id(thread_id, "threadId")
    rec = await service_of(request).find_active_run(tenant(request), thread_id)
    return JSONResponse({"runId": rec.run_id if rec else None})


async def cancel_chat(request: Request) -> Response:
    """``POST /api/chat/cancel`` ``{runId | threadId}`` → 202 ``{runId, cancelRequested, runKnown}``;
    ``?wait=true`` → 200 once terminal, else 504 (a run id with no run: 202 ``runKnown`` false at once)."""
    st = state_of(request)
    t = tenant(request)
    body = await read_json_object(request, st.settings.max_body_bytes)
    only_fields(body, "runId", "threadId")
    req = cancel_request_of(body, request.query_params, st.settings.cancel_wait)
    out = await service_of(request).cancel(t, req)
    if out.view is None:
        return JSONResponse({"runId": out.run_id, "cancelRequested": True, "runKnown": out.run_known}, status_code=202)
    doc = record_json(out.view.record, out.view.claim, out.view.reap_at)
    doc["confirmation"] = out.confirmation
    return JSONResponse(doc, status_code=200)


async def thread_queue(request: Request) -> Response:
    """``GET /api/threads/{threadId}/queue`` → ``{"queue": [{runId, status, strategy, position,
    enqueuedAt, prompt}]}``, next first."""
    thread_id = validate_id(request.path_params["thread_id"], "threadId")
    queued = await service_of(request).list_queue(tenant(request), thread_id)
    return JSONResponse({"threadId": thread_id, "queue": [queued_view(q) for q in queued]})


async def cancel_queued(request: Request) -> Response:
    """``DELETE /api/threads/{threadId}/queue/{runId}`` → 200 ``{"removed": true}``; a run that
    is not queued (started already, or unknown) → 404 ``UNKNOWN_RUN``."""
    thread_id = validate_id(request.path_params["thread_id"], "threadId")
    run_id = validate_id(request.path_params["run_id"], "runId")
    if not await service_of(request).cancel_queued(tenant(request), thread_id, run_id):
        raise e.UnknownRun(run_id)
    return JSONResponse({"removed": True})
