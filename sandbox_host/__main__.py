"""``python -m sandbox_host`` / ``baton-sandbox-host``: the composition root of a sandbox host.

Opens a coordinator session, connects to NATS, builds the providers and the run manager,
serves ``baton.v1.SandboxHost`` and gRPC health, registers itself (address, capacity,
providers) and prints ``sandbox host <id> listening on <port>`` once ready (test harnesses
wait for it). SIGTERM/SIGINT drain: health NOT_SERVING → stop accepting runs → release
every claim and ask a live peer to take each run over at once → exit. No run is finalized
by a deploy. When the session is lost (the process was paused past its lease), every
driver stops without writing, and the host opens a new session and registers again.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import time
from typing import Any, Sequence

# Before grpc is imported: its fork handlers off. The host forks only to exec (sandbox daemons,
# set-up commands; on uvloop through libuv's fork, which runs pthread_atfork handlers, where
# asyncio's subprocesses do not), and gRPC's handlers then wait for, or log about, its
# threads at every spawn ("Other threads are currently calling into gRPC, skipping fork()
# handlers" on stderr, in the middle of JSON logs). gRPC's documented setting for
# fork-then-exec (grpc/grpc doc/fork_support.md).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

import grpc  # noqa: E402
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from baton import config, credentials, gc_tuning, internal_auth, telemetry, tls
from baton.malloc_tuning import retain_freed_memory
from baton.grpc_decode import DecodeCheck
from baton.aio import watch_loop_lag
from baton.errors import BatonError
from baton.v1 import coordinator_pb2
from sandbox_host.deps import HostDeps, HostSettings, warm_up
from sandbox_host.manager import RunManager
from sandbox_host.service import SandboxHostService, add_to_server
from sandbox_host.providers import _sandbox_tls
from sandbox_host.providers.local import sandbox_io_setting

log = logging.getLogger("baton.sandbox_host")
SERVICE_NAME = "baton.v1.SandboxHost"
_GRPC_OPTIONS = [("grpc.enable_http_proxy", 0)]


def _host_id() -> str:
    return config.get("BATON_HOST_ID") or f"{socket.gethostname()}-{os.getpid()}"


def _advertise(listen: str, port: int) -> str:
    adv = config.get("BATON_HOST_ADVERTISE")
    if adv:
        return adv
    host = listen.rsplit(":", 1)[0]
    if host in ("0.0.0.0", "[::]", "", "::"):
        host = socket.gethostname()
    return f"{host}:{port}"


async def hand_over(cc: Any, run_ids: Sequence[str], self_id: str, lost_at: float = 0.0) -> int:
    """Ask live, non-draining peers to take the released runs over, in parallel.

    Each run goes to the peer :func:`baton.placement.assign` picks, counting the runs this
    drain has placed so far on top of each peer's published load and respecting its
    capacity; a peer that refuses is skipped for that run. ``lost_at`` (Unix seconds: when
    the drain let go) goes with each request, cause ``drain``. The coordinator leader's
    failover does the same on its own when it sees the claims vanish; whichever AttachRun
    comes second is refused with ``held``, harmlessly.

    Returns:
        How many runs a peer accepted.
    """
    from baton.v1 import sandbox_host_pb2 as hpb
    from baton.v1 import sandbox_host_pb2_grpc as hgrpc

    if not run_ids:
        return 0
    hosts = [h for h in await cc.list_hosts() if h.host_id != self_id and not h.draining and h.address]
    if not hosts:
        return 0
    from baton import placement

    cands = [placement.Candidate(h.host_id, h.load, h.capacity) for h in hosts]
    address = {h.host_id: h.address for h in hosts}
    placed: dict[str, int] = {}  # runs this drain gave each peer (not in its published load yet)
    channels: dict[str, grpc.aio.Channel] = {}

    slots = asyncio.Semaphore(16)

    async def place(run_id: str) -> bool:
        async with slots:
            return await place_one(run_id)

    async def place_one(run_id: str) -> bool:
        refused: set[str] = set()
        while True:
            # No await between choosing and counting: parallel placements see each other.
            got = placement.assign([c for c in cands if c.host_id not in refused], 1, pending=placed)
            if not got:
                return False
            host_id = got[0]
            placed[host_id] = placed.get(host_id, 0) + 1
            ch = channels.get(host_id)
            if ch is None:
                ch = channels[host_id] = internal_auth.channel(address[host_id], _GRPC_OPTIONS)
            try:
                await hgrpc.SandboxHostStub(ch).AttachRun(hpb.AttachRunRequest(
                    run_id=run_id, lost_at=lost_at, loss_cause="drain"), timeout=5.0)
                return True
            except grpc.aio.AioRpcError as exc:
                placed[host_id] -= 1
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    return False  # held by someone already (the leader's failover was quicker)
                refused.add(host_id)

    try:
        results = await asyncio.gather(*(place(r) for r in run_ids))
    finally:
        for ch in channels.values():
            await ch.close(None)  # grace=None, the default (grpc-stubs makes it positional)
    return sum(results)


async def moved_count(cc: Any, run_ids: Sequence[str], self_id: str, patience: float = 5.0) -> int:
    """How many of ``run_ids`` another host took over, as seen within ``patience`` seconds.

    A run released by a drain is placed by whichever of the drain and the coordinator's
    failover comes first; this counts the outcome, not who placed it.
    """
    left = set(run_ids)
    moved = 0
    if left:
        try:
            peers = [h for h in await cc.list_hosts() if h.host_id != self_id and not h.draining and h.address]
        except (BatonError, grpc.RpcError):
            peers = []
        if not peers:
            patience = 0.0  # nobody can take them (every host drains, as at `baton down`): one look
    deadline = asyncio.get_running_loop().time() + patience
    while left:
        for run_id in sorted(left):
            try:
                view = await cc.get_run(run_id, timeout=2.0)
            except (BatonError, grpc.RpcError):
                continue
            # The claim's holder, else the last driver (a run taken over and ended since).
            holder = view.claim.host_id if view.claim is not None else view.record.driver_host
            if holder != self_id:
                left.discard(run_id)
                moved += 1
        if not left or asyncio.get_running_loop().time() >= deadline:
            break
        await asyncio.sleep(0.1)
    return moved


class Host:
    """One sandbox host process: ``run()`` until stopped; ``shutdown()`` drains."""

    def __init__(self) -> None:
        self.settings = HostSettings.from_env()
        self.host_id = _host_id()
        self.listen = config.get("BATON_HOST_LISTEN")
        self.capacity = self.settings.capacity
        self._published_load = -1
        # One registration at a time: a load update must not land after (and undo) the
        # drain's "draining" registration.
        self._register_lock = asyncio.Lock()
        self.stop = asyncio.Event()
        #: Started and registered: a stop now drains instead of abandoning the start.
        self.serving = False
        self._drained: asyncio.Task[int] | None = None

    async def run(self) -> None:
        from baton.coordinator_client import CoordinatorClient
        from baton.log import DeliveryLog, LogConfig, TranscriptStore, provision_with_patience
        from baton.workspaces import WorkspaceConfig, WorkspaceStore
        from sandbox_host.workspace_upkeep import UpkeepSettings, run_upkeep
        from sandbox_host.providers import provider_for

        ttl = config.get_float("BATON_SESSION_TTL")
        addrs = [a for a in config.get("BATON_COORDINATOR").split(",") if a]
        nats_urls = [u for u in config.get("BATON_NATS_URL").split(",") if u]
        providers: dict[str, Any] = {"local": provider_for("local")}
        if self.settings.provider in ("docker", "kubernetes"):
            providers[self.settings.provider] = provider_for(self.settings.provider)
        cfg = LogConfig.from_env()
        from baton.metrics import start_listener
        from sandbox_host.metrics import HostMetrics

        metrics = HostMetrics()
        if self.settings.warm_up:
            warm_up()  # before the session: a first takeover must not import on the loop
        async with CoordinatorClient(addrs) as cc:
            dlog = await DeliveryLog.connect(nats_urls, cfg)
            dlog.observer = metrics
            listener = None
            try:
                workspaces = WorkspaceStore(dlog.nc, WorkspaceConfig.from_env())
                await provision_with_patience(dlog, workspaces)
                # Its own thread: a busy event loop must not cost the host its session.
                session = await cc.open_session(ttl=ttl, owner=self.host_id, own_thread=True)
                deps = HostDeps(host_id=self.host_id, cc=cc, session=session, log=dlog,
                                transcripts=TranscriptStore(dlog.nc, cfg), providers=providers,
                                settings=self.settings, workspaces=workspaces, metrics=metrics)
                self.manager = RunManager(deps)
                metrics.runs.set_function(lambda: self.manager.load)
                listener = start_listener(metrics.registry, config.get("BATON_HOST_METRICS_LISTEN"),
                                          "BATON_HOST_METRICS_LISTEN")
                # BATON_INTERNAL_TOKEN: only the cluster may call; health and reflection stay open.
                server = grpc.aio.server(options=_GRPC_OPTIONS, interceptors=[*internal_auth.server_interceptors(), DecodeCheck(),
                                                                                      *telemetry.server_interceptors()])
                add_to_server(SandboxHostService(self.manager, self.drain, self.undrain), server)
                health_servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]  # grpc_health stubs lack .aio
                health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
                reflection.enable_server_reflection(
                    (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                     reflection.SERVICE_NAME), server)
                port = tls.add_port(server, self.listen, tls.from_env())
                if port == 0:
                    raise RuntimeError(f"cannot listen on {self.listen}")
                await server.start()
                self.address = _advertise(self.listen, port)
                session.probe_address = self.address  # fast failover (coordinator/_liveness.py)
                await self._register(draining=False)
                for name in ("", SERVICE_NAME):
                    await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
                gc_tuning.freeze_startup()  # what start-up built lives as long as the process
                telemetry.announce("baton.sandbox_host", f"sandbox host {self.host_id} listening on {port}")
                publisher = asyncio.create_task(self._publish_load(min(ttl / 3, 1.0)), name="publish-load")
                # A late loop shows in the log (a session lost under load is then explained).
                lag = asyncio.create_task(watch_loop_lag(f"host {self.host_id}"), name="loop-lag")
                upkeep = asyncio.create_task(run_upkeep(workspaces, providers, UpkeepSettings.from_env()),
                                             name="workspace-upkeep")
                # From here on a stop drains (see _main); before, it just ends the start.
                self.serving = True
                try:
                    await self._serve_until_stopped(cc, ttl)
                finally:
                    publisher.cancel()
                    lag.cancel()
                    upkeep.cancel()
                    await asyncio.gather(publisher, lag, upkeep, return_exceptions=True)
                    for name in ("", SERVICE_NAME):
                        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
                    await self.drain()
                    await self.manager.shutdown()
                    await server.stop(grace=1.0)
                    try:
                        async with asyncio.timeout(3):
                            await self.manager.deps.session.close()
                    except (TimeoutError, BatonError, grpc.RpcError):
                        pass  # the session may be gone already; its lease expires anyway
            finally:
                if listener is not None:
                    await asyncio.to_thread(listener.stop)
                await dlog.close()

    async def _register(self, *, draining: bool) -> None:
        async with self._register_lock:
            deps = self.manager.deps
            load = self.manager.load
            await deps.cc.register_host(coordinator_pb2.HostInfo(
                host_id=self.host_id, address=self.address, capacity=self.capacity,
                provider_kinds=sorted(deps.providers), session_id=deps.session.id,
                draining=draining or self.manager.draining, load=load))
            self._published_load = load

    async def _publish_load(self, every: float) -> None:
        """Re-register whenever the number of driven runs changed (checked every ``every`` s).

        The registry's ``load`` lets gateways and the coordinator's failover skip full hosts
        without asking each one; one etcd put per change, none while idle.
        """
        while True:
            await asyncio.sleep(every)
            if self.manager.load == self._published_load:
                continue
            try:
                await self._register(draining=False)  # keeps "draining" once the drain set it
            except (BatonError, grpc.RpcError) as exc:  # coordinator unreachable or session being replaced
                log.warning("publishing the host's load failed: %s", exc)
            except Exception:  # a bug: keep publishing, but show it
                log.exception("publishing the host's load failed")

    async def _serve_until_stopped(self, cc: Any, ttl: float) -> None:
        while not self.stop.is_set():
            deps = self.manager.deps
            lost = asyncio.ensure_future(deps.session.lost.wait())
            stopped = asyncio.ensure_future(self.stop.wait())
            try:
                await asyncio.wait({lost, stopped}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                lost.cancel()
                stopped.cancel()
                await asyncio.wait({lost, stopped})
            if self.stop.is_set():
                return
            # Paused past the lease (or partitioned): someone else owns our runs now.
            log.warning("session %s lost; stopping drivers and opening a new session", deps.session.id)
            self.manager.session_lost()
            while not self.stop.is_set():
                try:
                    deps.session = await cc.open_session(ttl=ttl, owner=self.host_id,
                                                         probe_address=self.address, own_thread=True)
                    await self._register(draining=False)
                    break
                except (BatonError, grpc.RpcError) as exc:  # coordinator unreachable: retry until stopped
                    log.warning("re-opening the session failed: %s", exc)
                    await asyncio.sleep(min(ttl, 1.0))
                except Exception:  # a bug: retry as well (the host must not stay without a session)
                    log.exception("re-opening the session failed")
                    await asyncio.sleep(min(ttl, 1.0))

    async def drain(self) -> int:
        """Stop accepting runs and hand every driven run over (idempotent)."""
        if self._drained is None:
            self._drained = asyncio.ensure_future(self._drain())
        return await asyncio.shield(self._drained)

    async def _drain(self) -> int:
        self.manager.draining = True
        try:
            await self._register(draining=True)
        except (BatonError, grpc.RpcError) as exc:
            log.warning("could not mark the host draining: %s", exc)
        except Exception:  # a bug: the drain goes on regardless
            log.exception("could not mark the host draining")
        let_go = time.time()  # the drivers stop from here: the readers' stall begins
        handed = await self.manager.drain()
        try:
            await hand_over(self.manager.deps.cc, handed, self.host_id, let_go)
        except (BatonError, grpc.RpcError) as exc:
            log.warning("hand-over failed (the coordinator's failover takes the runs): %s", exc)
        except Exception:  # a bug: the coordinator's failover takes the runs as well
            log.exception("hand-over failed (the coordinator's failover takes the runs)")
        # The coordinator's failover races this drain's own hand-over and often wins: the
        # count is of runs another host holds now, whoever placed them.
        return await moved_count(self.manager.deps.cc, handed, self.host_id)

    async def undrain(self) -> bool:
        """Take work again after a drain (registers as not draining); ``False`` when not draining."""
        if self._drained is not None:
            await asyncio.shield(self._drained)  # a drain in flight finishes its hand-over first
        was = self.manager.draining
        self.manager.draining = False
        self._drained = None
        await self._register(draining=False)
        log.info("undrained: taking work again")
        return was


async def _main() -> None:
    host = Host()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, host.stop.set)
    run = asyncio.ensure_future(host.run())
    stopped = asyncio.ensure_future(host.stop.wait())
    await asyncio.wait({run, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not run.done() and not host.serving:
        # Stopped while still starting (NATS or the coordinator unreachable): the host drives
        # no run yet, so there is nothing to drain, and waiting would hang the deploy.
        run.cancel()
        try:
            await run
        except asyncio.CancelledError:
            log.info("stopped while starting")
        return
    await run


def main(argv: Sequence[str] | None = None) -> None:
    try:
        telemetry.configure_logging("sandbox_host", static={"host": _host_id()})
        loop = config.event_loop()
        gc_tuning.tune_collector()
    except ValueError as exc:
        sys.exit(str(exc))
    credentials.exit_if_unsafe("sandbox host", listens={"BATON_HOST_LISTEN": config.get("BATON_HOST_LISTEN")},
                               auth_var="BATON_INTERNAL_TOKEN")
    try:
        HostSettings.from_env()  # the tenants' credentials (BATON_TENANT_SECRETS_DIR) read and checked
        credentials.check_files(nats=True)  # BATON_TLS_*, BATON_NATS_*: a bad file names its variable
        _sandbox_tls.from_env()  # BATON_SANDBOX_CA_*: the same
        sandbox_io_setting()  # BATON_LOCAL_SANDBOX_IO
    except ValueError as exc:
        credentials.refuse("sandbox host", exc)
    tracing = telemetry.configure_tracing("sandbox-host")
    retain_freed_memory()  # journals stream from the daemons in 1 MiB messages: reuse their buffers
    try:
        if loop == "uvloop":
            import uvloop

            uvloop.run(_main())
        else:
            asyncio.run(_main())
    finally:
        if tracing is not None:
            tracing.shutdown()  # the spans still batched


if __name__ == "__main__":
    main()
