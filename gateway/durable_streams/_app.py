"""The Durable Streams ASGI app mounted by the gateway, and its lifecycle."""
from __future__ import annotations

import logging
from typing import Any, Callable, Mapping
from urllib.parse import quote, unquote

import nats.errors
import nats.js.errors
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocketClose

from baton import errors as e
from gateway._auth import one_authorization, tenant_of_header
from gateway._errors import SeveralCredentials, Unauthorized, error_body
from gateway.durable_streams import _protocol as P
from gateway.durable_streams._routes import DSSettings, Handlers, Reply, text
from gateway.durable_streams._quota import QuotaLimits
from gateway.durable_streams._store import Conflict, StoreConfig, StreamStore

log = logging.getLogger("gateway.durable_streams")

RUNS = "/runs/"
# The request headers Handlers.post reads (ASGI names: lower case); auth reads its own.
_READ = frozenset(n.lower().encode() for n in (
    "content-type", P.CLOSED, P.SEQ, P.PRODUCER_ID, P.PRODUCER_EPOCH, P.PRODUCER_SEQ))


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

    async def handle(self, scope: Scope, receive: Receive, public: str) -> Response | Reply:
        """Dispatch one request for ``public`` (the path under ``/ds``, starting with "/");
        protocol errors become their status, never a 500.

        An append (POST) reads its headers and body straight from the ASGI scope and
        ``receive`` (the protocol's hot path); other methods get a Starlette
        ``Request``.
        """
        method: str = scope["method"]
        try:
            if method == "OPTIONS":
                return Response(b"", status_code=204, headers=P.PREFLIGHT_HEADERS)
            # The headers an append reads, by lower-case name, the first of repeated headers
            # winning (as Starlette's); others are not decoded.
            h = {k.decode("latin-1"): v.decode("latin-1") for k, v in reversed(scope["headers"]) if k in _READ}
            tenant = ""
            if self.api_keys:
                sent = [v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"]
                tenant = tenant_of_header(one_authorization(sent), self.api_keys)
            P.check_stream_path(public)
            if public.startswith(RUNS) and self.runs is not None:
                # A run id is baton's own name, not a client's stream path: escapes decoded.
                resp: Response = await self.runs(Request(scope, receive), unquote(public[len(RUNS):]), tenant)
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
            handlers = self.handlers
            if method == "POST":
                return await handlers.post(h, receive, path)
            if method == "PUT":
                return await handlers.put(Request(scope, receive), path, public, qualify)
            if method == "GET":
                return await handlers.get(Request(scope, receive), path, public)
            if method == "HEAD":
                return await handlers.head(path, public)
            if method == "DELETE":
                return await handlers.delete(path)
            return text(405, "Method not allowed")
        except P.ProtocolError as exc:
            return text(exc.status, exc.reason, exc.headers)
        except SeveralCredentials as exc:
            return text(401, f"Unauthorized: {exc}", {"www-authenticate": "Bearer"})
        except Unauthorized:
            return text(401, "Unauthorized", {"www-authenticate": "Bearer"})
        except e.BatonError as exc:
            status, body = error_body(exc)
            return text(status, str(body.get("error", "")))
        except (Conflict, nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
            log.warning("%s %s: JetStream failed: %r", method, public, exc)
            return text(503, "Stream storage unavailable", {"retry-after": "1"})


METHODS = ("GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS")
_CORS_RAW = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in P.CORS_HEADERS.items()]
_CORS_NAMES = frozenset(k for k, _ in _CORS_RAW)


def build_app(ds: Callable[[], DurableStreams | None]) -> ASGIApp:
    """The protocol's plain ASGI app, mounted at ``/ds`` (``Mount("/ds", app=...)``, or
    called directly by the gateway for ``/ds/...`` with ``root_path`` = ``/ds``).

    A plain ASGI callable, not a Starlette router: the path under ``root_path`` is the
    stream path, and every response is sent as two ASGI messages with the CORS headers
    added, which keeps the per-append Python work small. An unexpected error
    is logged and answered 500 (``{"error": "internal error", "reason": "INTERNAL"}``, as
    the gateway's other routes), so the app needs no error middleware around it.

    Args:
        ds: returns the live :class:`DurableStreams` (built in the gateway's lifespan), or
            ``None`` before it is ready (then 503).
    """

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await WebSocketClose()(scope, receive, send)
            return
        path: str = scope["path"]
        public = stream_path(scope)
        method = scope["method"]
        resp: Response | Reply
        if method not in METHODS:
            resp = text(405, "Method Not Allowed", {"allow": ", ".join(METHODS)})
        else:
            live = ds()
            if live is None:
                resp = text(503, "Not ready", {"retry-after": "1"})
            else:
                try:
                    resp = await live.handle(scope, receive, public)
                except ClientDisconnect:
                    # An aborted upload: nobody reads the answer, and it is not our error.
                    log.info("%s %s: the client went away before its request body ended", method, path)
                    resp = text(400, "Client went away")
                except Exception:
                    log.exception("%s %s failed", method, path)
                    resp = JSONResponse({"error": "internal error", "reason": "INTERNAL"}, status_code=500)
        await respond(resp, scope, receive, send)

    return app


def stream_path(scope: Scope) -> str:
    """The stream path a request names: its path under ``root_path`` as sent, starting with "/".

    The path as sent (ASGI ``raw_path``), percent-escapes kept, as the reference server keys
    streams (``new URL(req.url).pathname``): ``/a%2Fb`` and ``/a/b`` are two streams, as
    TanStack's ``durableStream`` adapter expects of the names it makes
    (``/streams/<prefix>%2F<runId>``). The decoded ``path`` is used only when the raw path is
    missing or does not start with the root as sent (a client escaping the ``/ds`` prefix itself).
    """
    root: str = scope.get("root_path", "")
    raw: bytes | None = scope.get("raw_path")
    if raw is not None:
        sent = raw.decode("latin-1")
        if sent.startswith(root + "/"):
            return sent[len(root):]
    path: str = scope["path"]
    public = path[len(root):] if root and path.startswith(root) else path
    return public if public.startswith("/") else "/" + public


async def respond(resp: Response | Reply, scope: Scope, receive: Receive, send: Send) -> None:
    """Send ``resp`` with the protocol's CORS headers (unless the response set its own)."""
    raw = resp.raw_headers
    if isinstance(resp, Reply):  # an append's answer: never sets CORS headers itself
        raw += _CORS_RAW
    else:
        if not _CORS_NAMES.isdisjoint(k for k, _ in raw):
            names = {k for k, _ in raw}
            raw.extend(h for h in _CORS_RAW if h[0] not in names)
        else:
            raw += _CORS_RAW
        if isinstance(resp, StreamingResponse) or resp.background is not None:
            await resp(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": resp.status_code, "headers": raw})
        await send({"type": "http.response.body", "body": resp.body})
        return
    await send({"type": "http.response.start", "status": resp.status_code, "headers": raw})
    await send({"type": "http.response.body", "body": b""})


PREFIX = "/ds"


def settings_from_env(env: Mapping[str, str]) -> tuple[DSSettings, StoreConfig]:
    """``BATON_DS_LONG_POLL_S``, ``BATON_DS_MAX_APPEND_BYTES``, ``BATON_DS_PUBLIC_URL``, ``BATON_DS_REPLICAS``,
    ``BATON_DS_MAX_BYTES``, ``BATON_DS_MAX_STREAMS_PER_TENANT``, ``BATON_DS_MAX_BYTES_PER_TENANT``
    (docs/design.md §9).

    Raises:
        ValueError: naming the variable when a value is malformed.
    """
    def num(name: str, default: float) -> float:
        raw = env.get(name, "")
        try:
            return float(raw) if raw else default
        except ValueError as exc:
            raise ValueError(f"{name} must be a number, got {raw!r}") from exc

    public_url = env.get("BATON_DS_PUBLIC_URL", "")
    if public_url and (not public_url.startswith(("http://", "https://")) or P.has_control(public_url)):
        raise ValueError(f"BATON_DS_PUBLIC_URL must be an http(s) URL, got {public_url!r}")
    ds = DSSettings(long_poll_timeout=num("BATON_DS_LONG_POLL_S", DSSettings.long_poll_timeout),
                    max_append_bytes=int(num("BATON_DS_MAX_APPEND_BYTES", DSSettings.max_append_bytes)),
                    public_url=public_url)
    def count(name: str, default: int) -> int:
        v = int(num(name, default))
        if v < 0:
            raise ValueError(f"{name} must be 0 (no limit) or more, got {v}")
        return v

    quota = QuotaLimits(streams=count("BATON_DS_MAX_STREAMS_PER_TENANT", QuotaLimits.streams),
                        bytes=count("BATON_DS_MAX_BYTES_PER_TENANT", QuotaLimits.bytes))
    store = StoreConfig(replicas=int(num("BATON_DS_REPLICAS", StoreConfig.replicas)),
                        max_bytes=int(num("BATON_DS_MAX_BYTES", StoreConfig.max_bytes)), quota=quota)
    return ds, store


async def start_for(app: Any, runs: Any) -> StreamStore:
    """Start the store (on its own no-echo NATS connection) and publish the app on ``app.state``.

    Args:
        runs: the gateway's run service (``gateway._service.RunService``): ``/runs/<runId>``
            reads go through it.

    Returns:
        The started store (the caller stops it on shutdown).
    """
    import os

    from baton.log import DeliveryLog
    from gateway.durable_streams._runs import RunLogs

    ds_settings, store_cfg = settings_from_env(os.environ)
    # The store's own connection, without echo: NATS does not deliver this gateway's own
    # records back to its listener for other gateways' writes (one message less per append,
    # for this process and for NATS). Same servers and reconnect policy as the delivery log's.
    # Subjects are ours (``baton.ds.<hex>``, an inbox): nats-py's per-publish check of them
    # (a regex per subject) is skipped.
    settings = runs.state.settings
    stores: list[StreamStore] = []

    async def reconnected() -> None:  # what other gateways wrote meanwhile was never heard
        for s in stores:
            s.reconnected()

    conn = await DeliveryLog.connect(settings.nats_url, no_echo=True, skip_subject_validation=True,
                                     on_reconnected=reconnected)
    store = StreamStore(conn.nc, store_cfg, close=conn.close)
    stores.append(store)
    try:
        await store.start()
    except BaseException:
        await conn.close()
        raise
    logs = RunLogs(runs, ds_settings)
    app.state.durable_streams = DurableStreams(store, ds_settings, settings.api_keys, logs.handle)
    return store


def of(app: Any) -> DurableStreams | None:
    """The live app, or ``None`` before the lifespan built it."""
    return getattr(app.state, "durable_streams", None)
