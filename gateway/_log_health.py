"""Whether the delivery log can store, as the gateway tells its clients.

While JetStream cannot store (its disk or ``max_file_store`` is full), a new run cannot
start and open streams get no chunks: a POST answers ``503 LOG_STORAGE_FULL`` at once
instead of hanging, and idle streams get a notice instead of bare keep-alives. The answer
comes from a probe record (:meth:`baton.log.DeliveryLog.probe_storage`), cached for
``ttl`` seconds and shared by every request of this gateway: at most one probe per
``ttl``, and only while someone asks.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from baton import errors as e

log = logging.getLogger("gateway.log_health")


class LogHealth:
    """Cached answer to "does the delivery log store?".

    Args:
        delivery_log: the gateway's ``DeliveryLog``.
        prober: this gateway's id (names its probe subject).
        ttl: seconds an answer is reused.
        timeout: seconds a probe waits for JetStream's acknowledgement.
    """

    def __init__(self, delivery_log: Any, prober: str, *, ttl: float = 3.0, timeout: float = 2.0) -> None:
        self._log = delivery_log
        self._prober = prober
        self._ttl = ttl
        self._timeout = timeout
        self._at = float("-inf")
        self._problem: e.LogUnavailable | None = None
        self._probing: asyncio.Task[None] | None = None

    @property
    def last_problem(self) -> e.LogUnavailable | None:
        """The last answer, without probing (``None``: stored fine, or never probed)."""
        return self._problem

    def peek(self) -> e.LogUnavailable | None:
        """The last answer at once, never waiting; starts a probe (in the background,
        shared) when the answer is older than ``ttl``.

        For what must not wait on a probe: an open stream's idle frame. Awaiting the probe
        there held every open stream of the gateway for as long as it took (up to twice
        ``timeout`` while JetStream elects a stream leader), chunks that had arrived
        meanwhile included: readers got their next chunk up to 1.7 s after the appends
        resumed, all at the same moment (a stream leader SIGKILLed).
        """
        if time.monotonic() - self._at >= self._ttl and (self._probing is None or self._probing.done()):
            self._probing = asyncio.ensure_future(self._probe())
        return self._problem

    async def problem(self) -> e.LogUnavailable | None:
        """``LogStorageFull`` / ``LogUnavailable`` while the log cannot store, else ``None``.

        May block for up to ``timeout`` (twice, when JetStream does not answer at all);
        concurrent callers share one probe. Never raises.
        """
        if time.monotonic() - self._at < self._ttl:
            return self._problem
        if self._probing is None or self._probing.done():
            self._probing = asyncio.ensure_future(self._probe())
        # Shielded: a caller that goes away (a client disconnect) does not cancel the
        # probe other callers wait for.
        await asyncio.shield(self._probing)
        return self._problem

    async def _probe(self) -> None:
        try:
            await self._log.probe_storage(self._prober, timeout=self._timeout)
            problem = None
        except e.LogUnavailable as exc:
            problem = exc
        except Exception:  # a bug: log it, and do not refuse runs on a guess
            log.exception("probing the delivery log failed")
            problem = None
        if (problem is None) != (self._problem is None):
            if problem is None:
                log.info("the delivery log stores again")
            else:
                log.warning("the delivery log cannot store: %s", problem)
        self._problem = problem
        self._at = time.monotonic()

    async def aclose(self) -> None:
        """Wait for a probe in flight (bounded by its timeout)."""
        if self._probing is not None and not self._probing.done():
            await asyncio.wait({self._probing}, timeout=2 * self._timeout + 1)
