"""The W3C ``traceparent`` an internal gRPC call carries: one context variable, no dependency.

A service that traces (:mod:`baton.telemetry`) sets :data:`TRACEPARENT` while a run's span
is current; :mod:`baton.internal_auth`'s channels then send it as ``traceparent`` call
metadata, so the coordinator's and the hosts' spans join the run's trace. Kept apart from
OpenTelemetry so the client wheel (which holds :mod:`baton.internal_auth`) needs none of it.
"""
from __future__ import annotations

from contextvars import ContextVar

#: The gRPC metadata key (W3C Trace Context, lower-case as gRPC requires).
METADATA_KEY = "traceparent"

#: ``00-<trace id>-<span id>-<flags>`` of the span current in this task, or ``""``.
TRACEPARENT: ContextVar[str] = ContextVar("baton_traceparent", default="")
