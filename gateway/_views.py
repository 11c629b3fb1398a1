"""Shared helpers of the HTTP route modules: the app state and service, the caller's tenant,
JSON of records (the HTTP edge's rendering of the run service's answers)."""
from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from baton.runs import status_name
from baton.v1 import runs_pb2
from gateway._auth import tenant_of
from gateway._service import RunService, awaiting_approval, input_json
from gateway._service._views import run_view_for, thread_visible_for
from gateway._state import GatewayState


def state_of(request: Request) -> GatewayState:
    return request.app.state.gateway  # type: ignore[no-any-return]


def service_of(request: Request) -> RunService:
    """The app's run service (built in the lifespan)."""
    return request.app.state.runs  # type: ignore[no-any-return]


def tenant(request: Request) -> str:
    """The caller's tenant (``""`` without auth). Raises ``Unauthorized``."""
    return tenant_of(request, state_of(request).settings.api_keys)


def _opt(msg: Any, name: str) -> Any:
    return getattr(msg, name) if msg.HasField(name) else None


def _workspace(raw: str) -> dict[str, Any] | None:
    try:
        value = json.loads(raw) if raw else None
    except ValueError:
        return None
    return value if isinstance(value, dict) and value else None


def takeover_json(record: runs_pb2.RunRecord) -> dict[str, Any] | None:
    """The run's last takeover (``takeover`` of the run view), or ``None`` if never taken over.

    ``{fromEpoch, fromHost, toHost, cause, lostAt, claimedAt, stall}``: ``cause`` is ``crash``,
    ``drain``, ``session-lost``, ``closed`` or ``released`` (``null``: not known);
    ``stall`` is ``claimedAt - lostAt`` in seconds when both are known. Times are Unix seconds.
    """
    if not record.HasField("last_takeover"):
        return None
    t = record.last_takeover
    return {"fromEpoch": int(t.from_epoch), "fromHost": t.from_host or None, "toHost": t.to_host or None,
            "cause": t.cause or None, "lostAt": t.lost_at or None, "claimedAt": t.claimed_at or None,
            "stall": round(max(t.claimed_at - t.lost_at, 0.0), 3) if t.lost_at and t.claimed_at else None}


def record_json(record: runs_pb2.RunRecord, claim: Any | None = None, reap_at: float | None = None) -> dict[str, Any]:
    """The public view of a run (``GET /api/runs/{runId}``), camelCase."""
    err = None
    if record.HasField("error") and (record.error.message or record.error.code):
        err = {"message": record.error.message, "code": record.error.code}
    driver = claim.host_id if claim is not None and claim.host_id else (record.driver_host or None)
    return {
        "runId": record.run_id,
        "threadId": record.thread_id,
        "status": status_name(record.status),
        "startedAt": _opt(record, "started_at"),
        "finishedAt": _opt(record, "finished_at"),
        "error": err,
        "epoch": int(claim.epoch) if claim is not None else int(record.driver_epoch),
        "driverHost": driver,
        "claimed": claim is not None,
        "detachedSince": _opt(record, "detached_since"),
        "reapAt": reap_at,
        # A client asked to keep it this long while detached (docs/api.md, "Keeping a run").
        "keptUntil": _opt(record, "kept_until"),
        "cancelRequested": record.cancel_requested,
        "agent": record.agent.kind or None,
        # The thread's workspace as the run was started in it (names only, never secrets).
        "workspace": _workspace(record.workspace_json),
        # Tool approvals and steered messages (docs/hitl.md): a pending approval pauses the run.
        "awaitingApproval": awaiting_approval(record),
        "inputs": [input_json(i) for i in record.inputs],
        # The latest move of its claim to another owner (docs/operating.md, "Takeovers").
        "takeover": takeover_json(record),
    }


async def run_view(request: Request, run_id: str) -> Any:
    """The run's ``RunView`` as the caller may see it (``UnknownRun`` otherwise)."""
    return await run_view_for(state_of(request), tenant(request), run_id)


async def check_thread_visible(request: Request, thread_id: str, *, must_exist: bool) -> None:
    """With auth, a thread of another tenant is unknown (``UnknownThread``)."""
    st = state_of(request)
    if not st.settings.auth_enabled:
        return
    await thread_visible_for(st, tenant(request), thread_id, must_exist=must_exist)
