"""A run's observability on the host that drives it: log fields, trace spans, the agent's context.

Every claim of a run opens its spans under the context the run's record stores
(``RunRecord.trace_parent``, :mod:`baton.telemetry`): ``run.claim`` (ended at once, so it is
exported even if this host dies next) and ``run.drive`` (the whole drive under this claim).
A claim that is not the run's first start (``attach``: a takeover after a crash or a drain;
``finalize``) links to the stored context, so the trace shows where the run was taken over.
The agent gets the drive span's ``traceparent`` as ``TRACEPARENT`` in its environment (the
OpenTelemetry convention for a process's parent context), or the stored one when this host
does not trace.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

from opentelemetry import trace
from opentelemetry.trace import Span

from baton import telemetry
from baton.v1 import runs_pb2

__all__ = ["AGENT_ENV", "agent_env", "claimed", "driving", "start_trace_parent"]

#: The agent's environment variable holding its parent trace context.
AGENT_ENV = "TRACEPARENT"


def _attributes(host_id: str, record: runs_pb2.RunRecord, epoch: int, mode: str) -> dict[str, Any]:
    return {"baton.run_id": record.run_id, "baton.thread_id": record.thread_id, "baton.epoch": epoch,
            "baton.host": host_id, "baton.mode": mode}


def start_trace_parent() -> str:
    """The trace context a run created now stores: the caller's span (the gateway's
    ``run.start``) when this host's ``StartRun`` span continues it, else the current span's."""
    parent = getattr(trace.get_current_span(), "parent", None)  # an SDK span knows its (remote) parent
    if parent is not None and parent.is_valid:
        return telemetry.span_traceparent(parent)
    return telemetry.current_traceparent()


def claimed(host_id: str, record: runs_pb2.RunRecord, epoch: int, mode: str, started_ns: int) -> None:
    """Record the claim that just landed as a ``run.claim`` span (from ``started_ns``)."""
    span = telemetry.run_span("run.claim", record.trace_parent, _attributes(host_id, record, epoch, mode),
                              takeover=mode != "fresh", start_time=started_ns)
    span.end()


@contextlib.contextmanager
def driving(host_id: str, record: runs_pb2.RunRecord, epoch: int, mode: str) -> Iterator[Span]:
    """Within the block (a driver's whole task), log lines carry the run's fields and the
    ``run.drive`` span is current; the span ends with the block."""
    span = telemetry.run_span("run.drive", record.trace_parent, _attributes(host_id, record, epoch, mode),
                              takeover=mode != "fresh")
    telemetry.bind_fields(run_id=record.run_id, thread_id=record.thread_id, epoch=epoch)
    with telemetry.in_span(span):
        yield span


def agent_env(record: runs_pb2.RunRecord) -> dict[str, str]:
    """``{"TRACEPARENT": ...}`` for the agent's environment: the current drive span's
    context, else the run's stored one; empty when the run has no trace."""
    traceparent = telemetry.current_traceparent() or record.trace_parent
    return {AGENT_ENV: traceparent} if traceparent else {}


def now_ns() -> int:
    """The wall clock in nanoseconds (a span's start time)."""
    return time.time_ns()
