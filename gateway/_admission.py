"""Admission control of run starts at one gateway (docs/operating.md "Overload").

A start is the expensive moment of a run (a host's ``StartRun``: coordinator writes, log
appends, the sandbox build behind them). A burst of them all at once starved the hosts'
event loops; so each gateway lets only so many starts be in flight, and the others wait
their turn in a bounded queue:

- at most ``per_tenant`` starts of one tenant in flight (one tenant's burst cannot hold
  every slot);
- at most ``per_host`` × (live hosts) in flight in all; placement counts the starts in
  flight on each host (:meth:`gateway._hosts.HostPool.rank`), so they spread;
- a start that finds no slot waits, first come first served (a waiter whose tenant is at its
  limit lets the ones behind it pass), at most ``wait`` seconds and behind at most
  ``queue`` others; past either: ``429 TOO_MANY_STARTS`` with ``Retry-After``. Nothing was
  created for a refused start.

The rule is pure bookkeeping on one event loop (no I/O): :class:`Admission`.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import math
from dataclasses import dataclass
from typing import AsyncIterator

from baton import errors as e

__all__ = ["Admission", "AdmissionLimits", "TooManyStarts"]


class TooManyStarts(e.BatonError):
    """This gateway has as many starts in flight and waiting as it takes; try again in
    ``retry_after`` seconds (the ``Retry-After`` header)."""

    def __init__(self, retry_after: int, why: str) -> None:
        self.retry_after = retry_after
        super().__init__(f"too many runs are starting ({why}); retry in {retry_after}s")


@dataclass(frozen=True)
class AdmissionLimits:
    """Limits of one gateway (settings ``BATON_START_*``; 0 = no limit).

    Attributes:
        per_tenant: starts of one tenant in flight.
        per_host: starts in flight per live host.
        queue: starts waiting for a slot.
        wait: seconds a start waits for a slot.
    """

    per_tenant: int = 64
    per_host: int = 32
    queue: int = 512
    wait: float = 30.0


@dataclass
class _Waiter:
    tenant: str
    admitted: asyncio.Future[None]


class Admission:
    """Starts in flight and waiting at this gateway (see the module docstring).

    Attributes:
        in_flight: starts holding a slot now.
    """

    def __init__(self, limits: AdmissionLimits) -> None:
        self.limits = limits
        self.in_flight = 0
        self._tenants: collections.Counter[str] = collections.Counter()
        self._waiting: collections.deque[_Waiter] = collections.deque()
        self._hosts = 1
        #: Seconds the last starts took (slot held), for ``Retry-After``.
        self._recent: collections.deque[float] = collections.deque(maxlen=32)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _total(self) -> int:
        return self.limits.per_host * max(self._hosts, 1) if self.limits.per_host > 0 else 0

    def _fits(self, tenant: str) -> bool:
        total = self._total()
        return ((total <= 0 or self.in_flight < total)
                and (self.limits.per_tenant <= 0 or self._tenants[tenant] < self.limits.per_tenant))

    def _enter(self, tenant: str) -> None:
        self.in_flight += 1
        self._tenants[tenant] += 1

    def _leave(self, tenant: str) -> None:
        self.in_flight -= 1
        self._tenants[tenant] -= 1
        if self._tenants[tenant] <= 0:
            del self._tenants[tenant]

    def _admit_waiting(self) -> None:
        """Let waiters in, in arrival order, skipping those whose tenant is at its limit."""
        for w in list(self._waiting):
            if self._total() > 0 and self.in_flight >= self._total():
                return
            if w.admitted.done():  # gave up (its wait ran out or it was cancelled)
                self._waiting.remove(w)
            elif self._fits(w.tenant):
                self._waiting.remove(w)
                self._enter(w.tenant)
                w.admitted.set_result(None)

    def retry_after(self) -> int:
        """Seconds a refused start should wait: the queue's length times a recent start's
        duration, spread over the slots (at least 1)."""
        per_start = sorted(self._recent)[len(self._recent) // 2] if self._recent else 1.0
        slots = max(self._total(), 1)
        return max(1, math.ceil(per_start * (len(self._waiting) + 1) / slots))

    @contextlib.asynccontextmanager
    async def slot(self, tenant: str, hosts: int) -> AsyncIterator[None]:
        """Hold a start slot of ``tenant`` while the block runs.

        Args:
            tenant: the starting run's tenant ("" without auth).
            hosts: live hosts now (the total is ``per_host`` × hosts).

        Raises:
            TooManyStarts: the queue is full, or no slot came within ``wait`` seconds.
        """
        self._hosts = max(hosts, 1)
        loop = asyncio.get_running_loop()
        if not self._waiting and self._fits(tenant):
            self._enter(tenant)
        else:
            if self.limits.queue > 0 and len(self._waiting) >= self.limits.queue:
                raise TooManyStarts(self.retry_after(), f"{len(self._waiting)} starts are waiting already")
            w = _Waiter(tenant, loop.create_future())
            self._waiting.append(w)
            self._admit_waiting()  # the hosts may have grown
            try:
                if self.limits.wait > 0:
                    async with asyncio.timeout(self.limits.wait):
                        await asyncio.shield(w.admitted)
                else:
                    await asyncio.shield(w.admitted)
            except BaseException as exc:
                if w.admitted.done() and not w.admitted.cancelled():
                    self._leave(tenant)  # admitted as the wait ended: give the slot back
                    self._admit_waiting()
                else:
                    w.admitted.cancel()
                    with contextlib.suppress(ValueError):
                        self._waiting.remove(w)
                if isinstance(exc, TimeoutError):
                    raise TooManyStarts(self.retry_after(),
                                        f"no start slot within {self.limits.wait:g}s") from None
                raise
        began = loop.time()
        try:
            yield
        finally:
            self._recent.append(loop.time() - began)
            self._leave(tenant)
            self._admit_waiting()
