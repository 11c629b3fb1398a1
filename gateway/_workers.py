"""The rules of a gateway run as N worker processes on one port (``BATON_GATEWAY_WORKERS``).

Pure: what each worker's settings and addresses are, and when a dead worker is started
again. The processes, sockets and signals are :mod:`gateway._supervisor`'s.

Each worker is a whole gateway of its own: its own coordinator session (presence keys),
NATS connections, one JetStream consumer per run it serves however many of its readers
read that run (gateway/_fanout.py), its own Durable Streams view (already safe across
gateways: JetStream refuses a write from a stale view, gateway/durable_streams/_store.py),
its own takeover trigger. What is shared across workers is shared the way it already is
across gateways: etcd (runs, claims, presence) and NATS (logs, /ds records, the /ds quota
ledger). What stays per process and is a *limit* is divided here, rounded up, so the pod
holds about what one process held:

- ``BATON_START_PER_TENANT``, ``BATON_START_PER_HOST``, ``BATON_START_QUEUE`` (admission,
  gateway/_admission.py);
- ``BATON_HTTP_CONNECTIONS_PER_CLIENT`` (gateway/_connection.py). The kernel spreads one
  client's connections over the workers by its source port, so a client whose connections
  land unevenly may be refused a little before the pod-wide figure.

Metrics stay per worker too: each serves its own metrics listener, one port per worker
(:func:`metrics_listen`), rather than prometheus_client's multiprocess mode, whose files
cannot carry the gateway's collectors that are computed at scrape time.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["RestartPolicy", "metrics_listen", "share", "split_listen", "worker_settings"]


def share(limit: int, workers: int) -> int:
    """One worker's part of a pod-wide ``limit``: rounded up, never 0 unless ``limit`` is
    (0 means no limit).

    Args:
        limit: the configured limit; 0 = none.
        workers: worker processes, 1 or more.
    """
    if limit <= 0 or workers <= 1:
        return limit
    return max(1, math.ceil(limit / workers))


def worker_settings(settings: Any, workers: int) -> Any:
    """``settings`` (a ``GatewaySettings``) as one of ``workers`` workers runs with: the
    per-process limits divided (:func:`share`) and ``workers`` recorded (the gRPC port is
    then bound with ``SO_REUSEPORT``)."""
    adm, conn = settings.admission, settings.connections
    return dataclasses.replace(
        settings, workers=workers,
        admission=dataclasses.replace(adm, per_tenant=share(adm.per_tenant, workers),
                                      per_host=share(adm.per_host, workers), queue=share(adm.queue, workers)),
        connections=dataclasses.replace(conn, per_client=share(conn.per_client, workers)))


def split_listen(listen: str) -> tuple[str, int]:
    """``host:port`` → ``(host, port)``; ``[::1]:80`` → ``("::1", 80)``; an empty host is
    ``0.0.0.0``.

    Raises:
        ValueError: no port, or a port that is not a number in 0..65535.
    """
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{listen!r} is not host:port")
    return (host.strip("[]") or "0.0.0.0"), int(port)


def join_listen(host: str, port: int) -> str:
    """The inverse of :func:`split_listen` (an IPv6 host in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def metrics_listen(listen: str, index: int) -> str:
    """Worker ``index``'s metrics listener: ``port + index``, or any free port when the
    setting's port is 0 (each worker logs the one it got); empty stays empty (none)."""
    if not listen:
        return ""
    host, port = split_listen(listen)
    return join_listen(host, port + index if port else 0)


@dataclass
class RestartPolicy:
    """When a dead worker is started again.

    A worker that lived at least ``healthy_after`` seconds is started again at once (a crash
    or a SIGKILL of a worker that was serving). One that died sooner is started again after
    a backoff doubling from ``first_delay`` to ``max_delay``; after ``give_up_after`` such
    quick deaths in a row the supervisor stops (a worker that cannot start, e.g. its port is
    taken, will not start the next time either: the orchestrator sees the pod fail).

    Attributes:
        quick_deaths: quick deaths in a row, per worker index.
    """

    healthy_after: float = 10.0
    first_delay: float = 0.1
    max_delay: float = 5.0
    give_up_after: int = 5
    quick_deaths: dict[int, int] = dataclasses.field(default_factory=dict)

    def died(self, index: int, lived: float) -> float | None:
        """Worker ``index`` died after ``lived`` seconds.

        Returns:
            Seconds to wait before starting it again, or ``None``: give up.
        """
        if lived >= self.healthy_after:
            self.quick_deaths[index] = 0
            return 0.0
        n = self.quick_deaths[index] = self.quick_deaths.get(index, 0) + 1
        if n >= self.give_up_after:
            return None
        return min(self.max_delay, self.first_delay * 2.0 ** (n - 1))
