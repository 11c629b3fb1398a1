"""Gateway settings, read once from ``BATON_*`` variables (docs/design.md §9) at the composition root."""
from __future__ import annotations

import math
import os
import pathlib
import socket
from dataclasses import dataclass, field
from typing import Any, Mapping

from baton import config, tls
from baton.workspace_spec import workspace_dirs
from gateway._connection import ConnectionLimits

_REPO = pathlib.Path(__file__).resolve().parent.parent

# Where the repository keeps the replay corpus it ships for the demo (copied, with
# attribution, from ../shared/corpus). The first existing candidates win; the list is
# ordered by how specific the location is.
_CORPUS_CANDIDATES = (
    _REPO / "sandbox_host" / "agents" / "corpus",
    _REPO / "corpus",
    _REPO / "demo" / "corpus",
    _REPO / "tests" / "corpus",
)


def default_replay_dirs() -> tuple[pathlib.Path, ...]:
    """The shipped replay corpus directories that exist in this checkout."""
    return tuple(p.resolve() for p in _CORPUS_CANDIDATES if p.is_dir())


def parse_api_keys(raw: str) -> dict[str, str]:
    """Parse ``BATON_API_KEYS`` (``key=tenant`` pairs, comma-separated).

    Raises:
        ValueError: on a pair without ``=`` or with an empty key or tenant. The message
            never contains the key itself (secrets never reach logs or errors).
    """
    keys: dict[str, str] = {}
    for i, pair in enumerate(p.strip() for p in raw.split(",")):
        if not pair:
            continue
        key, sep, tenant = pair.partition("=")
        if not sep or not key.strip() or not tenant.strip():
            raise ValueError(f"BATON_API_KEYS entry #{i + 1} must be key=tenant")
        keys[key.strip()] = tenant.strip()
    return keys


@dataclass(frozen=True)
class GatewaySettings:
    """Everything the gateway needs; built by :meth:`from_env` or directly in tests.

    Attributes:
        coordinator: coordinator gRPC addresses (``host:port``).
        nats_url: NATS server URL(s), comma-separated.
        log_config: a ``baton.log.LogConfig``; ``None`` means ``LogConfig.from_env()``.
        keepalive: seconds between keep-alive comments on an idle stream (≤ 15 s by default).
        replay_dirs: directories replay journals may be read from.
        workspace_dirs: resolved directories a request's workspace ``dir`` (or local git
            repository) may name (``BATON_WORKSPACE_DIRS``; the hosts check it again).
        api_keys: bearer key → tenant; empty disables auth.
        default_agent: agent kind used when a request names none.
        session_ttl: the gateway session's lease TTL, seconds.
        gateway_id: the gateway's name in its session (for operators).
        max_body_bytes: largest accepted request body, bytes.
        max_messages: most messages accepted in one ``POST /api/chat``.
        cancel_wait: default seconds ``POST /api/chat/cancel?wait=true`` waits.
        detached_ttl_max: the longest detached TTL a client may ask for (seconds,
            ``BATON_DETACHED_RUN_TTL_MAX``; :mod:`baton.keep`).
        reader_queue: chunks buffered per reader before backpressure reaches the log read.
        tail_linger: seconds a run's shared tail stays after its last reader left
            (``BATON_TAIL_LINGER``; gateway/_fanout.py): a reader back within it resumes
            from memory. 0: the tail goes with its last reader.
        http_compression: whether an SSE/NDJSON stream is sent gzip-encoded to a client that
            admits gzip (``BATON_HTTP_COMPRESSION``: ``gzip``, the default, or ``off``;
            gateway/_compression.py).
        grpc_listen: ``host:port`` of the gRPC ``baton.v1.Runs`` API (port 0: any free
            port); empty serves no gRPC.
        metrics_listen: ``host:port`` of the Prometheus metrics listener (port 0: any free
            port); empty (the default here; ``BATON_GATEWAY_METRICS_LISTEN`` has a port): none.
        internal_token: the cluster's internal token, sent on every call to the
            coordinator and the sandbox hosts; empty sends none.
        admission: limits of run starts in flight and waiting (``BATON_START_*``,
            gateway/_admission.py).
        probe_address: ``host:port`` the coordinator may connect to while this gateway
            lives (``BATON_GATEWAY_ADVERTISE``; ``python -m gateway`` defaults it to its
            HTTP listen address). A dead gateway's readers then go at once, not after the
            session TTL (fast failover); empty: the TTL only.
        connections: the HTTP port's head and body timeouts and per-client connection cap
            (``BATON_HTTP_*``, gateway/_connection.py); applied where uvicorn is configured
            (``python -m gateway``), not by :func:`gateway.create_app`.
        internal_tls: TLS of the calls to the coordinator and the hosts (``BATON_TLS_*``,
            :mod:`baton.tls`); default plaintext.
        public_tls: TLS of the public gRPC port (``BATON_GATEWAY_TLS_CERT``/``_KEY``; the
            HTTP port's is uvicorn's, configured by ``python -m gateway``); default plaintext.
        workers: worker processes that serve the ports together (``BATON_GATEWAY_WORKERS``,
            gateway/_workers.py); above 1 the gRPC port is bound with ``SO_REUSEPORT``, and a
            worker's settings are :func:`gateway._workers.worker_settings` of these.
    """

    coordinator: tuple[str, ...] = ("127.0.0.1:7100",)
    nats_url: str = "nats://127.0.0.1:4222"
    log_config: Any = None
    #: A ``baton.workspaces.WorkspaceConfig``; ``None`` means ``WorkspaceConfig.from_env()``.
    workspace_config: Any = None
    keepalive: float = 15.0
    replay_dirs: tuple[pathlib.Path, ...] = field(default_factory=default_replay_dirs)
    workspace_dirs: tuple[str, ...] = ()
    api_keys: Mapping[str, str] = field(default_factory=dict)
    default_agent: str = "replay"
    session_ttl: float = 2.0
    gateway_id: str = field(default_factory=lambda: f"gateway-{socket.gethostname()}-{os.getpid()}")
    max_body_bytes: int = 1 << 20
    max_messages: int = 500
    cancel_wait: float = 30.0
    detached_ttl_max: float = 86400.0
    reader_queue: int = 256
    tail_linger: float = 10.0
    http_compression: bool = True
    grpc_listen: str = ""
    metrics_listen: str = ""
    internal_token: str = field(default="", repr=False)
    probe_address: str = ""
    admission: Any = None
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    internal_tls: tls.GrpcTls = tls.PLAINTEXT
    public_tls: tls.GrpcTls = tls.PLAINTEXT
    workers: int = 1

    def __post_init__(self) -> None:
        if self.admission is None:
            from gateway._admission import AdmissionLimits

            object.__setattr__(self, "admission", AdmissionLimits())

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "GatewaySettings":
        """Read every gateway setting from ``env`` (default: ``os.environ``).

        Raises:
            ValueError: naming the variable when a value is malformed or a TLS file is
                unusable (:class:`baton.tls.TlsConfigError`).
        """
        env = os.environ if env is None else env
        raw_dirs = config.get("BATON_REPLAY_DIRS", env)
        dirs = (
            tuple(pathlib.Path(d).resolve() for d in raw_dirs.split(":") if d)
            if raw_dirs
            else default_replay_dirs()
        )
        return cls(
            coordinator=tuple(a.strip() for a in config.get("BATON_COORDINATOR", env).split(",") if a.strip()),
            nats_url=config.get("BATON_NATS_URL", env),
            keepalive=config.get_float("BATON_SSE_KEEPALIVE", env),
            replay_dirs=dirs,
            workspace_dirs=workspace_dirs(config.get("BATON_WORKSPACE_DIRS", env)),
            api_keys=parse_api_keys(config.get("BATON_API_KEYS", env)),
            default_agent=config.get("BATON_DEFAULT_AGENT", env),
            session_ttl=config.get_float("BATON_SESSION_TTL", env),
            grpc_listen=config.get("BATON_GATEWAY_GRPC_LISTEN", env),
            metrics_listen=config.get("BATON_GATEWAY_METRICS_LISTEN", env),
            internal_token=config.get("BATON_INTERNAL_TOKEN", env),
            probe_address=config.get("BATON_GATEWAY_ADVERTISE", env),
            admission=_admission_limits(env),
            connections=_connection_limits(env),
            internal_tls=tls.from_env(env),
            public_tls=public_tls(env),
            workers=_workers(env),
            detached_ttl_max=_positive("BATON_DETACHED_RUN_TTL_MAX", env),
            tail_linger=_positive("BATON_TAIL_LINGER", env, zero=True),
            http_compression=_compression(env),
        )

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_keys)


PUBLIC_CERT, PUBLIC_KEY = "BATON_GATEWAY_TLS_CERT", "BATON_GATEWAY_TLS_KEY"


def public_tls(env: Mapping[str, str]) -> tls.GrpcTls:
    """The public ports' certificate (``BATON_GATEWAY_TLS_CERT``/``_KEY``): TLS without client
    certificates (callers are told apart by their API keys); plaintext when unset.

    Raises:
        baton.tls.TlsConfigError: one without the other, a file unusable, or not a pair.
    """
    cert, key = tls.read_pair(PUBLIC_CERT, PUBLIC_KEY, env)
    return tls.GrpcTls(True, cert, key) if cert else tls.PLAINTEXT


def _admission_limits(env: Mapping[str, str]) -> Any:
    """The ``BATON_START_*`` settings (gateway/_admission.py).

    Raises:
        ValueError: a negative or malformed value (naming the variable).
    """
    from gateway._admission import AdmissionLimits

    def read(env_name: str) -> float:
        v = config.get_float(env_name, env)
        if v < 0:
            raise ValueError(f"{env_name} must be 0 or more, not {v:g}")
        return v

    return AdmissionLimits(per_tenant=int(read("BATON_START_PER_TENANT")), per_host=int(read("BATON_START_PER_HOST")),
                           queue=int(read("BATON_START_QUEUE")), wait=read("BATON_START_WAIT"))


def _positive(env_name: str, env: Mapping[str, str], *, zero: bool = False) -> float:
    """A setting that must be a finite number of seconds > 0 (>= 0 with ``zero``).

    Raises:
        ValueError: naming the variable otherwise.
    """
    v = config.get_float(env_name, env)
    if not math.isfinite(v) or v < 0 or (v == 0 and not zero):
        raise ValueError(f"{env_name} must be a number of seconds {'>=' if zero else '>'} 0, not {v:g}")
    return v


def _compression(env: Mapping[str, str]) -> bool:
    """``BATON_HTTP_COMPRESSION``: ``gzip`` → True, ``off`` → False.

    Raises:
        ValueError: naming the variable, for any other value.
    """
    raw = config.get("BATON_HTTP_COMPRESSION", env).strip().lower()
    if raw not in ("gzip", "off"):
        raise ValueError(f"BATON_HTTP_COMPRESSION must be gzip or off, not {raw!r}")
    return raw == "gzip"


def _workers(env: Mapping[str, str]) -> int:
    """``BATON_GATEWAY_WORKERS``: a whole number, 1 or more.

    Raises:
        ValueError: naming the variable otherwise.
    """
    raw = config.get("BATON_GATEWAY_WORKERS", env).strip()
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"BATON_GATEWAY_WORKERS must be a whole number, 1 or more, not {raw!r}")
    return int(raw)


def _connection_limits(env: Mapping[str, str]) -> ConnectionLimits:
    """The ``BATON_HTTP_*`` settings (gateway/_connection.py).

    Raises:
        ValueError: a negative or malformed value (naming the variable).
    """
    def read(env_name: str) -> float:
        v = config.get_float(env_name, env)
        if v < 0:
            raise ValueError(f"{env_name} must be 0 or more, not {v:g}")
        return v

    return ConnectionLimits(header_timeout=read("BATON_HTTP_HEADER_TIMEOUT"), body_timeout=read("BATON_HTTP_BODY_TIMEOUT"),
                            per_client=int(read("BATON_HTTP_CONNECTIONS_PER_CLIENT")))
