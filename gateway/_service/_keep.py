"""Keeping a detached run longer than the default TTL (docs/design.md §7, :mod:`baton.keep`).

A client asks on a join (``keepTtl`` / ``keep_ttl_seconds``) or with a keep-alive call
(``POST /api/runs/{runId}/keep``, gRPC ``KeepRun``). The run must be the caller's (the same
check as every run route: another tenant's run is unknown) and still running. The request is
clamped to ``BATON_DETACHED_RUN_TTL_MAX`` and the grant written to the record's
``kept_until`` (never earlier than what it held: two concurrent requests may leave the
smaller of the two, which a client's next keep-alive corrects), where the reaper reads it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from baton import errors as e
from baton import keep
from baton.runs import TERMINAL_PB
from baton.v1 import runs_pb2
from gateway._service._views import run_view_for
from gateway._state import GatewayState

KEPT_UNTIL = "kept_until"


@dataclass(frozen=True)
class KeepRequest:
    """Keep ``run_id`` at least ``ttl`` seconds from now should it be detached."""

    run_id: str
    ttl: float


@dataclass(frozen=True)
class Kept:
    """What a keep request was granted: seconds (clamped), and the deadline (Unix seconds)."""

    run_id: str
    requested: float
    granted: float
    kept_until: float
    view: Any


async def keep_run(st: GatewayState, tenant: str, req: KeepRequest,
                   clock: Callable[[], float] = time.time) -> Kept:
    """Grant ``req`` on the run's record.

    Returns:
        The grant and the run's view after it.

    Raises:
        UnknownRun: no such run, or another tenant's.
        RunEnded: the run is terminal (nothing to keep).
        StoreUnavailable: the coordinator cannot be reached.
    """
    view = await run_view_for(st, tenant, req.run_id)
    rec = view.record
    if rec.status in TERMINAL_PB:
        raise e.RunEnded(req.run_id)
    granted = keep.grant(req.ttl, st.settings.detached_ttl_max)
    current = rec.kept_until if rec.HasField(KEPT_UNTIL) else None
    until = keep.kept_until(clock(), granted, current)
    if until != current:
        new = runs_pb2.RunRecord(kept_until=until)
        _outcome, written = await st.coordinator.update_run(req.run_id, new, [KEPT_UNTIL])
        if written is None:
            raise e.UnknownRun(req.run_id)
        view = await run_view_for(st, tenant, req.run_id)
    return Kept(req.run_id, req.ttl, granted, until, view)


def kept_json(kept: Kept) -> dict[str, Any]:
    """The HTTP answer of a keep request (camelCase)."""
    return {"runId": kept.run_id, "requestedSeconds": kept.requested, "grantedSeconds": kept.granted,
            "keptUntil": kept.kept_until}
