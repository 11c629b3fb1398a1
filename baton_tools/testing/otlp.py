"""An in-process OTLP trace receiver: the collector's ``TraceService`` over gRPC, keeping spans.

Services started with ``OTEL_EXPORTER_OTLP_ENDPOINT=<receiver.endpoint>`` export their spans
here; tests read :attr:`OtlpReceiver.spans` (each a :class:`ReceivedSpan`). For the tests and
the benches: a real gRPC server speaking the real protocol (``opentelemetry-proto``).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

__all__ = ["OtlpReceiver", "ReceivedSpan"]


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind is not None else None


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span: ids as lower-case hex, attributes as a plain dict."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    #: ``(trace_id, span_id, attributes)`` of each link.
    links: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)


class _Service(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, sink: list[ReceivedSpan]) -> None:
        self._sink = sink

    async def Export(self, request: Any, context: Any) -> Any:
        for rs in request.resource_spans:
            res = {a.key: _value(a.value) for a in rs.resource.attributes}
            service = str(res.get("service.name", ""))
            for ss in rs.scope_spans:
                for s in ss.spans:
                    self._sink.append(ReceivedSpan(
                        service=service, name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(), kind=s.kind,
                        attributes={a.key: _value(a.value) for a in s.attributes},
                        links=[(ln.trace_id.hex(), ln.span_id.hex(), {a.key: _value(a.value) for a in ln.attributes})
                               for ln in s.links]))
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    """``async with OtlpReceiver() as r:`` a TraceService on a free loopback port.

    Attributes:
        endpoint: ``http://127.0.0.1:<port>`` (what ``OTEL_EXPORTER_OTLP_ENDPOINT`` takes).
        spans: every span received so far, in arrival order.
    """

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.endpoint = ""
        self._server: grpc.aio.Server | None = None

    async def start(self) -> "OtlpReceiver":
        self._server = grpc.aio.server()
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _Service(self.spans), self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        self.endpoint = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace=None)

    async def __aenter__(self) -> "OtlpReceiver":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def find(self, match: Callable[[ReceivedSpan], bool]) -> list[ReceivedSpan]:
        return [s for s in self.spans if match(s)]

    async def wait_for(self, match: Callable[[ReceivedSpan], bool], timeout: float = 30.0,
                       what: str = "span") -> ReceivedSpan:
        """The first received span ``match`` accepts, polled until ``timeout`` seconds.

        Raises:
            TimeoutError: none arrived in time (the message lists what did).
        """
        deadline = time.monotonic() + timeout
        while True:
            found = self.find(match)
            if found:
                return found[0]
            if time.monotonic() > deadline:
                seen = sorted({(s.service, s.name) for s in self.spans})
                raise TimeoutError(f"no {what} within {timeout}s; received {seen}")
            await asyncio.sleep(0.05)
