"""Prometheus metrics of one gateway app, in a per-app registry (never the global one)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


class Metrics:
    """The gateway's metrics. One instance per app, so two apps in one process never mix."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
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
        self.requests = Counter("baton_gateway_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
