"""The gateway's Starlette app (docs/design.md §6): the only public door.

All state lives in the ASGI lifespan: the coordinator client and the gateway session, the
NATS connection (delivery log reads, transcripts), host channels and the app's tasks, and
the run service (:mod:`gateway._service`) that the HTTP routes, the gRPC server and ``/ds``
call.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from baton import errors as e, gc_tuning
from gateway import _routes_chat as chat
from gateway import _routes_misc as misc
from gateway import _routes_ops as ops
from gateway import durable_streams
from gateway._errors import handle_baton_error
from baton.metrics import start_listener
from gateway._metrics import Metrics, count_requests
from gateway._service import RunService
from gateway._settings import GatewaySettings
from gateway._state import GatewayState

log = logging.getLogger("gateway")


async def _client_gone(request: Request, exc: Exception) -> Response:
    # Nobody reads this answer: the client closed the connection before its body ended (an
    # aborted upload, a closed tab). Not an error of ours: one line, no traceback.
    log.info("%s %s: the client went away before its request body ended", request.method, request.url.path)
    return Response(status_code=400)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("%s %s failed", request.method, request.url.path, exc_info=exc)
    return JSONResponse({"error": "internal error", "reason": "INTERNAL"}, status_code=500)


class _Gateway(Starlette):
    """Starlette, except that Durable Streams requests (``/ds/...``) go straight to the
    protocol's ASGI app: it maps its own errors (an unexpected one to the same 500 body as
    :func:`_internal_error`), and Starlette's error and exception middleware plus a walk over
    every route before the ``/ds`` mount were a large share of an append's Python time."""

    ds_direct: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            # Counted by route template and status class (baton_gateway_requests_total).
            await count_requests(self, self._dispatch, scope, receive, send)
        else:
            await self._dispatch(scope, receive, send)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (self.ds_direct is not None and scope["type"] == "http" and not scope.get("root_path")
                and scope["path"].startswith(DS_DIRECT)):
            scope["app"] = self
            scope["root_path"] = durable_streams.PREFIX  # what the mount would set
            await self.ds_direct(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


DS_DIRECT = durable_streams.PREFIX + "/"


def create_app(settings: GatewaySettings | None = None) -> Starlette:
    """Build the gateway app.

    Args:
        settings: the gateway settings; ``GatewaySettings.from_env()`` when omitted.

    Returns:
        A Starlette app whose lifespan connects to the coordinator and NATS, opens the
        gateway session (``/readyz`` answers 200 only while it is held), and closes all of
        it on shutdown.
    """
    settings = settings or GatewaySettings.from_env()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Imported here: the composition root is the only place that builds clients.
        from baton.coordinator_client import CoordinatorClient
        from baton.log import DeliveryLog, LogConfig, TranscriptStore
        from baton.workspaces import WorkspaceConfig, WorkspaceStore

        cfg = settings.log_config or LogConfig.from_env()
        async with CoordinatorClient(list(settings.coordinator), token=settings.internal_token,
                                     tls=settings.internal_tls) as cc:
            dl = await DeliveryLog.connect(settings.nats_url, cfg)
            try:
                from baton.log import provision_with_patience

                state = GatewayState(settings, cc, dl, TranscriptStore(dl.nc, cfg), Metrics())
                state.workspaces = WorkspaceStore(dl.nc, settings.workspace_config or WorkspaceConfig.from_env())
                await provision_with_patience(dl, state.workspaces)
                app.state.gateway = state
                # The one service layer under the three edges (HTTP routes, gRPC, /ds).
                runs = app.state.runs = RunService(state)
                state.start()
                # Starts each thread's next queued run once the thread is idle (every gateway).
                from gateway._service._queue import QueueDispatcher

                state.spawn(QueueDispatcher(state).run(), name="queue-dispatcher")
                ds_store = await durable_streams.start_for(app, runs)
                grpc_server = metrics_listener = None
                try:
                    # Prometheus on its own port: no tenant key reads cluster-wide counts.
                    metrics_listener = start_listener(state.metrics.registry, settings.metrics_listen,
                                                      "BATON_GATEWAY_METRICS_LISTEN")
                    state.metrics_port = metrics_listener.port if metrics_listener else 0
                    if settings.grpc_listen:
                        # The gRPC twin of the HTTP API, on its own port, sharing this state.
                        from gateway._grpc import RunsServer

                        # Workers of one gateway bind the same port (SO_REUSEPORT; gateway/_workers.py).
                        grpc_server = RunsServer(runs, settings.grpc_listen, settings.public_tls,
                                                 reuse_port=settings.workers > 1)
                        await grpc_server.start()
                        state.grpc_port = grpc_server.port
                    gc_tuning.freeze_startup()  # what start-up built lives as long as the process
                    yield
                finally:
                    if grpc_server is not None:
                        await grpc_server.stop()
                    if metrics_listener is not None:
                        await asyncio.to_thread(metrics_listener.stop)
                    await ds_store.stop()
                    await state.aclose()
            finally:
                await dl.close()

    ds_app = durable_streams.build_app(lambda: durable_streams.of(app_ref))
    routes = [
        *ops.ROUTES,  # read-only routes of the web pages (threads, operator view)
        Route("/api/chat", chat.start_chat, methods=["POST"]),
        Route("/api/chat", chat.join_chat, methods=["GET"]),
        Route("/api/chat/active", chat.active_run, methods=["GET"]),
        Route("/api/chat/cancel", chat.cancel_chat, methods=["POST"]),
        # `path`, not `str`: ids may contain "/" (baton.ids), sent percent-encoded.
        Route("/api/runs/{run_id:path}/approvals/{approvalId}", misc.answer_approval, methods=["POST"]),
        Route("/api/runs/{run_id:path}/messages", misc.steer_run, methods=["POST"]),
        Route("/api/runs/{run_id:path}/keep", misc.keep_run, methods=["POST"]),
        Route("/api/runs/{run_id:path}/messages", misc.run_messages, methods=["GET"]),
        Route("/api/runs/{run_id:path}", misc.get_run, methods=["GET"]),
        Route("/api/threads/{thread_id:path}/messages", misc.thread_messages, methods=["GET"]),
        # run_id:path: a run id may hold "/", and a DELETE under /queue/ must never fall
        # through to the thread's DELETE below.
        Route("/api/threads/{thread_id:path}/queue/{run_id:path}", chat.cancel_queued, methods=["DELETE"]),
        Route("/api/threads/{thread_id:path}/queue", chat.thread_queue, methods=["GET"]),
        Route("/api/threads/{thread_id:path}/fork", misc.fork_thread, methods=["POST"]),
        Route("/api/threads/{thread_id:path}", misc.delete_thread, methods=["DELETE"]),
        Route("/api/agents", misc.agents, methods=["GET"]),
        Route("/healthz", misc.healthz, methods=["GET"]),
        Route("/readyz", misc.readyz, methods=["GET"]),
        Route("/metrics", misc.metrics, methods=["GET"]),
        Route("/", misc.index, methods=["GET"]),
        Mount("/static", app=StaticFiles(directory=str(misc.STATIC)), name="static"),
        # The Durable Streams protocol (gateway/durable_streams): its own namespace and store.
        Mount(durable_streams.PREFIX, app=ds_app),
    ]
    app_ref = _Gateway(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={e.BatonError: handle_baton_error, ClientDisconnect: _client_gone,
                            Exception: _internal_error},
    )
    app_ref.ds_direct = ds_app
    return app_ref
