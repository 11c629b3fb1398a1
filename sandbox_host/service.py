"""The gRPC service ``baton.v1.SandboxHost`` (docs/design.md §5): the edge of the run driver.

Domain errors are mapped once, at this edge, through :mod:`baton.grpc_errors`; an error
without a row there (a delivery-log outage, say) becomes ``UNAVAILABLE``.
"""
from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

import grpc

from baton.errors import BatonError
from baton.grpc_errors import abort, mapping_for
from baton.v1 import sandbox_host_pb2 as pb
from baton.v1 import sandbox_host_pb2_grpc as pb_grpc
from sandbox_host.manager import RunManager

log = logging.getLogger("baton.sandbox_host.service")


async def _fail(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> None:
    if isinstance(exc, BatonError) and mapping_for(exc) is not None:
        await abort(context, exc)
    if isinstance(exc, BatonError):
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"{type(exc).__name__}: {exc}")
    log.error("unexpected error", exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")


class SandboxHostService(pb_grpc.SandboxHostServicer):
    """Servicer over a :class:`RunManager`.

    Args:
        manager: the host's run manager.
        drain: the host's drain procedure (stop accepting, hand every run over); returns
            how many runs were handed over.
        undrain: takes work again after a drain; returns whether the host was draining
            (``None``: the RPC is refused as unimplemented).
    """

    def __init__(self, manager: RunManager, drain: Callable[[], Awaitable[int]],
                 undrain: Callable[[], Awaitable[bool]] | None = None) -> None:
        self.manager = manager
        self._drain = drain
        self._undrain = undrain

    async def StartRun(self, request: pb.StartRunRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.StartRunResponse:
        try:
            record, created = await self.manager.start_run(request)
        except Exception as exc:  # mapped at the edge
            await _fail(context, exc)
            raise
        return pb.StartRunResponse(record=record, created=created)

    async def AttachRun(self, request: pb.AttachRunRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.AttachRunResponse:
        metrics = self.manager.deps.metrics
        cause = metrics.expect_takeover(request.run_id, request.lost_at, request.loss_cause)
        try:
            epoch, record = await self.manager.attach_run(request.run_id, request.purpose or "drive")
        except Exception as exc:
            metrics.forget_takeover(request.run_id)
            await _fail(context, exc)
            raise
        metrics.takeovers.labels(cause).inc()
        return pb.AttachRunResponse(epoch=epoch, record=record)

    async def CancelRun(self, request: pb.CancelRunRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.CancelRunResponse:
        return pb.CancelRunResponse(driving=self.manager.cancel(request.run_id, request.reason or "user"))

    async def DestroySandbox(self, request: pb.DestroySandboxRequest,
                             context: grpc.aio.ServicerContext[Any, Any]) -> pb.DestroySandboxResponse:
        deps = self.manager.deps
        try:
            sbx = await deps.find_sandbox(request.sandbox_key)
            if sbx is None:
                return pb.DestroySandboxResponse(destroyed=False)
            destroyed: Any = await sbx.provider.destroy(sbx.handle)
            if destroyed or not await sbx.provider.exists(sbx.handle):
                await deps.cc.delete_sandbox(request.sandbox_key)
                return pb.DestroySandboxResponse(destroyed=True)
            return pb.DestroySandboxResponse(destroyed=False)
        except Exception as exc:
            await _fail(context, exc)
            raise

    async def Drain(self, request: pb.DrainRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.DrainResponse:
        try:
            n = await self._drain()
        except Exception as exc:
            await _fail(context, exc)
            raise
        return pb.DrainResponse(handed_over=n)

    async def Undrain(self, request: pb.UndrainRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.UndrainResponse:
        if self._undrain is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this host cannot undrain")
        assert self._undrain is not None
        try:
            was = await self._undrain()
        except Exception as exc:
            await _fail(context, exc)
            raise
        return pb.UndrainResponse(was_draining=was)


def add_to_server(service: SandboxHostService, server: grpc.aio.Server) -> None:
    """Register the servicer on a ``grpc.aio`` server."""
    pb_grpc.add_SandboxHostServicer_to_server(service, server)
