"""The sandbox of one driven run and its lifecycle: find or build, register, launch, kill,
reclaim, destroy (docs/design.md §5.1, §5.5).

A :class:`Sandbox` is a sandbox as a driver holds it (provider, handle, the journal's
sentinel nonce). :class:`RunSandboxes` does the provider and sandbox-registry I/O of one
claim (run id, epoch); the :class:`~sandbox_host.driver.RunDriver` decides when. A new
sandbox goes: create → register (not launched) → record its key → :meth:`RunSandboxes.prepare_launch`
(everything the agent needs inside it) → launch → register launched.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Literal, TypeVar

from baton.errors import BatonError, ProviderUnreachable, SandboxReclaimFailed, StoreUnavailable
from baton.runs import record_status
from baton.v1 import runs_pb2
from sandbox_host._tasks import cancel_and_wait, retry_unavailable
from sandbox_host.providers import Sandbox

if TYPE_CHECKING:
    from sandbox_host.deps import HostDeps

log = logging.getLogger("baton.sandbox_host.driver")
T = TypeVar("T")
#: An agent's launch in a prepared sandbox: ``(argv, stdin, env, secrets)``.
LaunchSpec = tuple[list[str], bytes | None, dict[str, str], dict[str, str], bool]

__all__ = ["RunSandboxes", "Sandbox"]


def adopt(sbx: Sandbox, data: Any) -> None:
    """Merge a launch's provider data (process group, inbox) into the sandbox's handle."""
    from sandbox_host.providers import SandboxHandle

    sbx.handle = SandboxHandle(provider=sbx.handle.provider, key=sbx.handle.key,
                               journal_path=sbx.handle.journal_path, stderr_path=sbx.handle.stderr_path,
                               workdir=sbx.handle.workdir, data={**sbx.handle.data, **dict(data), "launched": True})


class RunSandboxes:
    """The sandbox I/O of one claim. Holds the run's current sandbox (:attr:`current`).

    Args:
        deps: the host's clients and settings.
        record: the run record (its ``sandbox_key`` is updated when this claim builds one).
        epoch: the claim's epoch.
        mode: the driver's mode (``fresh`` builds under the run id; a successor under
            ``<run_id>#<epoch>``).
    """

    def __init__(self, deps: "HostDeps", record: runs_pb2.RunRecord, epoch: int,
                 mode: Literal["fresh", "attach", "finalize"]) -> None:
        self.deps = deps
        self.record = record
        self.run_id = record.run_id
        self.epoch = epoch
        self.mode = mode
        # The session this driver's claim lives under (the host's may be replaced later).
        self._session = deps.session
        self.current: Sandbox | None = None

    # --- find or build ----------------------------------------------------------------

    async def ensure(self, input_messages: list[dict[str, Any]], *,
                     lookup: Awaitable[Sandbox | None] | None = None) -> Sandbox:
        """The sandbox to follow: the registered, launched one (after the attach preflight),
        or a new one with the agent launched on ``input_messages``.

        Args:
            input_messages: the run input (for a new sandbox's agent).
            lookup: the registry read of ``record.sandbox_key`` already under way
                (:meth:`HostDeps.find_sandbox`); read here when not given.

        Raises:
            JournalAttachUnavailable: the preflight found no journal in time.
            SandboxError: building, launching or reclaiming failed.
            StoreUnavailable: the registry did not answer within ``settings.store_retry``.
        """
        deps = self.deps
        if self.mode != "fresh" and self.record.sandbox_key:
            found = await (lookup if lookup is not None else deps.find_sandbox(self.record.sandbox_key))
            if found is not None and found.nonce:
                if found.handle.data.get("launched"):
                    self.current = found
                    from sandbox_host.journal import preflight_attach

                    async def status() -> str | None:
                        return record_status(self.record)

                    await preflight_attach(
                        self.run_id, status=status,
                        journal_size=lambda: found.provider.file_size(found.handle, found.handle.journal_path),
                        attach_wait=deps.settings.attach_wait)
                    return found
                # Registered but never marked launched: the previous host may still have
                # started its agent (it died, or the store failed, between the launch and
                # the mark). Launching into that sandbox would run a second agent on the
                # same journal, and building beside it would leave the first one running:
                # kill whatever runs there and destroy it before building our own.
                log.info("run %s: sandbox %s was never marked launched; destroying it", self.run_id,
                         found.handle.key)
                await self.reclaim(found)
            if found is not None:  # the run's own provider, not this host's
                return await self._build_and_launch(input_messages, found.handle.provider)
        return await self._build_and_launch(input_messages)

    async def find(self) -> Sandbox | None:
        """The current sandbox, else the one the record names (from the registry), else None.

        Raises:
            StoreUnavailable: the registry did not answer.
        """
        if self.current is None and self.record.sandbox_key:
            self.current = await self.deps.find_sandbox(self.record.sandbox_key)
        return self.current

    async def _build_and_launch(self, input_messages: list[dict[str, Any]], provider_name: str | None = None) -> Sandbox:
        deps = self.deps
        # A successor that rebuilds gets its own key (and so its own journal): the first
        # host's sandbox, if any, is never reused.
        key = self.run_id if self.mode == "fresh" else f"{self.run_id}#{self.epoch}"
        provider = await deps.provider_for_run(self.record, provider_name)
        spec = deps.sandbox_spec(self.record, provider.name)
        handle = await provider.create(key, spec)
        from sandbox_host.journal import new_nonce

        sbx = Sandbox(provider, handle, new_nonce())
        self.current = sbx
        try:
            # Registered before launch, so whoever takes over finds (and can destroy) it.
            await self._store(lambda: deps.register_sandbox(self.record, sbx, launched=False, epoch=self.epoch))
            # The provider with the key (a record from before ``sandbox_provider``, or one a
            # successor rebuilt on: the record names the provider its sandbox is on).
            await self._store(lambda: deps.cc.update_run(
                self.run_id, runs_pb2.RunRecord(sandbox_key=key, sandbox_provider=provider.name),
                paths=["sandbox_key", "sandbox_provider"], epoch=self.epoch, session_id=deps.session.id))
            self.record.sandbox_key = key
            self.record.sandbox_provider = provider.name
            await self._launch(sbx, input_messages)
        except BaseException:
            lost = getattr(self._session, "lost", None)
            # ``launched`` is in the handle once the agent runs, right before the write that
            # registers it so: from then on the registry may say so.
            if sbx.handle.data.get("launched") and lost is not None and lost.is_set():
                # The session (and so the claim) is gone, and the registry may say the agent
                # is launched (a write whose answer the loss cut off): a successor may already
                # follow it. It is the successor's now: it follows a launched one and destroys
                # one never marked launched. Killing it here would kill the agent a successor
                # had adopted, and the run would fail. Before that write went
                # out the registry cannot say "launched" (nobody adopts the agent), and the
                # sandbox's own registration may not have landed (a successor may never learn
                # of it): it is destroyed here, as below (else nobody ever would).
                log.info("run %s: session lost while launching; sandbox %s left to the successor",
                         self.run_id, key)
                raise
            # Given up before the agent is known to the registry as launched: a successor
            # could neither follow nor stop it, so it must not outlive this claim.
            await self.abandon(sbx)
            raise
        return sbx

    async def prepare_launch(self, sbx: Sandbox, input_messages: list[dict[str, Any]]) -> LaunchSpec:
        """Make a new sandbox ready for its agent, before the launch: the agent's files are
        copied in. Everything a launch needs inside the sandbox is put there here (the
        sandbox is registered, not yet marked launched: a successor that finds it destroys
        it and builds its own).

        A thread's run also gets the workspace its turn starts from (:func:`sandbox_host.turns.restore`).

        Returns:
            ``(argv, stdin, env, secrets, interactive)`` of the agent's launch.

        Raises:
            SandboxBuildFailed: the turn's workspace could not be restored.
        """
        from sandbox_host import turns

        await turns.restore(self.deps, self.record, sbx)
        return await self.deps.launch_spec(self.record, sbx.provider, sbx.handle, input_messages)

    async def _launch(self, sbx: Sandbox, input_messages: list[dict[str, Any]]) -> None:
        deps = self.deps
        argv, stdin, env, secrets, interactive = await self.prepare_launch(sbx, input_messages)
        data = await sbx.provider.launch(sbx.handle, argv, nonce=sbx.nonce, stdin=stdin, env=env, secrets=secrets,
                                         interactive=interactive)
        adopt(sbx, data)
        await self._store(lambda: deps.register_sandbox(self.record, sbx, launched=True, epoch=self.epoch))

    async def relaunch(self, sbx: Sandbox, session_id: str, attempt: int) -> None:
        """Launch the agent again in ``sbx`` as process number ``attempt``, resuming
        ``session_id`` (:mod:`sandbox_host.agent_resume`); the workspace stays as it is.

        Raises:
            RunClaimLost: this claim no longer holds the run (checked by a fenced write
                first: a host that lost the run never starts an agent in it).
            InvalidArgument: the session id is malformed.
            SandboxError: the launch failed.
            StoreUnavailable: the store did not answer within ``settings.store_retry``.
        """
        from sandbox_host.journal import nonce_file_text

        deps = self.deps
        await self._store(lambda: deps.cc.update_run(
            self.run_id, runs_pb2.RunRecord(sandbox_key=sbx.handle.key), paths=["sandbox_key"],
            epoch=self.epoch, session_id=deps.session.id))
        argv, stdin, env, secrets, interactive = await deps.relaunch_spec(self.record, sbx.provider, sbx.handle,
                                                                          session_id)
        data = await sbx.provider.launch(sbx.handle, argv, nonce=nonce_file_text(sbx.nonce, attempt), stdin=stdin,
                                         env=env, secrets=secrets, interactive=interactive)
        adopt(sbx, data)
        await self._store(lambda: deps.register_sandbox(self.record, sbx, launched=True, epoch=self.epoch))
        log.info("run %s: agent relaunched (process %d, resuming session %s)", self.run_id, attempt, session_id)

    async def _store(self, write: Callable[[], Awaitable[T]]) -> T:
        """One idempotent registry/record write, retried for ``settings.store_retry`` seconds
        while the store is unavailable (never past this host's session)."""
        return await retry_unavailable(write, deadline=time.monotonic() + self.deps.settings.store_retry,
                                       session=self.deps.session, what=f"run {self.run_id}: store",
                                       errors=(StoreUnavailable,))

    async def keep_certificate(self) -> None:
        """Renew the run's sandbox daemon's TLS certificate before it expires, for as long as
        this claim drives the run (a side task of the driver; cancelled with it). Ends at once
        on a provider whose daemons serve no certificate minted for them.

        Raises:
            OSError, ValueError: never (logged, tried again at the next look).
        """
        every = 1.0  # while the sandbox is being found or built
        while True:
            sbx = self.current
            if sbx is not None:
                check = sbx.provider.cert_check_every()
                if check is None:
                    return
                every = check
                try:
                    renewed = await sbx.provider.renew_tls(sbx.handle)
                except (OSError, ValueError) as exc:
                    log.warning("run %s: sandbox %s: TLS certificate not renewed: %s", self.run_id, sbx.handle.key,
                                exc)
                else:
                    if renewed is not None:
                        log.info("run %s: sandbox %s: TLS certificate renewed, valid until %s", self.run_id,
                                 sbx.handle.key, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(renewed)))
            await asyncio.sleep(every)

    # --- stop and remove --------------------------------------------------------------

    async def abandon(self, sbx: Sandbox) -> None:
        """Kill the agent of a sandbox this driver gives up and destroy it, before the claim
        goes (shielded and bounded: it runs while the driver fails or is cancelled).

        Raises:
            asyncio.CancelledError: the driver was cancelled meanwhile (after the cleanup).
        """
        task = asyncio.ensure_future(self.reclaim(sbx))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.deps.settings.final_write_timeout
        cancelled = False
        while not task.done() and loop.time() < deadline:
            try:
                await asyncio.wait({task}, timeout=deadline - loop.time())
            except asyncio.CancelledError:
                cancelled = True  # finish the cleanup first; re-raised below
        if not task.done():
            log.error("run %s: sandbox %s not reclaimed in time", self.run_id, sbx.handle.key)
            await cancel_and_wait({task})  # its owner awaits it, even when giving up on it
        elif not task.cancelled() and task.exception() is not None:
            log.error("run %s: sandbox %s not reclaimed: %r", self.run_id, sbx.handle.key, task.exception())
        if cancelled:
            raise asyncio.CancelledError()

    async def reclaim(self, sbx: Sandbox) -> None:
        """SIGKILL every agent process of the sandbox, confirm, then destroy it.

        No grace period: nothing the agent writes from now on can reach a client.

        Raises:
            SandboxReclaimFailed: a process survived SIGKILL, or the sandbox still exists.
        """
        p, h = sbx.provider, sbx.handle
        # The previous host may still be launching into this sandbox (a starved or paused
        # host that has not yet noticed its session is gone), so its agent can appear after
        # a first SIGKILL: the SIGKILL goes out again at every check, and a sandbox found
        # again after its removal (a launch writing into it meanwhile) is reclaimed again.
        for _ in range(3):
            if p.killable_processes:
                for _ in range(100):
                    await p.kill(h, signal.SIGKILL)
                    if not await p.processes_alive(h):
                        break
                    await asyncio.sleep(0.02)
                else:
                    raise SandboxReclaimFailed(h.key, "agent processes survived SIGKILL")
            if sbx.destroyed:
                break
            await p.destroy(h)
            if not await p.exists(h):
                sbx.destroyed = True
                break
        else:
            raise SandboxReclaimFailed(h.key, "the sandbox could not be destroyed")
        with contextlib.suppress(BatonError, TimeoutError):
            async with asyncio.timeout(self.deps.settings.store_retry):
                await self.deps.cc.delete_sandbox(h.key)

    async def kill(self, sbx: Sandbox) -> bool | None:
        """SIGTERM the agent's process group, SIGKILL after the grace period.

        Returns:
            True when no agent process is left, None when the provider cannot tell.
        """
        p = sbx.provider
        if not p.killable_processes:
            return None
        if not await p.processes_alive(sbx.handle):
            return True
        await p.kill(sbx.handle, signal.SIGTERM)
        deadline = time.monotonic() + self.deps.settings.cancel_grace
        while time.monotonic() < deadline:
            if not await p.processes_alive(sbx.handle):
                return True
            await asyncio.sleep(0.05)
        await p.kill(sbx.handle, signal.SIGKILL)
        for _ in range(40):
            if not await p.processes_alive(sbx.handle):
                return True
            await asyncio.sleep(0.05)
        return False

    async def destroy(self, sbx: Sandbox) -> bool:
        """Destroy the sandbox, then remove it from the registry (idempotent).

        Returns:
            True when the sandbox is confirmed gone.

        Raises:
            StoreUnavailable: the registry entry could not be removed (the sandbox is gone;
                calling again retries only the registry).
        """
        if not sbx.destroyed:
            ok = await sbx.provider.destroy(sbx.handle)
            if not (ok or not await sbx.provider.exists(sbx.handle)):
                return False
            sbx.destroyed = True
        await self.deps.cc.delete_sandbox(sbx.handle.key)
        return True

    async def destroy_leftovers(self, keep: str | None) -> None:
        """Remove every other sandbox of this run (a host that died mid-build left it), on the
        provider of the run's sandbox, else the one its record names."""
        sbx = self.current
        if sbx is not None:
            provider = sbx.provider
        else:
            try:
                provider = await self.deps.provider_named(self.deps.run_provider(self.record), self.run_id)
            except ProviderUnreachable as exc:
                log.warning("run %s: leftover sandboxes not looked for: %s", self.run_id, exc)
                return
        await provider.destroy_leftovers(self.run_id, keep)
