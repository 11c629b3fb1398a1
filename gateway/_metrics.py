"""Prometheus metrics of one gateway app, in a per-app registry (never the global one).

Served on the metrics listener (``BATON_GATEWAY_METRICS_LISTEN``, no key asked), and on the
public port's ``/metrics`` only without API keys or with the internal token
(:func:`gateway._routes_misc.metrics`): a tenant's key never reads cluster-wide counts.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Iterable

from prometheus_client import Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from starlette.types import Message, Receive, Scope, Send

from baton import errors as e
from baton.metrics import LATENCY_BUCKETS, new_registry
from baton.runs import STATUSES, status_name


class Metrics:
    """The gateway's metrics. One instance per app, so two apps in one process never mix."""

    def __init__(self) -> None:
        self.registry = new_registry()  # with the process, platform and GC collectors
        r = self.registry
        #: Called at the start of every scrape, on the scrape's thread (:meth:`on_scrape`).
        self._hooks: list[Callable[[], None]] = []
        r.register(_ScrapeHooks(self._hooks))  # first: collected before the gauges it refreshes
        self.runs = Gauge("baton_runs", "Runs by status, as the coordinator reports them at scrape time",
                          ["status"], registry=r)
        self.readers = Gauge("baton_gateway_readers", "SSE/NDJSON readers connected now", registry=r)
        self.chunks = Counter("baton_gateway_chunks_delivered", "Chunks written to readers", registry=r)
        self.appends = Counter("baton_gateway_runs_started", "Runs started through this gateway (StartRun)",
                               ["outcome"], registry=r)
        self.takeover_decisions = Counter(
            "baton_gateway_takeover_decisions", "What a join decided about taking the run over (DESIGN §6)",
            ["decision"], registry=r)
        self.takeovers = Counter("baton_gateway_takeovers", "AttachRun calls triggered by readers, by outcome",
                                 ["outcome"], registry=r)
        self.finishing_waits = Gauge(
            "baton_gateway_starts_waiting_for_finish",
            "Starts waiting now for the thread's previous run, whose log is closed, to write its final status",
            registry=r)
        self.join_waits = Gauge(
            "baton_gateway_joins_waiting_for_run",
            "Joins waiting now for a run id they do not know yet to get a record or a log",
            registry=r)
        self.requests = Counter("baton_gateway_requests", "HTTP requests by route template and status class "
                                "(2xx..5xx)", ["route", "status"], registry=r)
        self.starts = Counter("baton_gateway_starts", "Run starts (HTTP, gRPC, Durable Streams) by outcome: "
                              "started, joined (the run id existed) or the error reason", ["outcome"], registry=r)
        self.start_seconds = Histogram(
            "baton_gateway_start_seconds", "From a start request to its run accepted (input durable) or refused, "
            "by outcome (started|joined|failed)", ["outcome"], buckets=LATENCY_BUCKETS, registry=r)
        self.rejected = Counter("baton_gateway_rejected_requests", "Requests answered with an error, by edge "
                                "(http|grpc) and reason", ["edge", "reason"], registry=r)
        self.runs_read = Gauge("baton_gateway_runs_read", "Runs with at least one reader on this gateway now",
                               registry=r)
        self.max_fanout = Gauge("baton_gateway_max_readers_per_run",
                                "Readers of the most-read run on this gateway now", registry=r)

    def watch_fanout(self, readers_per_run: Callable[[], list[int]]) -> None:
        """Read the readers per run at scrape time (``readers_per_run`` runs on the scrape's
        thread: it must only copy)."""
        self.runs_read.set_function(lambda: len(readers_per_run()))
        self.max_fanout.set_function(lambda: max(readers_per_run(), default=0))

    def on_scrape(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` before each scrape is collected (on the scrape's thread)."""
        self._hooks.append(hook)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _ScrapeHooks(Collector):
    def __init__(self, hooks: list[Callable[[], None]]) -> None:
        self._hooks = hooks

    def collect(self) -> Iterable[Metric]:
        for hook in self._hooks:
            hook()
        return []

    def describe(self) -> Iterable[Metric]:
        return []  # nothing of its own (auto_describe must not call collect)


def route_label(scope: Scope) -> str:
    """The route template of a request (never its raw path: ids would explode the series)."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return path
    if scope.get("root_path", "").startswith("/ds"):
        return "/ds"
    return "unmatched"


async def count_requests(app: Any, call: Callable[[Scope, Receive, Send], Awaitable[None]],
                         scope: Scope, receive: Receive, send: Send) -> None:
    """Run ``call`` and count the request by route template and status class once it ended
    (a request that sent no status counts as ``5xx``)."""
    status = 0

    async def sent(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        await send(message)

    try:
        await call(scope, receive, sent)
    finally:
        st = getattr(app.state, "gateway", None)
        if st is not None:
            st.metrics.requests.labels(route_label(scope), f"{status // 100 or 5}xx").inc()


#: ``baton_runs{status}`` counts the newest this many runs.
METRICS_RUNS_LIMIT = 1000
log = logging.getLogger("gateway.metrics")


async def refresh_runs_by_status(st: Any) -> None:
    """Set ``baton_runs{status}`` from the coordinator's newest runs (at most 2 s; a failure
    leaves the last values and is logged)."""
    try:
        async with asyncio.timeout(2.0):
            recs = await st.coordinator.list_runs(limit=METRICS_RUNS_LIMIT)
        counts: dict[str, int] = {}
        for r in recs:
            counts[status_name(r.status)] = counts.get(status_name(r.status), 0) + 1
        for name in STATUSES:
            st.metrics.runs.labels(name).set(counts.get(name, 0))
    except (e.BatonError, TimeoutError) as exc:
        log.warning("runs by status not refreshed: %s", exc)
