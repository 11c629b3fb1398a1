"""The Durable Streams ASGI app mounted by the gateway, and its lifecycle."""
from __future__ import annotations

import logging
from typing import Any, Callable, Mapping
from urllib.parse import quote

import nats.errors
import nats.js.errors
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, Router

from baton import errors as e
from gateway._auth import tenant_of
from gateway._errors import Unauthorized, error_body
from gateway.durable_streams import _protocol as P
from gateway.durable_streams._routes import DSSettings, Handlers, text
from gateway.durable_streams._store import Conflict, StoreConfig, StreamStore

log = logging.getLogger("gateway.durable_streams")

RUNS = "/runs/"


class DurableStreams:
    """The protocol's app: one store, the gateway's API keys, and the run-log view.

    Args:
        store: the started :class:`StreamStore`.
        settings: protocol limits.
        api_keys: the gateway's bearer key → tenant map (empty: no auth).
        runs: serves ``/runs/<runId>`` (read-only run logs), or ``None`` to answer 404.
    """

    def __init__(self, store: StreamStore, settings: DSSettings, api_keys: Mapping[str, str],
                 runs: Callable[[Request, str, str], Any] | None = None) -> None:
        self.handlers = Handlers(store, settings)
        self.api_keys = api_keys
        self.runs = runs

    async def handle(self, request: Request) -> Response:
        """Dispatch one request; protocol errors become their status, never a 500."""
        public = "/" + request.path_params.get("path", "")
        method = request.method.upper()
        try:
            if method == "OPTIONS":
                return Response(b"", status_code=204)
            tenant = tenant_of(request, self.api_keys)
            if public.startswith(RUNS) and self.runs is not None:
                resp: Response = await self.runs(request, public[len(RUNS):], tenant)
                return resp

            def qualify(p: str) -> str:
                # A tenant's streams live in its own namespace; "@" never starts a client path.
                # The tenant is quoted ("/" and "%" too) and the path made to start with "/",
                # so no path of one tenant ("acme" + "2/s", "acme" + "/x/s") spells another's
                # ("acme2" + "/s", "acme/x" + "/s"). A fork source is a header, free text.
                if not p.startswith("/"):
                    p = "/" + p
                return f"@{quote(tenant, safe='')}{p}" if tenant else p

            path = qualify(public)
            h = self.handlers
            if method == "PUT":
                return await h.put(request, path, qualify)
            if method == "POST":
                return await h.post(request, path)
            if method == "GET":
                return await h.get(request, path, public)
            if method == "HEAD":
                return await h.head(path, public)
            if method == "DELETE":
                return await h.delete(path)
            return text(405, "Method not allowed")
        except P.ProtocolError as exc:
            return text(exc.status, exc.reason, exc.headers)
        except Unauthorized:
            return text(401, "Unauthorized", {"www-authenticate": "Bearer"})
        except e.BatonError as exc:
            status, body = error_body(exc)
            return text(status, str(body.get("error", "")))
        except (Conflict, nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
            log.warning("%s %s: JetStream failed: %r", method, public, exc)
            return text(503, "Stream storage unavailable", {"retry-after": "1"})


def build_app(ds: Callable[[], DurableStreams | None]) -> Router:
    """The ASGI app to mount (``Mount("/ds", app=build_app(...))``).

    Args:
        ds: returns the live :class:`DurableStreams` (built in the gateway's lifespan), or
            ``None`` before it is ready (then 503).
    """

    async def endpoint(request: Request) -> Response:
        app = ds()
        if app is None:
            resp = text(503, "Not ready", {"retry-after": "1"})
        else:
            resp = await app.handle(request)
        for k, v in P.CORS_HEADERS.items():
            resp.headers.setdefault(k, v)
        return resp

    methods = ["GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS"]
    return Router(routes=[Route("/{path:path}", endpoint, methods=methods)])


PREFIX = "/ds"


def settings_from_env(env: Mapping[str, str]) -> tuple[DSSettings, StoreConfig]:
    """``BATON_DS_LONG_POLL_S``, ``BATON_DS_MAX_APPEND_BYTES``, ``BATON_DS_REPLICAS``,
    ``BATON_DS_MAX_BYTES`` (docs/design.md §9).

    Raises:
        ValueError: naming the variable when a value is malformed.
    """
    def num(name: str, default: float) -> float:
        raw = env.get(name, "")
        try:
            return float(raw) if raw else default
        except ValueError as exc:
            raise ValueError(f"{name} must be a number, got {raw!r}") from exc

    ds = DSSettings(long_poll_timeout=num("BATON_DS_LONG_POLL_S", DSSettings.long_poll_timeout),
                    max_append_bytes=int(num("BATON_DS_MAX_APPEND_BYTES", DSSettings.max_append_bytes)))
    store = StoreConfig(replicas=int(num("BATON_DS_REPLICAS", StoreConfig.replicas)),
                        max_bytes=int(num("BATON_DS_MAX_BYTES", StoreConfig.max_bytes)))
    return ds, store


async def start_for(app: Any, state: Any) -> StreamStore:
    """Start the store on the gateway's NATS connection and publish the app on ``app.state``.

    Returns:
        The started store (the caller stops it on shutdown).
    """
    import os

    from gateway.durable_streams._runs import RunLogs

    ds_settings, store_cfg = settings_from_env(os.environ)
    store = StreamStore(state.log.nc, store_cfg)
    await store.start()
    runs = RunLogs(state, ds_settings)
    app.state.durable_streams = DurableStreams(store, ds_settings, state.settings.api_keys, runs.handle)
    return store


def of(app: Any) -> DurableStreams | None:
    """The live app, or ``None`` before the lifespan built it."""
    return getattr(app.state, "durable_streams", None)
