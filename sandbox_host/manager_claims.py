"""The claims of a host's runs that no driver of the host holds (docs/design.md §3.2).

Owned by :class:`~sandbox_host.manager.RunManager` (``manager.claims``): a claim whose start or attach failed is
released (retried while its session lives), a start that meets another start's claim follows
it, and a driver left from an older claim of the run on this host is stopped when a new
claim lands. Each is a way a run was left with nobody to drive it.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping

from baton.errors import BatonError, ProviderUnreachable, StoreUnavailable
from baton.retry import Deadline
from baton.runs import record_status
from baton.v1 import coordinator_pb2, runs_pb2
from sandbox_host import machine as M
from sandbox_host._tasks import retry_unavailable

if TYPE_CHECKING:
    from sandbox_host.deps import HostDeps
    from sandbox_host.driver import RunDriver
    from sandbox_host.providers import Sandbox

log = logging.getLogger("baton.sandbox_host.manager")

#: Seconds a ``StartRun`` that finds its run claimed by another start follows it before it
#: joins it as it is (:meth:`ClaimUpkeep.once_started`): a live start finishes within
#: seconds, and a dead one's claim lapses within the session TTL.
HOLDER_WAIT = 30.0
#: Runs remembered as refused for a provider this host cannot reach (the oldest forgotten first).
MAX_UNREACHABLE = 4096


class ClaimUpkeep:
    """The claims of one host that no driver of it holds.

    Args:
        deps: the host's clients and settings.
        drivers: the manager's drivers by run id (read only here).
        tasks: the manager's driver tasks by run id (read only here).
    """

    def __init__(self, deps: "HostDeps", drivers: "Mapping[str, RunDriver]",
                 tasks: "Mapping[str, asyncio.Task[None]]") -> None:
        self.deps = deps
        self._drivers = drivers
        self._tasks = tasks
        #: Runs whose claim a start of this host holds (not yet driven: never released here).
        self.start_claims: set[str] = set()
        #: Runs this host refused because it cannot reach their sandbox's provider → that
        #: provider: asked again, they are refused before any claim while it still cannot.
        self.unreachable: dict[str, str] = {}

    async def refuse_unreachable(self, run_id: str) -> None:
        """Refuse at once (no claim, no epoch spent) a run this host refused already for a
        provider it still cannot build.

        Raises:
            ProviderUnreachable: so.
        """
        name = self.unreachable.get(run_id)
        if name is not None:
            await self.deps.provider_named(name, run_id)
            self.unreachable.pop(run_id, None)  # reachable now: take it as any other

    async def sandbox_of(self, record: runs_pb2.RunRecord, session: Any, epoch: int, *,
                         builds: bool = True,
                         entry: "tuple[coordinator_pb2.SandboxInstance | None] | None" = None,
                         ) -> "tuple[Sandbox | None] | None":
        """The run's registered sandbox, read as soon as a takeover's claim landed: a host that
        cannot reach its provider lets the run go at once, for a host that can, rather than
        driving it with the wrong provider or failing it. With no registered sandbox, the
        provider the record names (``RunRecord.sandbox_provider``) is the one a driver
        builds on, and must be reachable likewise.

        Args:
            builds: the claim drives the run (a driver may build a sandbox); a finalizing
                one builds nothing.
            entry: the registry's entry as the claim's answer carried it, ``(entry or None,)``;
                read here when ``None``.

        Returns:
            ``(the sandbox or None,)`` for the driver; ``None`` when the record names no
            sandbox or the registry did not answer (the driver reads it again, as it always did).

        Raises:
            ProviderUnreachable: the sandbox's provider cannot be built here; the claim was
                released first.
        """
        try:
            if not record.sandbox_key:
                found = None
            elif entry is not None:
                found = await self.deps.sandbox_from(entry[0])
            else:
                found = await self.deps.find_sandbox(record.sandbox_key)
            if found is None and builds and record.sandbox_provider:
                await self.deps.provider_named(record.sandbox_provider, record.run_id)
            return (found,) if record.sandbox_key else None
        except ProviderUnreachable as exc:
            log.warning("run %s: refused, this host cannot reach its sandbox provider %r: %s", record.run_id,
                        exc.provider, exc.detail)
            await asyncio.shield(self.release(record.run_id, session, epoch))
            if len(self.unreachable) >= MAX_UNREACHABLE:
                self.unreachable.pop(next(iter(self.unreachable)))
            self.unreachable[record.run_id] = exc.provider
            raise ProviderUnreachable(record.run_id, exc.provider, exc.detail) from None
        except BatonError:
            return None

    async def once_started(self, run_id: str, deadline: Deadline) -> runs_pb2.RunRecord | None:
        """Follow a run whose claim another start holds (``WatchRun``).

        Returns:
            The record once the run is no longer ``starting`` (that start made its input
            durable, or it ended: join it), or at ``deadline`` (joined as well: a start
            nobody finishes is the reaper's); ``None`` once the claim went while the run
            was still ``starting`` (that start failed or its session lapsed: claim it
            again and resume it). Joining at once, the retry of a start whose host had lost
            its session left the run ``starting`` with nobody to drive it, and the reaper
            aborted it although its input was durable.

        Raises:
            UnknownRun: the record is gone.
        """
        deps = self.deps
        try:
            async with asyncio.timeout(deadline.left()):
                async with contextlib.aclosing(deps.cc.watch_run(run_id)) as changes:
                    async for ev in changes:
                        rec = ev.record
                        if rec is None:
                            break
                        if not (rec.starting and record_status(rec) == "running"):
                            return rec
                        if ev.claim is None:
                            return None
        except TimeoutError:
            log.info("run %s: its start elsewhere did not finish within %gs; joined", run_id, HOLDER_WAIT)
        return (await deps.cc.get_run(run_id)).record

    def driven_at(self, run_id: str, epoch: int) -> bool:
        """Whether a driver of this host works under the run's claim at ``epoch``."""
        d, t = self._drivers.get(run_id), self._tasks.get(run_id)
        return d is not None and d.epoch == epoch and t is not None and not t.done()

    async def release_if_mine(self, run_id: str, session: Any = None) -> None:
        """Release the run's claim if ``session`` (default: the host's current one) holds it
        and no driver or start of this host works under it (a claim whose answer was lost).

        Retried as :meth:`release` is; it never raises.
        """
        deps = self.deps
        session = session or deps.session

        async def once() -> None:
            claim = (await deps.cc.get_run(run_id)).claim
            if (claim is not None and claim.session_id == session.id and not self.driven_at(run_id, claim.epoch)
                    and run_id not in self.start_claims):
                await deps.cc.release_claim(run_id, session, claim.epoch)

        await self._until_released(run_id, session, once)

    async def release(self, run_id: str, session: Any, epoch: int) -> None:
        """Release the claim ``session`` holds at ``epoch`` (a start that failed after its
        claim); it never raises.

        A claim nobody drives keeps the run from every other host, and from the failover,
        which acts when a claim goes, for as long as its session lives: on a healthy host,
        for ever. A release tried once and lost to a slow store left such a claim. So it is
        retried while the store is unavailable, until it is done or the session is lost (the
        claim then goes with the lease).
        """
        async def once() -> None:
            await self.deps.cc.release_claim(run_id, session, epoch)

        await self._until_released(run_id, session, once)

    async def _until_released(self, run_id: str, session: Any, once: Callable[[], Awaitable[None]]) -> None:
        try:
            await retry_unavailable(once, deadline=None, session=session, what=f"run {run_id}: releasing its claim",
                                    errors=(StoreUnavailable,))
        except BatonError as exc:
            log.info("run %s: claim not released (%r); it goes with session %x", run_id, exc, session.id)

    async def supersede(self, run_id: str, epoch: int) -> None:
        """Stop a driver of ``run_id`` this host still runs under an older claim, and wait
        for it to end (at most ``settings.final_write_timeout`` seconds).

        The claim at ``epoch`` landed, so that driver's claim is gone: it is told so (it
        writes nothing more, as after any lost claim). It is awaited so that the two never
        work on the run's sandboxes at once on this host (the old one abandons what it was
        building, the new one then finds the registry as it was left). One that does not
        end in time is left to stop on its own: the fence keeps every write it could still
        make harmless.
        """
        old = self._drivers.get(run_id)
        task = self._tasks.get(run_id)
        if old is None or task is None or task.done() or old.releasing:
            return  # a driver releasing its claim writes nothing more
        log.info("run %s: a driver of an older claim (epoch %d) still runs here; stopping it", run_id, old.epoch)
        old.post(M.ClaimLost(f"claim@{epoch}"))
        await asyncio.wait({task}, timeout=self.deps.settings.final_write_timeout)
        if not task.done():
            log.warning("run %s: the driver of epoch %d did not stop within %gs; driving on beside it", run_id,
                        old.epoch, self.deps.settings.final_write_timeout)

