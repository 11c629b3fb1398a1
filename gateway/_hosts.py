"""Sandbox hosts as the gateway sees them: the registry (via the coordinator) and gRPC channels.

The one adapter module of the gateway that speaks gRPC to sandbox hosts. Channels are
cached per address and closed at shutdown; gRPC errors are translated once, here, into
domain exceptions (``raise … from``).
"""
from __future__ import annotations

import collections
import logging
from typing import Any, Awaitable, Callable, TypeVar

import grpc

from baton import errors as e
from baton import internal_auth, placement
from baton.grpc_errors import from_rpc_error
from baton.tls import GrpcTls
from baton.v1 import coordinator_pb2, sandbox_host_pb2_grpc

log = logging.getLogger("gateway.hosts")

T = TypeVar("T")
# A StartRun builds nothing before returning (DESIGN §5.5: the sandbox is built after
# run.accepted), so a few seconds is generous; AttachRun returns once the claim is held.
# A call that outlives it raises HostTimedOut: the host may be busy rather than dead (a
# StartRun is 3 coordinator calls and 3 JetStream appends, seconds each on a starved machine).
RPC_TIMEOUT = 10.0


class HostTimedOut(e.StoreUnavailable):
    """A host did not answer a call within its deadline (``DEADLINE_EXCEEDED``, no baton
    details): it may be dead, paused, or only busy. A kind of ``StoreUnavailable``, so callers
    that move on from an unreachable host still do; a caller that can tell busy from dead
    (:func:`gateway._routes_chat` asks whether the host is still registered) may ask again."""
_CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0)]


class HostPool:
    """Live hosts (from ``ListHosts``) and one cached gRPC channel per host address.

    Args:
        coordinator: a ``CoordinatorClient`` (for ``list_hosts``).
        token: the cluster's internal token sent to hosts (``None``: ``BATON_INTERNAL_TOKEN``).
        tls: the internal links' TLS (``None``: ``BATON_TLS_*``).
    """

    def __init__(self, coordinator: Any, token: str | None = None, tls: GrpcTls | None = None) -> None:
        self._coordinator = coordinator
        self._token = token
        self._tls = tls
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, sandbox_host_pb2_grpc.SandboxHostStub] = {}
        # Runs this gateway handed to each host: breaks ties between hosts whose published
        # load is equal (it is refreshed about once a second, so a burst would all go to one).
        self._handed: collections.Counter[str] = collections.Counter()
        # Starts this gateway has sent to each host and not yet had answered: they count as
        # load, so a burst spreads (the published load lags them by a second).
        self.in_flight: collections.Counter[str] = collections.Counter()

    def stub(self, address: str) -> sandbox_host_pb2_grpc.SandboxHostStub:
        """The cached stub for a host address (``host:port``)."""
        s = self._stubs.get(address)
        if s is None:
            ch = internal_auth.channel(address, _CHANNEL_OPTIONS, self._token, self._tls)
            self._channels[address] = ch
            s = self._stubs[address] = sandbox_host_pb2_grpc.SandboxHostStub(ch)
        return s

    async def live_hosts(self, timeout: float | None = None) -> list[coordinator_pb2.HostInfo]:
        """Registered hosts that are not draining (``timeout``: the coordinator call's)."""
        hosts = await self._coordinator.list_hosts(timeout=timeout)
        return [h for h in hosts if not h.draining and h.address]

    def rank(self, hosts: list[coordinator_pb2.HostInfo]) -> list[coordinator_pb2.HostInfo]:
        """Non-draining hosts in the order to try them (:func:`baton.placement.order`): those
        with room before those whose published load says they are full (the load may be a
        second stale, so a full one is tried last rather than never), then published load
        plus the starts this gateway has in flight there, per unit of capacity, runs this
        gateway handed to it, host id (deterministic)."""
        by_id = {h.host_id: h for h in hosts}
        ranked = placement.order(
            [placement.Candidate(h.host_id, h.load, h.capacity, h.draining) for h in hosts],
            pending=self.in_flight, handed=self._handed)
        return [by_id[c.host_id] for c in ranked]

    def note_handed(self, host_id: str) -> None:
        self._handed[host_id] += 1

    async def address_of(self, host_id: str, timeout: float | None = None) -> str | None:
        """The address of a registered host, or ``None``."""
        for h in await self._coordinator.list_hosts(timeout=timeout):
            if h.host_id == host_id:
                return str(h.address)
        return None

    async def call(self, address: str, method: Callable[[Any, Any], Awaitable[T]] | str, request: Any,
                   timeout: float = RPC_TIMEOUT) -> T:
        """Call ``SandboxHost.<method>`` on ``address``.

        Raises:
            The domain exception of the host's error (``ThreadBusy``, ``RunClaimNotAcquired``,
            ``HostDraining``…); ``HostTimedOut`` when it did not answer within ``timeout``,
            ``StoreUnavailable`` when it cannot be reached.
        """
        stub = self.stub(address)
        fn = getattr(stub, method) if isinstance(method, str) else method
        try:
            return await fn(request, timeout=timeout)  # type: ignore[call-arg]
        except grpc.aio.AioRpcError as exc:
            err = from_rpc_error(exc)
            if type(err) is e.StoreUnavailable and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise HostTimedOut(str(err)) from exc
            raise err from exc

    async def registered(self, host: coordinator_pb2.HostInfo, timeout: float | None = None) -> bool:
        """Whether ``host`` is still registered at the same address (its session is live)."""
        return await self.address_of(host.host_id, timeout) == host.address

    async def close(self) -> None:
        """Close every channel (idempotent)."""
        channels, self._channels, self._stubs = list(self._channels.values()), {}, {}
        for ch in channels:
            await ch.close(grace=None)


async def try_hosts(
    pool: HostPool, hosts: list[coordinator_pb2.HostInfo], attempt: Callable[[coordinator_pb2.HostInfo], Awaitable[T]],
    next_on: tuple[type[e.BatonError], ...] = (),
) -> tuple[coordinator_pb2.HostInfo, T]:
    """Run ``attempt`` on each host, least loaded first, until one does not fail as
    unreachable, draining or full (or as one of ``next_on``).

    Raises:
        HostAtCapacity: every host refused as full.
        next_on's error: every host failed with it (the last one is raised).
        NoHostAvailable (from ``gateway._errors``): no host, or all unreachable/draining.
        Any other domain error ``attempt`` raises (e.g. ``ThreadBusy``), at once.
    """
    from gateway._errors import NoHostAvailable

    refusals: list[BaseException] = []
    passed: tuple[type[e.BatonError], ...] = (e.StoreUnavailable, e.HostDraining, e.HostAtCapacity, *next_on)
    for h in pool.rank(hosts):
        pool.in_flight[h.host_id] += 1
        try:
            result = await attempt(h)
        except passed as exc:
            log.warning("host %s (%s) refused or unreachable: %s", h.host_id, h.address, exc)
            refusals.append(exc)
            continue
        finally:
            pool.in_flight[h.host_id] -= 1
            if pool.in_flight[h.host_id] <= 0:
                del pool.in_flight[h.host_id]
        pool.note_handed(h.host_id)
        return h, result
    if refusals and all(isinstance(x, e.HostAtCapacity) for x in refusals):
        raise refusals[-1]  # every host is full: say so (503 HOST_AT_CAPACITY)
    if refusals and next_on and all(isinstance(x, next_on) for x in refusals):
        raise refusals[-1]
    raise NoHostAvailable("no sandbox host could take the run" if refusals
                          else "no sandbox host is available") from (refusals[-1] if refusals else None)
