"""Everything a gateway app holds while it runs, built and torn down by the ASGI lifespan."""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
from typing import Any

from baton import errors as e
from baton.aio import TaskOwner, cancel_and_join, watch_loop_lag
from gateway._hydration_cache import HydrationCache
from gateway._fanout import Hubs
from gateway._hosts import HostPool
from gateway._log_health import LogHealth
from gateway._presence_batch import PresenceCalls
from gateway._metrics import Metrics, refresh_runs_by_status
from gateway._settings import GatewaySettings
from gateway._compression import SharedWrites
from gateway._sse import StreamCloser
from gateway._takeover import TakeoverTrigger

log = logging.getLogger("gateway.state")


class GatewayState:
    """Clients and owned tasks of one gateway app.

    Attributes:
        settings: the app's settings.
        coordinator: ``CoordinatorClient``.
        log: ``DeliveryLog`` (reads).
        transcripts: ``TranscriptStore``.
        hosts: host registry and channels.
        takeovers: the takeover trigger.
        log_health: whether the delivery log stores (a cached probe).
        metrics: the app's Prometheus metrics.
        session: the gateway session (presence keys live under it), or ``None`` while it
            is being (re)opened.
    """

    def __init__(self, settings: GatewaySettings, coordinator: Any, delivery_log: Any, transcripts: Any,
                 metrics: Metrics) -> None:
        self.settings = settings
        self.coordinator = coordinator
        self.log = delivery_log
        self.transcripts = transcripts
        #: The thread workspace store (``baton.workspaces.WorkspaceStore``): forks, deletes.
        self.workspaces: Any = None
        self.metrics = metrics
        self.hosts = HostPool(coordinator, settings.internal_token, settings.internal_tls)
        from gateway._admission import Admission

        #: Starts in flight and waiting at this gateway (gateway/_admission.py).
        self.admission = Admission(settings.admission)
        self.takeovers = TakeoverTrigger(self.hosts, metrics)
        self.hubs = Hubs(delivery_log, linger=settings.tail_linger)
        from gateway._snapshots import SnapshotCache

        #: The snapshots joins were served from (gateway/_snapshots.py).
        self.snapshots = SnapshotCache()
        metrics.watch_fanout(self.hubs.readers_per_run)
        self.log_health = LogHealth(delivery_log, settings.gateway_id)
        self.session: Any | None = None
        self.session_changed = asyncio.Event()
        self.shutting_down = False
        #: The open SSE/NDJSON streams, ended at once when the server shuts down.
        self.streams = StreamCloser()
        #: Gzip writes shared by this gateway's streams (``None``: ``BATON_HTTP_COMPRESSION=off``).
        self.gzip = SharedWrites() if settings.http_compression else None
        #: The bound port of the gRPC Runs API (0 when it is not served).
        self.grpc_port = 0
        #: Threads' folded hydrations (gateway/_service/_hydration.py).
        self.hydrations = HydrationCache()
        #: The bound port of the metrics listener (0 when there is none).
        self.metrics_port = 0
        self.tasks = TaskOwner("gateway")
        #: Readers' presence calls, batched per run (gateway/_presence_batch.py).
        self.presence = PresenceCalls(coordinator, self.spawn)
        self._session_task: asyncio.Task[None] | None = None

    @property
    def ready(self) -> bool:
        """Ready only while holding a live session (CONVENTIONS: report ready when it holds
        its session and has bound its port; uvicorn binds before the lifespan ends)."""
        s = self.session
        return s is not None and not s.lost.is_set() and not self.shutting_down

    def spawn(self, coro: Any, name: str) -> asyncio.Task[Any] | None:
        """Start a background task owned by the app (cancelled and awaited at shutdown).

        Returns:
            The task, or ``None`` when the app is already shutting down (the coroutine is
            closed unrun and a warning logged: nothing would await it).
        """
        try:
            return self.tasks.spawn(coro, name)
        except RuntimeError:
            log.warning("gateway shutting down: background task %s not started", name)
            return None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._session_task = loop.create_task(self._keep_session(), name="gateway-session")
        self.metrics.on_scrape(functools.partial(_refresh_from_scrape, self, loop, threading.get_ident()))
        # A late loop shows in the log (a session lost under load is then explained).
        self.spawn(watch_loop_lag("gateway"), name="loop-lag")

    async def wait_session(self, timeout: float) -> Any | None:
        """The live session, waiting up to ``timeout`` seconds for one; ``None`` if none."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.ready:
            left = deadline - loop.time()
            if left <= 0:
                return None
            self.session_changed.clear()
            try:
                async with asyncio.timeout(min(left, 0.2)):  # not wait_for: it can swallow a cancel on 3.11
                    await self.session_changed.wait()
            except TimeoutError:
                pass
        return self.session

    async def _keep_session(self) -> None:
        """Hold a gateway session; reopen it when lost (readers then re-register)."""
        delay = 0.1
        while not self.shutting_down:
            try:
                session = await self.coordinator.open_session(ttl=self.settings.session_ttl,
                                                              owner=self.settings.gateway_id,
                                                              probe_address=self.settings.probe_address,
                                                              own_thread=True)  # a busy loop keeps it
            except e.BatonError as exc:
                log.warning("cannot open the gateway session yet: %s", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            delay = 0.1
            self.session = session
            self.session_changed.set()
            log.info("gateway session %s open", session.id)
            await session.lost.wait()
            if self.session is session:
                self.session = None
            self.session_changed.set()
            if not self.shutting_down:
                log.warning("gateway session %s lost; reopening", session.id)

    async def aclose(self) -> None:
        """Shutdown: not ready → stop triggers → cancel owned tasks → close the session and channels."""
        if self.shutting_down:
            return
        self.shutting_down = True
        await self.takeovers.aclose()
        await self.tasks.aclose()
        if self._session_task is not None:
            await cancel_and_join(self._session_task)
        session, self.session = self.session, None
        if session is not None:
            try:
                async with asyncio.timeout(5.0):
                    await session.close()
            except (e.BatonError, TimeoutError) as exc:
                log.warning("closing the gateway session failed: %s", exc)
        await self.hubs.aclose()
        await self.log_health.aclose()
        await self.hosts.close()
        if self.gzip is not None:
            self.gzip.close()


def _refresh_from_scrape(st: GatewayState, loop: asyncio.AbstractEventLoop, loop_thread: int) -> None:
    """Before a scrape of the metrics listener (its own thread): refresh the runs by status
    on the loop, waiting at most 2.5 s (a stuck loop leaves the last values). A scrape of the
    public ``/metrics`` runs on the loop and has refreshed them already."""
    if threading.get_ident() == loop_thread or st.shutting_down or loop.is_closed():
        return
    fut = asyncio.run_coroutine_threadsafe(refresh_runs_by_status(st), loop)
    try:
        fut.result(timeout=2.5)
    except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError, RuntimeError):
        fut.cancel()
