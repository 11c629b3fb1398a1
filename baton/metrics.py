"""The Prometheus side of every service: a registry with the process collectors, and the
metrics listener that serves it on its own port (docs/operating.md, "Metrics").

Each service builds one registry at its composition root (never the global one: two
services in one test process must not mix) and serves it with :class:`MetricsListener` on
``BATON_COORDINATOR_METRICS_LISTEN``, ``BATON_HOST_METRICS_LISTEN`` or
``BATON_GATEWAY_METRICS_LISTEN``. The listener answers any path with the text exposition
and asks for no key: it is meant for the cluster's network only, as the gRPC ports are.

It serves from a thread (prometheus_client's WSGI server), so a scrape answers while the
event loop is stuck, which is when the process metrics matter most; the metrics themselves
are only ever changed on the loop.
"""
from __future__ import annotations

import gc
import logging
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

log = logging.getLogger("baton.metrics")

#: Bucket bounds (seconds) of the latency histograms: from a local etcd or JetStream write
#: (about a millisecond) to a takeover after a lease TTL (seconds) or a stuck store.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

#: Bucket bounds (bytes) of the size histograms, by fours: from one short journal line
#: (a few hundred bytes) to a takeover replaying a long journal from byte 0 (hundreds of MiB).
BYTE_BUCKETS = tuple(float(256 << (2 * i)) for i in range(11))  # 256 B, 1 KiB, 4 KiB … 256 MiB

__all__ = ["BYTE_BUCKETS", "LATENCY_BUCKETS", "MetricsListener", "new_registry", "parse_listen", "start_listener"]


def new_registry() -> CollectorRegistry:
    """A fresh registry holding the process, platform and GC collectors
    (``process_*``, ``python_info``, ``python_gc_*``) and the collector's settings
    (``baton_gc_threshold``, ``baton_gc_frozen_objects``: baton.gc_tuning)."""
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    registry.register(_GCSettings())
    return registry


class _GCSettings(Collector):
    """The garbage collector's thresholds and frozen objects (``BATON_GC_THRESHOLD``), read at
    each scrape."""

    def collect(self) -> list[Metric]:
        threshold = GaugeMetricFamily(
            "baton_gc_threshold", "The cyclic garbage collector's threshold of each generation "
            "(BATON_GC_THRESHOLD; Python's own: 700, 10, 10)", labels=["generation"])
        for generation, value in enumerate(gc.get_threshold()):
            threshold.add_metric([str(generation)], value)
        frozen = GaugeMetricFamily("baton_gc_frozen_objects", "Objects moved out of the collector's reach "
                                   "once the service was ready (gc.freeze; 0: BATON_GC_THRESHOLD=default)",
                                   value=gc.get_freeze_count())
        return [threshold, frozen]


def parse_listen(listen: str, name: str) -> tuple[str, int] | None:
    """``host:port`` → ``(host, port)``; empty → ``None`` (no listener).

    Port ``0`` picks a free port (the listener's :attr:`MetricsListener.port` tells which).

    Raises:
        ValueError: naming the setting ``name`` when the value is malformed.
    """
    listen = listen.strip()
    if not listen:
        return None
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{name} must be host:port (or empty), got {listen!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class MetricsListener:
    """Serves one registry over HTTP on its own port. ``start()`` binds (raising ``OSError``
    when it cannot), ``stop()`` is idempotent; also a context manager.

    Args:
        registry: what to serve.
        listen: ``host:port`` (port 0: any free port).
    """

    def __init__(self, registry: CollectorRegistry, listen: tuple[str, int]) -> None:
        self._registry = registry
        self._listen = listen
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    def start(self) -> "MetricsListener":
        host, port = self._listen
        self._server, self._thread = start_http_server(port, host, registry=self._registry)
        self.port = int(self._server.server_port)
        log.info("metrics listening on %s:%d", host, self.port)
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()  # waits for serve_forever to return (at most its 0.5 s poll)
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "MetricsListener":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_listener(registry: CollectorRegistry, listen: str, name: str) -> MetricsListener | None:
    """Start a listener for ``listen`` (the value of setting ``name``); ``None`` when empty.

    Raises:
        ValueError: a malformed value. OSError: the port cannot be bound.
    """
    addr = parse_listen(listen, name)
    return MetricsListener(registry, addr).start() if addr is not None else None
