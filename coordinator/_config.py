"""Coordinator settings: ``BATON_*`` environment variables, overridable by flags (docs/design.md §9)."""
from __future__ import annotations

import argparse
import math
import os
import socket
from dataclasses import dataclass, field, fields, replace
from typing import Mapping, Sequence

from baton import config, tls as _tls
from coordinator._etcd_auth import EtcdSecurity


@dataclass(frozen=True)
class CoordinatorConfig:
    """Everything the coordinator reads at start-up.

    Attributes:
        listen: gRPC listen address (``host:port``; port 0 picks a free one).
        etcd_endpoints: etcd client endpoints.
        prefix: etcd key prefix.
        replica_id: this replica's name in the leader election.
        etcd_timeout: seconds one RPC may spend on etcd when the caller sets no deadline.
        election_ttl: seconds of the replica's own election lease.
        detached_run_ttl: seconds a detached run lives (for ``reap_at`` and the reaper).
        reaper_interval: seconds between reaper sweeps on the leader.
        session_ttl: default session TTL in seconds when a caller sends none.
        record_cache_size: runs whose last record and claim are remembered (0 disables).
        record_retention: seconds a terminal record is kept after its run ended (0: forever).
        log_max_age: the delivery log's retention in seconds (``BATON_LOG_MAX_AGE``; 0:
            unlimited): how long a run id whose record retention deleted stays retired.
        log_compact_after: seconds after a run ended before the leader compacts its log
            (``BATON_LOG_COMPACT_AFTER``; 0: never; coordinator/compaction.py).
        nats_url: NATS server URL(s) (``BATON_NATS_URL``), for compaction only.
        etcd_page_size: keys per etcd range response (every range read is paged).
        internal_token: the cluster's internal token every caller must send
            (:mod:`baton.internal_auth`); empty: no check.
        fast_failover: revoke a session at once when its keep-alive stream resets and its
            probe address refuses connections (:mod:`coordinator._liveness`); ``False``:
            the lease TTL only.
        metrics_listen: ``host:port`` of the Prometheus metrics listener (port 0: any free
            port); empty (the default here; ``BATON_COORDINATOR_METRICS_LISTEN`` has a port): none.
        tls: TLS of the gRPC listener (``BATON_TLS_*``; :mod:`baton.tls`); default plaintext.
        etcd_security: TLS and credentials towards etcd (``BATON_ETCD_CA``...,
            coordinator/_etcd_auth.py); default plaintext, none.
    """

    listen: str = "0.0.0.0:7100"
    etcd_endpoints: tuple[str, ...] = ("127.0.0.1:2379",)
    prefix: str = "/baton/"
    replica_id: str = ""
    etcd_timeout: float = 5.0
    election_ttl: float = 2.0
    detached_run_ttl: float = 3600.0
    reaper_interval: float = 60.0
    session_ttl: float = 2.0
    record_cache_size: int = 10_000
    record_retention: float = 30 * 24 * 3600.0
    log_max_age: float = 30 * 24 * 3600.0
    log_compact_after: float = 0.0
    nats_url: str = "nats://127.0.0.1:4222"
    etcd_page_size: int = 500
    internal_token: str = field(default="", repr=False)
    fast_failover: bool = True
    metrics_listen: str = ""
    tls: _tls.GrpcTls = _tls.PLAINTEXT
    etcd_security: EtcdSecurity = field(default_factory=EtcdSecurity)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "CoordinatorConfig":
        """Read ``BATON_*`` settings (defaults from :data:`baton.config.SETTINGS`).

        Raises:
            ValueError: naming the variable when a number does not parse or a TLS file is
                unusable (:class:`baton.tls.TlsConfigError`).
        """
        def g(n: str) -> str:
            return config.get(n, env)

        def f(n: str) -> float:
            return config.get_float(n, env)

        endpoints = tuple(x.strip() for x in g("BATON_ETCD_ENDPOINTS").split(",") if x.strip())
        return cls(
            listen=g("BATON_COORDINATOR_LISTEN"),
            etcd_endpoints=endpoints,
            prefix=g("BATON_ETCD_PREFIX"),
            replica_id=g("BATON_COORDINATOR_ID") or f"{socket.gethostname()}-{os.getpid()}",
            etcd_timeout=f("BATON_ETCD_TIMEOUT"),
            election_ttl=f("BATON_ELECTION_TTL"),
            detached_run_ttl=f("BATON_DETACHED_RUN_TTL"),
            reaper_interval=f("BATON_REAPER_INTERVAL"),
            session_ttl=f("BATON_SESSION_TTL"),
            record_cache_size=_count(config.get_float("BATON_RECORD_CACHE_SIZE", env), "BATON_RECORD_CACHE_SIZE"),
            record_retention=f("BATON_RECORD_RETENTION") if g("BATON_RECORD_RETENTION").strip()
            else f("BATON_LOG_MAX_AGE"),
            log_max_age=f("BATON_LOG_MAX_AGE"),
            log_compact_after=_seconds(f("BATON_LOG_COMPACT_AFTER"), "BATON_LOG_COMPACT_AFTER"),
            nats_url=g("BATON_NATS_URL"),
            etcd_page_size=_count(f("BATON_ETCD_PAGE_SIZE"), "BATON_ETCD_PAGE_SIZE") or 1,
            internal_token=g("BATON_INTERNAL_TOKEN"),
            fast_failover=_flag(g("BATON_FAST_FAILOVER"), "BATON_FAST_FAILOVER"),
            metrics_listen=g("BATON_COORDINATOR_METRICS_LISTEN"),
            tls=_tls.from_env(env),
            etcd_security=EtcdSecurity.from_env(env),
        )

    def with_overrides(self, **overrides: object) -> "CoordinatorConfig":
        """A copy with the given fields replaced (``None`` values are ignored)."""
        known = {f.name for f in fields(self)}
        bad = set(overrides) - known
        if bad:
            raise TypeError(f"unknown coordinator settings: {sorted(bad)}")
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]


def _flag(value: str, name: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{name} must be 1 or 0, got {value!r}")


def _seconds(value: float, name: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, got {value:g}")
    return value


def _count(value: float, name: str) -> int:
    if not value.is_integer() or value < 0:
        raise ValueError(f"{name} must be a whole number >= 0, got {value:g}")
    return int(value)


def parse_args(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> CoordinatorConfig:
    """Flags override the environment (``--listen``, ``--etcd``, ``--prefix``, ...)."""
    base = CoordinatorConfig.from_env(env)
    p = argparse.ArgumentParser(prog="baton-coordinator", description="baton coordinator (gRPC over etcd)")
    p.add_argument("--listen", help=f"gRPC listen address (default {base.listen})")
    p.add_argument("--etcd", help="etcd endpoints, comma-separated")
    p.add_argument("--prefix", help=f"etcd key prefix (default {base.prefix})")
    p.add_argument("--replica-id", help="name in the leader election")
    p.add_argument("--etcd-timeout", type=float, help="seconds per RPC on etcd when no deadline is set")
    p.add_argument("--election-ttl", type=float, help="seconds of the election lease")
    p.add_argument("--detached-run-ttl", type=float, help="seconds a detached run lives")
    p.add_argument("--reaper-interval", type=float, help="seconds between reaper sweeps")
    a = p.parse_args(argv)
    etcd = tuple(x.strip() for x in a.etcd.split(",") if x.strip()) if a.etcd else None
    return base.with_overrides(
        listen=a.listen, etcd_endpoints=etcd, prefix=a.prefix, replica_id=a.replica_id,
        etcd_timeout=a.etcd_timeout, election_ttl=a.election_ttl,
        detached_run_ttl=a.detached_run_ttl, reaper_interval=a.reaper_interval,
    )
