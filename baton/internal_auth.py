"""The cluster's internal credentials: a shared token on every internal gRPC call, and TLS.

The coordinator and the sandbox hosts are internal services; with ``BATON_INTERNAL_TOKEN``
set they refuse (``UNAUTHENTICATED``, ``ErrorInfo`` reason ``UNAUTHENTICATED``) any call
that does not carry the token in the ``x-baton-internal-token`` metadata. Health checks and
server reflection stay open (container and Kubernetes probes carry no credentials).

The token deploys with nothing but a Secret (no CA, no per-pod certificates to issue and
rotate) and is checked in one interceptor, but alone it does not encrypt. TLS comes from
:mod:`baton.tls` (``BATON_TLS_*``): :func:`channel` and :func:`sync_channel` dial TLS when it
is set, presenting this process's certificate, and with ``BATON_TLS_CLIENT_AUTH=1`` the
servers refuse callers without a certificate of the cluster's CA (mutual TLS) in the
handshake, before any token is looked at. Token, mutual TLS, or both. The token never appears
in a log, an error or a record: comparisons are constant-time, and refusals name no value.
"""
from __future__ import annotations

import hmac
import os
from typing import Any, Awaitable, Callable, Sequence, cast

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from baton import tls as _tls
from baton.trace_context import METADATA_KEY as _TRACE_KEY, TRACEPARENT

TOKEN_METADATA = "x-baton-internal-token"
ENV = "BATON_INTERNAL_TOKEN"
#: Methods callable without the token (probes and tooling).
OPEN_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
_DOMAIN = "baton.dev"


def token_from_env(env: Any = None) -> str:
    """``BATON_INTERNAL_TOKEN`` (``""`` when unset: no internal auth)."""
    return (os.environ if env is None else env).get(ENV, "")


def _refusal() -> grpc.Status:
    info = error_details_pb2.ErrorInfo(reason="UNAUTHENTICATED", domain=_DOMAIN)
    detail = any_pb2.Any()
    detail.Pack(info)
    return rpc_status.to_status(status_pb2.Status(
        code=code_pb2.UNAUTHENTICATED, message="internal service: the cluster's internal token is required",
        details=[detail]))


async def _deny(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    await context.abort_with_status(_refusal())  # type: ignore[attr-defined]  # grpc-stubs' aio context lacks it


class TokenCheck(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]  # generic only in grpc-stubs, not at runtime
    """Server interceptor refusing calls without the token (except :data:`OPEN_PREFIXES`).

    Args:
        token: the expected token; must not be empty.
    """

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("TokenCheck needs a non-empty token")
        self._token = token.encode()

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_PREFIXES):
            return handler
        got = b""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == TOKEN_METADATA:
                got = value.encode() if isinstance(value, str) else value
        if got and hmac.compare_digest(got, self._token):
            return handler
        # The same kind of handler as the real one, answering UNAUTHENTICATED.
        kw = dict(request_deserializer=handler.request_deserializer,
                  response_serializer=handler.response_serializer)
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(_deny, **kw)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(_deny, **kw)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(_deny, **kw)
        return grpc.unary_unary_rpc_method_handler(_deny, **kw)


def server_interceptors(token: str | None = None) -> list[grpc.aio.ServerInterceptor[Any, Any]]:
    """Interceptors for an internal server: the token check, or none without a token.

    Args:
        token: the cluster's token; ``None`` reads ``BATON_INTERNAL_TOKEN``.
    """
    token = token_from_env() if token is None else token
    return [TokenCheck(token)] if token else []


# The token rides as call metadata, added by wrapping the channel's multi-callable factories.
# Not an interceptor: grpc.aio files each interceptor under the FIRST call kind it is an
# instance of (an if/elif chain in grpc/aio/_channel.py), so one all-kinds interceptor saw
# unary calls only and the streams (the session keep-alive, watches) went out without the
# token; a stream interceptor breaks a stream-stream call written to without a request
# iterator (the keep-alive: "RPC already finished"); and every intercepted call costs an
# extra task. One wrapper covers the four kinds alike.
class _WithToken:
    """A multi-callable that adds the token (when there is one) and the run's trace context
    (:data:`baton.trace_context.TRACEPARENT`, when set) to each call's metadata."""

    def __init__(self, callable_: Any, pair: tuple[str, str] | None) -> None:
        self._callable = callable_
        self._pair = pair

    def __call__(self, *args: Any, metadata: Any = None, **kwargs: Any) -> Any:
        pairs = list(metadata) if metadata else []
        if self._pair is not None:
            pairs.append(self._pair)
        traceparent = TRACEPARENT.get()
        if traceparent:
            pairs.append((_TRACE_KEY, traceparent))
        if not pairs:
            return self._callable(*args, metadata=metadata, **kwargs)
        return self._callable(*args, metadata=grpc.aio.Metadata(*pairs), **kwargs)


class _TokenChannel:
    """An aio channel whose calls all carry the token and the caller's trace context;
    everything else is the channel's.

    A proxy rather than factories patched onto the channel: those would close a reference
    cycle through the channel (its attribute -> a bound method of itself), leaving a Cython
    grpc object to the cycle collector, to be finalized at any time, even after its loop.
    """

    def __init__(self, channel: grpc.aio.Channel, token: str) -> None:
        self._channel = channel
        self._pair = (TOKEN_METADATA, token) if token else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)

    def unary_unary(self, *args: Any, **kwargs: Any) -> Any:
        return _WithToken(self._channel.unary_unary(*args, **kwargs), self._pair)

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        return _WithToken(self._channel.unary_stream(*args, **kwargs), self._pair)

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        return _WithToken(self._channel.stream_unary(*args, **kwargs), self._pair)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        return _WithToken(self._channel.stream_stream(*args, **kwargs), self._pair)

    async def __aenter__(self) -> "_TokenChannel":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._channel.close(None)


#: The service config of a ``dns:`` target: one subchannel per resolved address, calls spread
#: over them (gRPC's default, pick_first, would send everything to the first address).
ROUND_ROBIN = ("grpc.service_config", '{"loadBalancingConfig": [{"round_robin": {}}]}')


def balanced(address: str, options: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``options`` plus :data:`ROUND_ROBIN` when ``address`` is a ``dns:`` target (a headless
    Kubernetes Service naming every replica, docs/deploy.md "Kubernetes") or an ``ipv4:`` /
    ``ipv6:`` address list; a ``host:port`` is one server and keeps gRPC's default."""
    if address.startswith(("dns:", "ipv4:", "ipv6:")) and not any(k == ROUND_ROBIN[0] for k, _ in options):
        return [*options, ROUND_ROBIN]
    return list(options)


def channel(address: str, options: Sequence[tuple[str, Any]] = (), token: str | None = None,
            tls: _tls.GrpcTls | None = None) -> grpc.aio.Channel:
    """An aio channel to an internal service that sends the token on every call, and the
    trace context of the run the caller is handling (:mod:`baton.trace_context`).

    Args:
        address: ``host:port``, or a ``dns:///name:port`` target whose addresses the calls
            are spread over (:func:`balanced`).
        token: the cluster's token; ``None`` reads ``BATON_INTERNAL_TOKEN``; ``""`` sends none.
        tls: the internal links' TLS; ``None`` reads ``BATON_TLS_*`` (:func:`baton.tls.from_env`).

    Raises:
        baton.tls.TlsConfigError: ``tls`` is ``None`` and a ``BATON_TLS_*`` file is unusable.
    """
    token = token_from_env() if token is None else token
    tls = _tls.from_env() if tls is None else tls
    ch = _tls.aio_channel(address, balanced(address, options), tls)
    return cast(grpc.aio.Channel, _TokenChannel(ch, token))


def insecure_channel(address: str, options: Sequence[tuple[str, Any]] = (), token: str | None = None
                     ) -> grpc.aio.Channel:
    """:func:`channel` in plaintext, whatever ``BATON_TLS_*`` says (loopback tools, tests)."""
    return channel(address, options, token, _tls.PLAINTEXT)


class _SyncAddToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[type-arg]  # generic only in grpc-stubs, not at runtime
    def __init__(self, token: str) -> None:
        self._pair = (TOKEN_METADATA, token)

    def _details(self, d: Any) -> Any:
        return _SyncDetails(d.method, d.timeout, [*(d.metadata or ()), self._pair], d.credentials,
                            getattr(d, "wait_for_ready", None), getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)


class _SyncDetails(grpc.ClientCallDetails):
    def __init__(self, method: str, timeout: Any, metadata: Any, credentials: Any, wait_for_ready: Any,
                 compression: Any) -> None:
        self.method, self.timeout, self.metadata = method, timeout, metadata
        self.credentials, self.wait_for_ready, self.compression = credentials, wait_for_ready, compression


def sync_channel(address: str, options: Sequence[tuple[str, Any]] = (), token: str | None = None,
                 tls: _tls.GrpcTls | None = None) -> grpc.Channel:
    """A blocking channel to an internal service that sends the token (for the CLI); TLS as
    :func:`channel` (``None`` reads ``BATON_TLS_*``)."""
    token = token_from_env() if token is None else token
    tls = _tls.from_env() if tls is None else tls
    ch = _tls.sync_channel(address, balanced(address, options), tls)
    return grpc.intercept_channel(ch, _SyncAddToken(token)) if token else ch
