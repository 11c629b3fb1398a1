"""Tracing with OpenTelemetry: one trace per run, across the gateway, the coordinator and hosts.

Configured by the standard ``OTEL_*`` variables and exported with OTLP over gRPC; off (no
provider, every span a no-op) unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set, and off when ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none``. The sampler, batch delays, headers and resource attributes are
the SDK's own ``OTEL_*`` settings; ``service.name`` defaults to ``baton-<service>``.

The run's trace:

* the gateway's ``run.start`` span (continuing a client's ``traceparent`` header, if any) is
  the run's root; the gRPC calls made under it carry ``traceparent`` metadata
  (:mod:`baton.trace_context`), and :class:`TracingInterceptor` on the coordinator and the
  hosts opens a server span for each call that carries one, and only for those (keep-alives,
  watches and sweeps outside a run make no trace);
* the host that creates the record stores the root's context in ``RunRecord.trace_parent``,
  so it outlives every process; each host that claims the run (a fresh start, a takeover
  after a crash or a drain) opens ``run.claim`` and ``run.drive`` spans under it, a takeover's
  with a span link to the stored context (``baton.link = takeover``), and hands the drive
  span's ``traceparent`` to the agent (``TRACEPARENT`` in its environment).

The global tracer provider of the OpenTelemetry API is used (set once by the composition
root): the API is built around it, and with none set every span is a cheap no-op.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, Mapping

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from baton.trace_context import METADATA_KEY, TRACEPARENT

__all__ = ["TracingInterceptor", "activate", "configure_tracing", "current_traceparent", "parent_of",
           "remote_parent", "run_span", "server_interceptors", "span_traceparent", "tracer", "tracing_enabled"]

_PROPAGATOR = TraceContextTextMapPropagator()
_TRUE = ("1", "true", "yes", "on")


def tracing_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether the ``OTEL_*`` variables ask for traces (an OTLP endpoint set, SDK not disabled)."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE:
        return False
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() not in ("", "otlp"):
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def configure_tracing(service: str, env: Mapping[str, str] | None = None) -> Any:
    """Install the process's tracer provider (OTLP/gRPC exporter, batched) when asked for.

    Args:
        service: the service's short name; ``service.name`` is ``baton-<service>`` unless
            ``OTEL_SERVICE_NAME`` (or ``OTEL_RESOURCE_ATTRIBUTES``) names it.

    Returns:
        The provider (call ``shutdown()`` at exit: it flushes the spans still batched), or
        ``None`` when tracing is off.
    """
    env = os.environ if env is None else env
    if not tracing_enabled(env):
        return None
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    named = env.get("OTEL_SERVICE_NAME") or "service.name=" in env.get("OTEL_RESOURCE_ATTRIBUTES", "")
    resource = Resource.create({} if named else {SERVICE_NAME: f"baton-{service}"})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider


def tracer() -> trace.Tracer:
    """The tracer of baton's spans (a no-op one while no provider is installed)."""
    return trace.get_tracer("baton")


def span_traceparent(ctx: SpanContext | None) -> str:
    """The W3C ``traceparent`` of ``ctx`` (``""`` for none or an invalid one)."""
    if ctx is None or not ctx.is_valid:
        return ""
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def parent_of(traceparent: str) -> SpanContext | None:
    """The remote span context a stored or received ``traceparent`` names (``None`` when
    empty or malformed)."""
    if not traceparent:
        return None
    ctx = trace.get_current_span(_PROPAGATOR.extract({"traceparent": traceparent})).get_span_context()
    return ctx if ctx.is_valid else None


def current_traceparent() -> str:
    """The ``traceparent`` of the span current in this task (``""`` when none)."""
    return TRACEPARENT.get() or span_traceparent(trace.get_current_span().get_span_context())


@contextlib.contextmanager
def activate(span: Span) -> Iterator[Span]:
    """Make ``span`` current (log lines carry its ids; internal gRPC calls its context)
    without ending it on exit."""
    token = TRACEPARENT.set(span_traceparent(span.get_span_context()) if span.is_recording() else TRACEPARENT.get())
    try:
        with trace.use_span(span, end_on_exit=False):
            yield span
    finally:
        TRACEPARENT.reset(token)


@contextlib.contextmanager
def in_span(span: Span, *, current: bool = True) -> Iterator[Span]:
    """Run the block in ``span`` and end it with the block: current within it (as
    :func:`activate`) unless ``current`` is false, and marked ``ERROR`` (the exception's type)
    when the block raises.

    ``current=False`` is for an async generator's body: a context variable set in it may be
    reset from another context (its finalizer), which the context API refuses.
    """
    try:
        if current:
            with activate(span):
                yield span
        else:
            yield span
    except BaseException as exc:
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        raise
    finally:
        span.end()


@contextlib.contextmanager
def remote_parent(traceparent: str | None) -> Iterator[None]:
    """Spans started within the block continue the caller's trace (an incoming
    ``traceparent`` header); a block without one (or a malformed one) changes nothing."""
    ctx = parent_of(traceparent or "")
    if ctx is None:
        yield
        return
    token = otel_context.attach(trace.set_span_in_context(trace.NonRecordingSpan(ctx)))
    try:
        yield
    finally:
        otel_context.detach(token)


def run_span(name: str, trace_parent: str | None, attributes: Mapping[str, Any], *, takeover: bool = False,
             kind: SpanKind = SpanKind.INTERNAL, start_time: int | None = None) -> Span:
    """Start (not activate) a span of a run under its stored ``trace_parent``.

    Args:
        name: ``run.start``, ``run.claim``, ``run.drive``...
        trace_parent: ``RunRecord.trace_parent`` (``""``: the span starts a trace of its own;
            ``None``: a child of the span current in this task, if any).
        attributes: ``baton.*`` attributes (run id, epoch, host).
        takeover: the claim follows another owner's: the span links to the stored context.
        start_time: nanoseconds since the epoch (a span opened after what it measures).
    """
    if trace_parent is None:
        return tracer().start_span(name, kind=kind, attributes=dict(attributes), start_time=start_time)
    parent = parent_of(trace_parent)
    ctx = trace.set_span_in_context(trace.NonRecordingSpan(parent)) if parent is not None else otel_context.Context()
    links = [Link(parent, {"baton.link": "takeover"})] if takeover and parent is not None else None
    return tracer().start_span(name, context=ctx, kind=kind, attributes=dict(attributes), links=links,
                               start_time=start_time)


# --- gRPC server side --------------------------------------------------------------------------


def _incoming(details: grpc.HandlerCallDetails) -> str:
    for key, value in details.invocation_metadata or ():
        if key == METADATA_KEY:
            return value if isinstance(value, str) else value.decode()
    return ""


def server_interceptors(env: Mapping[str, str] | None = None) -> list[grpc.aio.ServerInterceptor[Any, Any]]:
    """``[TracingInterceptor()]`` when tracing is on (:func:`tracing_enabled`), else ``[]``:
    an untraced server pays nothing per call."""
    return [TracingInterceptor()] if tracing_enabled(env) else []


class TracingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]  # generic only in grpc-stubs
    """A server span for every unary call (or server stream) that carries ``traceparent``
    metadata, as a child of the caller's span; calls without it pass through untouched.

    The span is named ``<package.Service>/<Method>``, carries ``baton.run_id`` when the
    request has a ``run_id``, and is current while the handler runs (its own calls to other
    services carry it on).
    """

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        traceparent = _incoming(handler_call_details)
        if not traceparent:
            return handler
        name = handler_call_details.method.lstrip("/")
        h: Any = handler  # grpc's handlers are namedtuples; the stubs type the behaviours as sync
        if handler.response_streaming:
            return h._replace(unary_stream=_traced_stream(h.unary_stream, name, traceparent))  # type: ignore[no-any-return]
        return h._replace(unary_unary=_traced_unary(h.unary_unary, name, traceparent))  # type: ignore[no-any-return]


def _server_span(name: str, traceparent: str, request: Any) -> Span:
    attributes = {"rpc.system": "grpc", "rpc.method": name}
    run_id = getattr(request, "run_id", "")
    if isinstance(run_id, str) and run_id:
        attributes["baton.run_id"] = run_id
    return run_span(name, traceparent, attributes, kind=SpanKind.SERVER)


def _traced_unary(behavior: Callable[..., Awaitable[Any]], name: str, traceparent: str
                  ) -> Callable[[Any, Any], Awaitable[Any]]:
    async def traced(request: Any, context: Any) -> Any:
        with in_span(_server_span(name, traceparent, request)):
            return await behavior(request, context)
    return traced


def _traced_stream(behavior: Callable[..., AsyncIterator[Any]], name: str, traceparent: str
                   ) -> Callable[[Any, Any], AsyncIterator[Any]]:
    async def traced(request: Any, context: Any) -> AsyncIterator[Any]:
        with in_span(_server_span(name, traceparent, request), current=False):
            async for item in behavior(request, context):
                yield item
    return traced
