"""The coordinator's composition root: gRPC server, health, reflection, election, shutdown."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from baton import telemetry, tls
from baton.grpc_decode import DecodeCheck
from baton.aio import watch_loop_lag
from baton.errors import StoreUnavailable
from baton.internal_auth import server_interceptors
from baton.metrics import MetricsListener, start_listener
from baton.v1 import coordinator_pb2, coordinator_pb2_grpc

from coordinator._config import CoordinatorConfig
from coordinator._election import LeaderElection, LeaderTask
from coordinator._etcd import Etcd
from coordinator._liveness import FastFailover
from coordinator._metrics import CoordinatorMetrics
from coordinator._presence import presence_sweeper
from coordinator._service import CoordinatorService, Reaper, no_reaper
from coordinator._store import RunStore

log = logging.getLogger(__name__)

SERVICE_NAME = coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"].full_name



def build_store(config: CoordinatorConfig, clock: Callable[[], float] = time.time) -> RunStore:
    """The etcd connection and store for ``config`` (no I/O until first used)."""
    etcd = Etcd(config.etcd_endpoints, page_size=config.etcd_page_size, security=config.etcd_security,
                close_grace=config.etcd_timeout)
    return RunStore(etcd, config.prefix, clock, config.record_cache_size)


class CoordinatorServer:
    """One coordinator replica. Lifecycle: ``await start()`` / ``await shutdown()`` or ``async with``.

    Args:
        config: settings (see :class:`CoordinatorConfig`).
        store: the store (from :func:`build_store`); the server owns it from here on and
            closes its etcd connection on shutdown. Default: built from ``config``.
        leader_tasks: leader-only tasks (run while this replica leads, cancelled on losing
            leadership), beside the built-in presence sweeper.
        reaper: the ``Reap`` RPC's sweep ``(ttl, now) -> counts``; default returns ``{}``.
        metrics: the replica's metrics (served on ``config.metrics_listen`` when set);
            default: a fresh registry.
    """

    def __init__(self, config: CoordinatorConfig, *, store: RunStore | None = None,
                 leader_tasks: Sequence[LeaderTask] = (), reaper: Reaper = no_reaper,
                 metrics: CoordinatorMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or CoordinatorMetrics()
        self.metrics_listener: MetricsListener | None = None
        self._leader_tasks = list(leader_tasks)
        self._reaper = reaper
        self.store = store if store is not None else build_store(config)
        self.etcd: Etcd = self.store.etcd
        self.service: CoordinatorService | None = None
        self.fast_failover: FastFailover | None = None
        self.election: LeaderElection | None = None
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()  # type: ignore[attr-defined]  # grpc_health stubs lack .aio
        self._election_task: asyncio.Task[None] | None = None
        self._lag_task: asyncio.Task[None] | None = None
        self._health_task: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self._shutdown_started = False
        self._etcd_error = ""
        self.port = 0

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>`` once started (for loopback clients)."""
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Bind, serve, and start campaigning. Reports SERVING once etcd answered once (at
        start, or later: until then NOT_SERVING, and RPCs answer UNAVAILABLE)."""
        cfg, store = self.config, self.store
        self.fast_failover = FastFailover(store, enabled=cfg.fast_failover, etcd_timeout=cfg.etcd_timeout)
        self.service = CoordinatorService(store, etcd_timeout=cfg.etcd_timeout,
                                          detached_run_ttl=cfg.detached_run_ttl, reaper=self._reaper,
                                          fast_failover=self.fast_failover, metrics=self.metrics)
        self._server = server = grpc.aio.server(options=(("grpc.so_reuseport", 0),),
                                                interceptors=[*server_interceptors(cfg.internal_token), DecodeCheck(),
                                                              *telemetry.server_interceptors()])
        coordinator_pb2_grpc.add_CoordinatorServicer_to_server(self.service, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME), server)
        self.port = tls.add_port(server, cfg.listen, cfg.tls)
        if self.port == 0:
            raise OSError(f"cannot bind {cfg.listen}")
        await server.start()
        self.metrics_listener = start_listener(self.metrics.registry, cfg.metrics_listen,
                                               "BATON_COORDINATOR_METRICS_LISTEN")
        self.election = LeaderElection(store, cfg, [presence_sweeper, *self._leader_tasks])
        self._election_task = asyncio.create_task(self.election.run(), name="coordinator-election")
        # A late loop shows in the log (a stalled election or keep-alive is then explained).
        self._lag_task = asyncio.create_task(watch_loop_lag(f"coordinator {cfg.replica_id}"), name="loop-lag")
        if await self._etcd_answers():
            await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        else:
            log.warning("etcd unreachable at start; serving UNAVAILABLE answers until it is back")
            await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
            # Without this the replica stayed NOT_SERVING for good when etcd was slow for one
            # etcd_timeout at start (a busy etcd right after a bulk load, say), and a
            # readiness probe never let traffic in.
            self._health_task = asyncio.create_task(self._serving_when_etcd_answers(), name="coordinator-health")
        log.info("coordinator %s listening on %s (etcd %s, prefix %s)", cfg.replica_id,
                 self.port, ",".join(cfg.etcd_endpoints), cfg.prefix)

    async def _etcd_answers(self) -> bool:
        try:
            await self.etcd.range(self.store.keys.runs, timeout=self.config.etcd_timeout)
            return True
        except StoreUnavailable as exc:
            if str(exc) != self._etcd_error:  # each new reason once (a refused password, TLS...)
                self._etcd_error = str(exc)
                log.warning("etcd does not answer: %s", exc)
            return False

    async def _set_health(self, status: "health_pb2.HealthCheckResponse.ServingStatus.ValueType") -> None:
        for name in ("", SERVICE_NAME):
            await self._health.set(name, status)

    async def _serving_when_etcd_answers(self) -> None:
        """Probe etcd (one point read, at most every second) until it answers, then SERVING."""
        while True:
            await asyncio.sleep(1.0)
            if await self._etcd_answers():
                break
        if not self._shutdown_started:
            await self._set_health(health_pb2.HealthCheckResponse.SERVING)
            log.info("etcd answers again: serving")

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def shutdown(self, grace: float = 5.0) -> None:
        """Idempotent: NOT_SERVING → end streams → step down → stop gRPC (grace s) → close etcd."""
        if self._shutdown_started:
            await self._stopped.wait()
            return
        self._shutdown_started = True
        try:
            await self._health.enter_graceful_shutdown()
            if self.service is not None:
                self.service.stop_streams()
            for task in (self._election_task, self._health_task, self._lag_task):
                if task is not None:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            if self._server is not None:
                await self._server.stop(grace)
            if self.fast_failover is not None:
                await self.fast_failover.aclose()
            await self.etcd.close()
            if self.metrics_listener is not None:
                await asyncio.to_thread(self.metrics_listener.stop)
        finally:
            self._stopped.set()

    async def __aenter__(self) -> "CoordinatorServer":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

