"""Read-only routes the web pages need beyond the chat API (docs/design.md §6).

- ``GET /api/threads``: the caller's threads, newest first, with their last run's status.
- ``GET /api/threads/{threadId}/runs``: a thread's runs, oldest first (``record_json`` each),
  with its workspace and, for a fork, where it was forked from.
- ``GET /api/ops/overview``: live hosts (load, capacity, draining), dead hosts that still
  had runs (until they moved), the caller's runs by status, and its recent takeovers (runs
  past epoch 1, with time, previous host, cause and stall) and reaps (cancel reason ``reaped``).
- ``GET /api/ops/timeline?runId=…``: one run's epochs (where each fence landed), its close,
  detach state and chunk rate, read from the run's delivery-log headers.
- ``/favicon.ico``: the page's icon (an SVG), so browsers asking for it get no 404.

Tenancy as in the rest of the HTTP API: with auth on, runs and threads are the caller's
tenant's only (another tenant's run reads as unknown, 404); hosts carry no tenant data and
are shown to every authenticated caller.
"""
from __future__ import annotations

import asyncio
import datetime
import json
import re
from typing import Any

import nats.errors

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Route

from baton import errors as e
from baton.ids import validate_id
from baton.runs import TERMINAL, status_name
from baton.v1 import runs_pb2
from gateway._routes_misc import STATIC
from gateway._service import awaiting_approval
from gateway._service._views import visible_head
from gateway._views import check_thread_visible, record_json, run_view, state_of, tenant

#: How many of the caller's newest runs the threads list and the overview look at.
RECENT_RUNS = 500
#: Most samples of record times the timeline reads to draw a chunk rate.
RATE_SAMPLES = 40
#: Most live runs the overview lists (each costs one record read).
LIVE_ROWS = 50
_READ_TIMEOUT = 5.0


def _tenant_filter(request: Request) -> str | None:
    """The tenant to filter runs by: the caller's with auth on, every tenant's without."""
    t = tenant(request)
    return t if state_of(request).settings.auth_enabled else None


async def _recent_runs(request: Request, limit: int = RECENT_RUNS) -> list[runs_pb2.RunRecord]:
    st = state_of(request)
    return list(await st.coordinator.list_runs(limit=limit, tenant=_tenant_filter(request), timeout=_READ_TIMEOUT))


async def threads(request: Request) -> Response:
    """``GET /api/threads`` → ``{threads: [{threadId, lastRunId, status, awaitingApproval,
    startedAt, runs}]}``.

    Built from the caller's newest :data:`RECENT_RUNS` runs, newest thread first;
    ``awaitingApproval``: the thread's latest run waits for an answer (docs/hitl.md).
    """
    recs = await _recent_runs(request)
    by_thread: dict[str, dict[str, Any]] = {}
    for r in recs:  # oldest first: the last one seen per thread is its latest run
        item = by_thread.setdefault(r.thread_id, {"threadId": r.thread_id, "runs": 0})
        item["runs"] += 1
        item.update(lastRunId=r.run_id, status=status_name(r.status), awaitingApproval=awaiting_approval(r),
                    startedAt=r.started_at if r.HasField("started_at") else None)
    out = sorted(by_thread.values(), key=lambda t: t["startedAt"] or 0, reverse=True)
    return JSONResponse({"threads": out})


async def thread_runs(request: Request) -> Response:
    """``GET /api/threads/{threadId}/runs`` → ``{threadId, runs: [record_json…], workspace,
    forkedFrom}``, runs oldest first.

    ``workspace`` is the thread's workspace spec (names, never secrets) and ``forkedFrom``
    ``{threadId, runId, messages}`` the run a forked thread started from (``messages``: how
    many of the saved transcript's first messages came with the fork), both from the
    thread's workspace head: ``null`` for a thread without a coding session, or when the
    workspace store does not answer (the runs are still listed).
    """
    st = state_of(request)
    thread_id = validate_id(request.path_params["thread_id"], "threadId")
    await check_thread_visible(request, thread_id, must_exist=False)
    recs = await st.coordinator.list_runs(thread_id=thread_id, limit=RECENT_RUNS, tenant=_tenant_filter(request),
                                          timeout=_READ_TIMEOUT)
    try:
        head = await visible_head(st, tenant(request), thread_id)
    except e.LogUnavailable:
        head = None
    ff = head.forked_from if head is not None else None
    return JSONResponse({
        "threadId": thread_id, "runs": [record_json(r) for r in recs],
        "workspace": (head.workspace or None) if head is not None else None,
        "forkedFrom": {"threadId": ff.thread_id, "runId": ff.run_id, "messages": ff.messages} if ff else None,
    })


async def overview(request: Request) -> Response:
    """``GET /api/ops/overview``: hosts (live and dead), runs by status, takeovers and reaps."""
    st = state_of(request)
    recs = await _recent_runs(request)
    hosts = await st.coordinator.list_hosts(timeout=_READ_TIMEOUT)
    by_status: dict[str, int] = {}
    for r in recs:
        by_status[status_name(r.status)] = by_status.get(status_name(r.status), 0) + 1
    newest_first = list(reversed(recs))
    # Past epoch 1, or a loss noted that no claim followed yet (its host died, nobody took it).
    takeovers = [record_json(r) for r in newest_first if r.driver_epoch > 1 or r.HasField("last_takeover")][:20]
    reaps = [record_json(r) for r in newest_first if r.cancel_reason == "reaped"][:20]
    running = await _live_views(request, [r for r in newest_first if status_name(r.status) not in TERMINAL][:LIVE_ROWS])
    dead = dead_hosts(running, {h.host_id for h in hosts})
    return JSONResponse({
        "hosts": [{"hostId": h.host_id, "address": h.address, "load": h.load, "capacity": h.capacity,
                   "draining": h.draining, "providers": list(h.provider_kinds)}
                  for h in sorted(hosts, key=lambda h: h.host_id)],
        "deadHosts": dead,
        "runsByStatus": by_status,
        "runsSeen": len(recs),
        "live": running,
        "takeovers": takeovers,
        "reaps": reaps,
    })


def dead_hosts(live: list[dict[str, Any]], registered: set[str]) -> list[dict[str, Any]]:
    """Hosts whose session is gone but that still had runs, until those runs moved.

    A live run (a :func:`record_json` view) with no claim whose last driver is not a
    registered host is a run of a dead host: it is flagged (``hostDead``) and its host listed
    as ``{hostId, runs, lostAt, cause}`` (``lostAt``/``cause`` from the runs' takeover notes:
    the earliest loss seen, the cause noted first; ``null`` until the leader noted them).
    A run of a live host without a claim (a drain's hand-over in flight) is not flagged.
    """
    out: dict[str, dict[str, Any]] = {}
    for r in live:
        host = str(r.get("driverHost") or "")
        r["hostDead"] = bool(r["status"] == "running" and not r["claimed"] and host and host not in registered)
        if not r["hostDead"]:
            continue
        item = out.setdefault(host, {"hostId": host, "runs": [], "lostAt": None, "cause": None})
        item["runs"].append(r["runId"])
        t = r.get("takeover")
        if t and t["fromHost"] == host and t["fromEpoch"] == r["epoch"]:
            if t["lostAt"] and (item["lostAt"] is None or t["lostAt"] < item["lostAt"]):
                item["lostAt"] = t["lostAt"]
            item["cause"] = item["cause"] or t["cause"]
    return sorted(out.values(), key=lambda h: h["hostId"])


async def _live_views(request: Request, recs: list[runs_pb2.RunRecord]) -> list[dict[str, Any]]:
    """Live runs with their claim and ``reapAt`` (the run view has them, the listing not)."""
    st = state_of(request)

    async def one(r: runs_pb2.RunRecord) -> dict[str, Any]:
        try:
            view = await st.coordinator.get_run(r.run_id, timeout=_READ_TIMEOUT)
        except e.UnknownRun:
            return record_json(r)
        return record_json(view.record, view.claim, view.reap_at)
    return list(await asyncio.gather(*(one(r) for r in recs)))


_FRACTION = re.compile(r"(\.\d{6})\d+")


def _parse_time(raw: str) -> float:
    """JetStream's RFC 3339 time (nanoseconds) → Unix seconds."""
    return datetime.datetime.fromisoformat(_FRACTION.sub(r"\1", raw).replace("Z", "+00:00")).timestamp()


async def _record_time(request: Request, seq: int) -> float | None:
    """When the stream stored record ``seq`` (Unix seconds), from ``STREAM.MSG.GET``.

    The log keeps no time in its headers; the stream does. Read by the stream leader, like
    the log's own single-record reads (``baton/log/_api.py``).
    """
    dl = state_of(request).log
    resp = await dl.nc.request(f"$JS.API.STREAM.MSG.GET.{dl.cfg.stream}", json.dumps({"seq": seq}).encode(),
                               timeout=_READ_TIMEOUT)
    msg = json.loads(resp.data).get("message")
    return _parse_time(msg["time"]) if isinstance(msg, dict) and "time" in msg else None


async def timeline(request: Request) -> Response:
    """``GET /api/ops/timeline?runId=…``: the run's record plus its log's story.

    Returns ``{run, epochs: [{epoch, offset, at}], close: {offset, status, at} | null,
    chunks, rate: [{at, perSecond}]}``: where each claim's fence landed in the log (the
    chunks after it were written by that epoch), the close record, how many chunks, and a
    chunk rate from up to :data:`RATE_SAMPLES` sampled record times. The record names the
    host of the current (or last) epoch only: earlier epochs' hosts are not stored.
    """
    run_id = request.query_params.get("runId")
    if not run_id:
        raise e.InvalidArgument("runId", "is required")
    validate_id(run_id, "runId")
    view = await run_view(request, run_id)
    st = state_of(request)
    try:
        async with asyncio.timeout(_READ_TIMEOUT):
            recs = await st.log.stored_headers(run_id)
            chunk_offsets = [r.offset for r in recs if r.kind == "chunk"]
            step = max(1, len(chunk_offsets) // RATE_SAMPLES)
            sampled = chunk_offsets[::step]
            if chunk_offsets and sampled[-1] != chunk_offsets[-1]:
                sampled.append(chunk_offsets[-1])
            marks = [r.offset for r in recs if r.kind != "chunk"]
            times = await asyncio.gather(*(_record_time(request, s) for s in sampled + marks))
    except (TimeoutError, nats.errors.Error) as exc:
        raise e.LogUnavailable(run_id, f"reading the log's headers failed: {type(exc).__name__}") from exc
    at = dict(zip(sampled + marks, times))
    index = {o: i for i, o in enumerate(chunk_offsets)}
    rate = []
    for a, b in zip(sampled, sampled[1:]):
        ta, tb = at.get(a), at.get(b)
        if ta is not None and tb is not None:
            rate.append({"at": tb, "perSecond": round((index[b] - index[a]) / max(tb - ta, 1e-3), 1)})
    epochs = [{"epoch": r.epoch, "offset": str(r.offset), "at": at.get(r.offset)} for r in recs if r.kind == "fence"]
    close = next(({"offset": str(r.offset), "status": r.status, "error": r.error, "errorCode": r.error_code,
                   "at": at.get(r.offset)} for r in recs if r.kind == "close"), None)
    return JSONResponse({"run": record_json(view.record, view.claim, view.reap_at), "epochs": epochs,
                         "close": close, "chunks": len(chunk_offsets), "rate": rate})


async def ops_page(request: Request) -> Response:
    return FileResponse(STATIC / "ops.html", headers={"Cache-Control": "no-cache"})


async def favicon(request: Request) -> Response:
    return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml",
                        headers={"Cache-Control": "max-age=86400"})


#: Mounted by ``gateway.app`` before ``/api/runs/{run_id:path}`` and the thread routes.
ROUTES: list[BaseRoute] = [
    Route("/api/threads", threads, methods=["GET"]),
    Route("/api/threads/{thread_id:path}/runs", thread_runs, methods=["GET"]),
    Route("/api/ops/overview", overview, methods=["GET"]),
    Route("/api/ops/timeline", timeline, methods=["GET"]),
    Route("/ops", ops_page, methods=["GET"]),
    Route("/favicon.ico", favicon, methods=["GET"]),
]
