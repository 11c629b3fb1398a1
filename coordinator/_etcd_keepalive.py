"""An etcd lease's keep-alive stream (:class:`KeepAliveStream`), one per session."""
from __future__ import annotations

import asyncio
from typing import Any

import grpc
from aetcd import rpc

from baton.errors import StoreUnavailable
from coordinator._etcd_errors import translate as _translate


class KeepAliveStream:
    """One etcd LeaseKeepAlive stream, reused for every refresh of one session."""

    def __init__(self, stub: rpc.LeaseStub) -> None:
        self._stub = stub
        self._call: grpc.aio.StreamStreamCall[Any, Any] | None = None  # aetcd's messages are untyped
        self._lock = asyncio.Lock()

    async def refresh(self, lease_id: int, *, timeout: float) -> int:
        """Refresh ``lease_id`` → remaining TTL in seconds (``<= 0``: the lease is gone).

        Reopens the stream once if it broke (e.g. after an etcd restart).
        """
        async with self._lock:
            for attempt in (0, 1):
                if self._call is None:
                    self._call = self._stub.LeaseKeepAlive()
                call = self._call
                try:
                    # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
                    # cancellation that races the read (CPython gh-86296).
                    async with asyncio.timeout(timeout):
                        await call.write(rpc.LeaseKeepAliveRequest(ID=lease_id))
                        resp: Any = await call.read()  # a LeaseKeepAliveResponse, or EOF
                    if resp is grpc.aio.EOF:  # type: ignore[attr-defined]  # grpc-stubs lacks grpc.aio.EOF
                        raise StoreUnavailable("etcd keep-alive stream ended")
                    return int(resp.TTL)
                except (grpc.aio.AioRpcError, StoreUnavailable, asyncio.InvalidStateError) as exc:
                    call.cancel()
                    self._call = None
                    if attempt == 1:
                        if isinstance(exc, grpc.aio.AioRpcError):
                            raise _translate(exc, lease_id) from exc
                        raise StoreUnavailable(f"etcd keep-alive: {exc}") from exc
                except asyncio.TimeoutError as exc:
                    call.cancel()
                    self._call = None
                    raise StoreUnavailable("etcd keep-alive timed out") from exc
            raise AssertionError("unreachable")

    def close(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None
