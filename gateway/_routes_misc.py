"""Read-only routes: run records, transcripts, the agent list, health, metrics, the web page."""
from __future__ import annotations

import hmac
import json
import logging
import pathlib
import uuid

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response

from baton import errors as e
from baton.ids import validate_id
from gateway._errors import MetricsForbidden
from gateway._metrics import refresh_runs_by_status
from gateway._paging import check_cursor, check_limit, window
from gateway._service import input_json
from gateway._views import record_json, service_of, state_of, tenant

log = logging.getLogger("gateway.routes")

STATIC = pathlib.Path(__file__).resolve().parent / "static"


async def get_run(request: Request) -> Response:
    """``GET /api/runs/{runId}``: status, owner host, epoch, ``detachedSince``, ``reapAt``."""
    run_id = validate_id(request.path_params["run_id"], "runId")
    try:
        view = await service_of(request).run_view(tenant(request), run_id)
    except e.UnknownRun:
        # A run waiting in its thread's queue has no record yet.
        from gateway._service._queue import queued_view

        queued = await service_of(request).queued_run(tenant(request), run_id)
        if queued is None:
            raise
        return JSONResponse(queued_view(queued))
    return JSONResponse(record_json(view.record, view.claim, view.reap_at))


async def run_messages(request: Request) -> Response:
    """``GET /api/runs/{runId}/messages?limit&before`` → ``{runId, messages, total, firstIndex,
    nextCursor, snapshotOffset}``: the newest ``limit`` messages of the run's latest snapshot
    before the cursor (a ``snapshot.window`` event's, or a page's ``nextCursor``), oldest of
    the page first; the messages are sliced from the stored snapshot, never parsed."""
    run_id = validate_id(request.path_params["run_id"], "runId")
    q = request.query_params
    limit = check_limit(q.get("limit"))
    page = await service_of(request).run_messages(tenant(request), run_id, limit, q.get("before"))
    head = json.dumps({"runId": run_id, "total": page["total"], "firstIndex": page["first_index"],
                       "nextCursor": page["cursor"] or None,
                       "snapshotOffset": None if page["snapshot_offset"] is None else str(page["snapshot_offset"])},
                      separators=(",", ":")).encode()
    body = head[:-1] + b',"messages":[' + b",".join(page["messages"]) + b"]}"
    return Response(body, media_type="application/json")


async def answer_approval(request: Request) -> Response:
    """``POST /api/runs/{runId}/approvals/{approvalId}`` ``{"approved": bool, "message"?: str,
    "updatedInput"?: object}`` → 200 ``{"approval": <the input as GET /api/runs shows it>}``;
    404 ``APPROVAL_NOT_FOUND``; 409 ``APPROVAL_ALREADY_ANSWERED`` (``approval``: the first
    answer) or ``RUN_ENDED``."""
    from gateway._http_input import only_fields, read_json_object
    from gateway._service import approval_answer

    body = await read_json_object(request, state_of(request).settings.max_body_bytes)
    only_fields(body, "approved", "message", "updatedInput")
    req = approval_answer(request.path_params["run_id"], request.path_params["approvalId"], body.get("approved"),
                          body.get("message"), body.get("updatedInput"))
    stored = await service_of(request).answer_approval(tenant(request), req)
    return JSONResponse({"approval": input_json(stored)})


async def steer_run(request: Request) -> Response:
    """``POST /api/runs/{runId}/messages`` ``{"content": str, "id"?: str}`` → 202
    ``{"runId", "inputId"}``: the message goes into the run's running turn (409
    ``RUN_ENDED``, ``STEER_UNSUPPORTED``)."""
    from gateway._http_input import only_fields, read_json_object
    from gateway._service import steer_request

    body = await read_json_object(request, state_of(request).settings.max_body_bytes)
    only_fields(body, "content", "id")
    req = steer_request(request.path_params["run_id"], body.get("content"), body.get("id"))
    stored = await service_of(request).steer(tenant(request), req)
    return JSONResponse({"runId": req.run_id, "inputId": stored.id}, status_code=202)


async def keep_run(request: Request) -> Response:
    """``POST /api/runs/{runId}/keep`` ``{"ttlSeconds": number}`` → 200 ``{"runId",
    "requestedSeconds", "grantedSeconds", "keptUntil"}``: keep the run at least that long
    from now should it be detached (clamped to ``BATON_DETACHED_RUN_TTL_MAX``; 409
    ``RUN_ENDED``; another tenant's run 404 ``UNKNOWN_RUN``)."""
    from baton.keep import check_keep_ttl
    from gateway._http_input import only_fields, read_json_object
    from gateway._service._keep import KeepRequest, kept_json

    body = await read_json_object(request, state_of(request).settings.max_body_bytes)
    only_fields(body, "ttlSeconds")
    run_id = validate_id(request.path_params["run_id"], "runId")
    if "ttlSeconds" not in body:
        raise e.InvalidArgument("ttlSeconds", "is required: the seconds to keep the run while detached")
    req = KeepRequest(run_id, check_keep_ttl(body["ttlSeconds"], "ttlSeconds"))
    return JSONResponse(kept_json(await service_of(request).keep(tenant(request), req)))


async def thread_messages(request: Request) -> Response:
    """``GET /api/threads/{threadId}/messages``: the saved transcript (AG-UI messages);
    ``?limit`` pages it newest first, ``?before=<nextCursor>`` reads the next older page."""
    thread_id = validate_id(request.path_params["thread_id"], "threadId")
    limit = check_limit(request.query_params.get("limit"))
    check_cursor(request.query_params.get("before"))
    msgs, revision = await service_of(request).transcript(tenant(request), thread_id)
    page = window(msgs, limit, request.query_params.get("before"))
    return JSONResponse({"threadId": thread_id, "messages": page.messages, "revision": revision,
                         "total": len(msgs), "firstIndex": page.start, "nextCursor": page.cursor or None})


async def fork_thread(request: Request) -> Response:
    """``POST /api/threads/{threadId}/fork`` ``{"runId", "newThreadId"?}`` → 201
    ``{threadId, forkedFrom: {threadId, runId}, messages}``: a new thread starting where the
    run left the workspace and the agent session (no ``newThreadId``: one is made)."""
    from gateway._http_input import only_fields, read_json_object
    from gateway._service import fork_request

    st = state_of(request)
    body = await read_json_object(request, st.settings.max_body_bytes)
    only_fields(body, "runId", "newThreadId")
    new = body.get("newThreadId")
    if new is None:
        new = f"{request.path_params['thread_id'][:80]}-fork-{uuid.uuid4().hex[:8]}"
    req = fork_request(request.path_params["thread_id"], body.get("runId"), new)
    forked = await service_of(request).fork_thread(tenant(request), req)
    return JSONResponse({"threadId": forked.thread_id, "messages": forked.messages,
                         "forkedFrom": {"threadId": forked.source_thread_id, "runId": forked.source_run_id}},
                        status_code=201)


async def delete_thread(request: Request) -> Response:
    """``DELETE /api/threads/{threadId}`` → 204: the thread's workspace and saved transcript
    are deleted (409 ``THREAD_BUSY`` while a run of it is going)."""
    thread_id = validate_id(request.path_params["thread_id"], "threadId")
    await service_of(request).delete_thread(tenant(request), thread_id)
    return Response(status_code=204)


async def agents(request: Request) -> Response:
    """``GET /api/agents``: the agent kinds and the replay corpus the web page offers."""
    tenant(request)
    default, items = service_of(request).list_agents()
    return JSONResponse({"default": default, "agents": items})


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    st = state_of(request)
    if st.ready:
        return JSONResponse({"status": "ready", "session": st.session.id if st.session else None})
    return JSONResponse({"status": "not ready"}, status_code=503)


def _may_read_metrics(request: Request) -> None:
    """Without API keys everyone may (no tenant exists); with them only the internal token
    does, never a tenant's key: the counts are the cluster's, not the tenant's.

    Raises:
        MetricsForbidden: otherwise (403 ``METRICS_FORBIDDEN``).
    """
    settings = state_of(request).settings
    if not settings.auth_enabled:
        return
    token = settings.internal_token
    sent = request.headers.get("authorization", "")
    if not token or not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
        raise MetricsForbidden()


async def metrics(request: Request) -> Response:
    """``/metrics`` on the public port: Prometheus text (see :func:`_may_read_metrics` for
    who may read it; the metrics listener serves the same without a key); runs by status
    are read from the coordinator at scrape time."""
    st = state_of(request)
    _may_read_metrics(request)
    await refresh_runs_by_status(st)
    return Response(st.metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def index(request: Request) -> Response:
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})
