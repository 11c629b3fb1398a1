"""One driven run: the I/O around the pure state machine (docs/design.md §5.4, §5.5).

A :class:`RunDriver` holds one claim (run id, epoch) and does, in its own task:

* fresh: (the claim, fence and ``run.accepted`` were done by :meth:`RunManager.start_run`)
  build the sandbox → register it → launch the agent → follow → translate → append → finish;
* attach: fence → preflight (or, when the first host never marked its agent launched in the
  sandbox registry, kill whatever runs in its sandbox, destroy it, build + launch our own)
  → replay the journal from byte 0 with a fresh translator → align against the headers
  stored before the fence → append only the new suffix → follow → finish;
* finalize (a cancel or reap of a run whose driver is gone): fence → kill → destroy →
  ``run.cancelled`` + ``RUN_ERROR cancelled`` → ``aborted`` → close.

Control events (a cancel seen via ``WatchRun`` or the in-process fast path, a detach with
``cancel_on_disconnect = true``, a successor's epoch, a lost session, a drain) reach the
driver through :meth:`RunDriver.post`; the state machine (:mod:`sandbox_host.machine`)
decides. This module supervises and streams; the sandbox I/O is
:class:`~sandbox_host.sandboxes.RunSandboxes`, and the final writes are
:class:`~sandbox_host.finishing.Finisher`'s, run shielded so a cancelled task still
finishes them (bounded), and retried so a short store or log outage does not leave the
run ``running`` forever.

The driver's reads of its run's stored log (the takeover read) are
:class:`~sandbox_host.driver_stored.StoredReads` and its transcript duty (prepare, save,
snapshots) is :class:`~sandbox_host.driver_transcript.TranscriptSteps`: methods of the
driver over its one run's state, kept in their own modules.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from baton.errors import (
    AppendConflict, BatonError, JournalAttachUnavailable, JournalReplayDiverged,
    JournalReplayThreadIdMismatch, LogAlreadyClosed, LogStorageFull, LogUnavailable, RunClaimLost, SandboxError,
    StoreUnavailable, TranscriptFenced,
)
from baton.transcript import TranscriptBuilder
from baton.v1 import runs_pb2
from sandbox_host import machine as M
from sandbox_host._tasks import cancel_and_wait, retry_unavailable
from sandbox_host.align import Aligner
from sandbox_host.driver_stored import StoredReads
from sandbox_host.driver_transcript import TranscriptSteps
from sandbox_host.finishing import Finisher
from sandbox_host.sandboxes import RunSandboxes, Sandbox

if TYPE_CHECKING:
    from baton.log import LogWriter
    from sandbox_host.deps import HostDeps

log = logging.getLogger("baton.sandbox_host.driver")

Mode = Literal["fresh", "attach", "finalize"]
Chunk = dict[str, Any]
__all__ = ["RunDriver", "RunStats"]


@dataclass
class RunStats:
    """What a driver did (for tests, logs and the bench)."""

    stored_prefix: int = 0
    appended: int = 0
    replayed: int = 0
    first_append_at: float | None = None
    #: Seconds from the start of the body to the end of each step (fenced, headers, input,
    #: sandbox) and to the first append (append), for the takeover log line and the bench.
    marks: dict[str, float] = field(default_factory=dict)
    outcome: str | None = None
    decision: M.Decision | None = None
    errors: list[str] = field(default_factory=list)

class RunDriver(TranscriptSteps, StoredReads):
    """Drives one run under one claim. Created and owned by :class:`RunManager`.

    Args:
        deps: the host's clients and settings.
        record: the run record as returned by the claim.
        epoch: the claim's epoch.
        mode: ``fresh``, ``attach`` or ``finalize``.
        writer: the claim's log writer (already fenced for ``fresh``).
        input_messages: the run input's messages (``fresh`` only; a successor reads them
            from the stored ``run.accepted`` chunk).
    """

    def __init__(
        self,
        deps: "HostDeps",
        record: runs_pb2.RunRecord,
        epoch: int,
        mode: Mode,
        writer: "LogWriter",
        *,
        input_messages: list[dict[str, Any]] | None = None,
        fence_seq: int | None = None,
        cancel_reason: str | None = None,
        opened: list[Any] | None = None,
    ) -> None:
        self.deps = deps
        # What a fresh start appended from the translator before the sandbox existed
        # (RUN_STARTED): the replay reproduces it first, so it is this run's stored prefix.
        self._opened: list[Any] = list(opened or [])
        self.record = record
        self.run_id = record.run_id
        self.epoch = epoch
        self.mode: Mode = mode
        self.writer = writer
        self.fence_seq = fence_seq
        self.machine = M.RunMachine(keep_sandbox=record.keep_sandbox)
        if fence_seq is not None:
            self.machine.advance(M.Phase.FENCED)
        self.builder = TranscriptBuilder(input_messages)
        self.input_messages: list[dict[str, Any]] = list(input_messages or [])
        self.stats = RunStats()
        self._control: asyncio.Queue[M.Event] = asyncio.Queue(maxsize=64)
        self._inflight: asyncio.Task[Any] | None = None
        self.sandboxes = RunSandboxes(deps, record, epoch, mode)
        self._aligner: Aligner | None = None
        self._inputs_loaded = mode == "fresh"
        # Whether the log lacks the run input (run.accepted) although an earlier claim
        # existed (a start that failed half-way): then no agent is launched and no
        # transcript saved. Known once the stored log was read.
        self._input_missing = False
        self._release_delay = 0.0
        self._cancel_reason = cancel_reason
        self._transcript_rev: int | None = None
        self._transcript_loaded = False
        self._transcript_fenced: TranscriptFenced | None = None
        self._snap_dirty = False
        #: Set when this driver starts releasing its claim: it writes nothing after that,
        #: so the host may take the run again (a successor after a let-go may be this host).
        self.releasing = False
        self._storage_waits = 0
        self._began = time.monotonic()
        self.done = asyncio.Event()

    # --- control --------------------------------------------------------------------------

    def post(self, event: M.Event) -> bool:
        """Hand a control event to the driver (never blocks; drops when full or done)."""
        if self.done.is_set():
            return False
        try:
            self._control.put_nowait(event)
        except asyncio.QueueFull:
            return False
        return True

    # --- main -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Drive the run to a decision and carry it out. Never raises domain errors."""
        watch = asyncio.create_task(self._watch(), name=f"watch:{self.run_id}")
        snap = asyncio.create_task(self._snapshots(), name=f"snap:{self.run_id}")
        body = asyncio.create_task(self._body(), name=f"body:{self.run_id}")
        try:
            try:
                decision = await self._supervise(body)
            except Exception as exc:  # a driver bug: hand the run over rather than sit on it
                log.exception("run %s: driver failed; releasing the claim", self.run_id)
                self.stats.errors.append(repr(exc))
                decision = M.Decision(release_claim=True, stop=True)
            self.stats.decision = decision
            if decision is not None:
                await self._finish_shielded(decision)
        finally:
            await cancel_and_wait({watch, snap, body})
            if not body.cancelled():
                body.exception()  # retrieved: _supervise decided on it (or the driver failed)
            for t in (watch, snap):
                if not t.cancelled() and t.exception() is not None:
                    log.warning("run %s: %s ended with %r", self.run_id, t.get_name(), t.exception())
            await self._drop_inflight()
            self.done.set()
            log.info("run %s: driver ended at epoch %d (%s)", self.run_id, self.epoch, self.stats.outcome)

    async def _finish_shielded(self, decision: M.Decision) -> None:
        """Run the final writes in their own task, shielded from the driver's cancellation.

        A cancelled driver (host shutdown) still gives them ``final_write_timeout`` seconds,
        then cancels them and waits until they ended: the task never outlives its owner.
        """
        fin = asyncio.create_task(self._execute(decision), name=f"final:{self.run_id}")
        try:
            await asyncio.shield(fin)
        except asyncio.CancelledError:
            try:
                await asyncio.wait({fin}, timeout=self.deps.settings.final_write_timeout)
            finally:
                await cancel_and_wait({fin})
                if not fin.cancelled() and fin.exception() is not None:
                    log.error("run %s: final writes failed", self.run_id, exc_info=fin.exception())
            raise

    async def _drop_inflight(self) -> None:
        """Await the shielded append a cancelled body left (cancelled: nothing waits for it,
        and whatever it still lands is harmless under the fence)."""
        task, self._inflight = self._inflight, None
        if task is None:
            return
        await cancel_and_wait({task})
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            if not isinstance(exc, RunClaimLost):
                log.warning("run %s: last append failed: %r", self.run_id, exc)

    async def _supervise(self, body: "asyncio.Task[M.Decision | None]") -> M.Decision | None:
        while True:
            getter = asyncio.ensure_future(self._control.get())
            try:
                done, _ = await asyncio.wait({body, getter}, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:
                getter.cancel()
                raise
            if getter in done:
                event = getter.result()
                d = self.machine.on(event)
                if not d.stop:
                    continue
                log.info("run %s: %s → stopping (%s)", self.run_id, type(event).__name__,
                         "terminal" if d.terminal else "no terminal writes")
                await cancel_and_wait({body})
                await self._settle_inflight(wait=d.terminal)
                own = body.result() if not body.cancelled() and body.exception() is None else None
                if own is not None and own.stop:
                    # The body reached its own decision first; the machine ignored ours.
                    return own
                # A body that swallowed the cancel (a client library's wait_for) and went on
                # to decide after us got CONTINUE from the machine: ours is the decision.
                # Returning its CONTINUE would end the driver with nothing written and the
                # claim still held, so nobody would ever finish the run.
                return d
            getter.cancel()
            await asyncio.wait({getter})
            if body.cancelled():
                return None
            exc = body.exception()
            if exc is not None:
                return self._decide_failure(exc)
            return body.result()

    async def _settle_inflight(self, *, wait: bool) -> None:
        """Let a shielded append finish before terminal writes (bounded), else drop it.

        A stop without terminal writes (claim lost, session lost, drain) never appends
        again with this writer, so an append stuck in publish retries is cancelled: the
        fence makes whatever it might still land harmless for the successor.
        """
        task = self._inflight
        if task is None:
            return
        if not wait:
            task.cancel()
        await asyncio.wait({task}, timeout=self.deps.settings.final_write_timeout)
        if task.done() and not task.cancelled():
            exc = task.exception()  # retrieved: the decision already accounts for it
            if exc is not None and not isinstance(exc, RunClaimLost):
                log.warning("run %s: last append failed: %r", self.run_id, exc)

    def _decide_failure(self, exc: BaseException) -> M.Decision | None:
        if isinstance(exc, RunClaimLost):
            self.stats.outcome = "claim-lost"
            return self.machine.on(M.ClaimLost(exc.observed))
        if isinstance(exc, JournalReplayDiverged):
            self.stats.outcome = "diverged"
            return self.machine.on(M.Diverged(exc.index, isinstance(exc, JournalReplayThreadIdMismatch)))
        if isinstance(exc, JournalAttachUnavailable):
            self.stats.outcome = exc.reason
            return self.machine.on(M.Failed(f"cannot attach: {exc.reason}", exc.reason.replace("-", "_")))
        if isinstance(exc, SandboxError):
            self.stats.outcome = "sandbox-failed"
            return self.machine.on(M.Failed(str(exc), "sandbox_build_failed"))
        log.error("run %s: driver failed", self.run_id, exc_info=exc)
        self.stats.errors.append(repr(exc))
        if isinstance(exc, (StoreUnavailable, LogUnavailable)):
            # Infrastructure trouble: hand over (after a pause, so a cluster-wide outage
            # does not turn failover into a hot loop), do not finalize. A full log store
            # only gets here once the session is lost (appends wait for storage): the
            # longer pause keeps a successor from meeting the same full store at once.
            self._release_delay = 5.0 if isinstance(exc, LogStorageFull) else 1.0
            return self.machine.on(M.Drain())
        if isinstance(exc, BatonError):
            return self.machine.on(M.Failed(str(exc), "host_error"))
        return self.machine.on(M.Failed(f"host error: {type(exc).__name__}", "host_error"))

    # --- body -----------------------------------------------------------------------------

    async def _body(self) -> M.Decision | None:
        # A successor reads the sandbox registry while it fences and reads the stored log:
        # neither needs the other, and the entry is already fenced by this claim's epoch
        # (the claim landed before this driver began), so it is not read any earlier in
        # the sense that matters. A cancelled or closed run never uses it.
        lookup: asyncio.Task[Sandbox | None] | None = None
        if self.mode == "attach" and self.record.sandbox_key and not self.record.cancel_requested:
            lookup = asyncio.create_task(self.deps.find_sandbox(self.record.sandbox_key),
                                         name=f"sandbox-lookup:{self.run_id}")
        try:
            return await self._body_steps(lookup)
        finally:
            if lookup is not None:
                await cancel_and_wait({lookup})
                if not lookup.cancelled():
                    lookup.exception()  # retrieved: the body awaited it, or stopped before

    async def _body_steps(self, lookup: "asyncio.Task[Sandbox | None] | None") -> M.Decision | None:
        t0 = self._began = time.monotonic()
        while self.fence_seq is None:
            try:
                self.fence_seq = await self.writer.fence()
            except LogAlreadyClosed as closed:
                return self.machine.on(await self._stored_close(closed))
            except LogStorageFull as full:
                await self._wait_for_storage(full)
                continue
            self.machine.advance(M.Phase.FENCED)
        stored: list[Any] = list(self._opened)
        marks = self.stats.marks
        marks["fenced"] = time.monotonic() - t0
        if self.mode != "fresh":
            stored, bodies = await self._stored_before_fence()
            marks["headers"] = time.monotonic() - t0
            await self._load_input_messages(stored, bodies)
            marks["input"] = time.monotonic() - t0
        if self.mode == "finalize" or (self.mode == "attach" and self.record.cancel_requested):
            return self.machine.on(M.CancelRequested(reason=self._cancel_reason or self.record.cancel_reason or "user",
                                                     path="reaper" if self._cancel_reason == "reaped" else "watch"))
        if self._input_missing:
            # A start that failed half-way left a log without the run's input: launching
            # the agent would run it on an empty prompt. End the run; readers get the end.
            self.stats.outcome = "input-missing"
            return self.machine.on(M.Failed("the run's input (run.accepted) is missing from its log",
                                            "run_input_missing"))
        self.machine.advance(M.Phase.PREPARING)
        sbx = await self.sandboxes.ensure(self.input_messages, lookup=lookup)
        marks["sandbox"] = time.monotonic() - t0
        aligner = self._aligner = Aligner(stored, thread_ids=())
        self.stats.stored_prefix = aligner.stored_count
        self.machine.advance(M.Phase.STREAMING)
        return await self._stream(sbx, aligner)

    async def _stream(self, sbx: Sandbox, aligner: Aligner) -> M.Decision | None:
        from sandbox_host.journal import JournalExit, JournalLine, JournalTruncated, follow_journal

        translator = self.deps.translator(self.record, self.run_id)
        exit_code: int | None = None
        fragment: bytes | None = None
        items = follow_journal(sbx.provider, sbx.handle, sbx.handle.journal_path, offset=0, nonce=sbx.nonce,
                               poll_interval=self.deps.settings.journal_poll)
        every = self.deps.settings.replay_yield_lines
        lines = 0
        async with contextlib.aclosing(items) as it:
            async for item in it:
                if isinstance(item, JournalLine):
                    d = await self._emit(translator.feed(item.data), aligner)
                    if d is not None:
                        return d
                    lines += 1
                    if every and lines % every == 0:
                        # A replay over a stored prefix appends nothing, so nothing else
                        # awaits: one read of the journal (up to 1 MiB) would be translated
                        # and aligned in one step of the loop. Several takeovers at once held
                        # the loop for seconds that way, and the host's keep-alive with it.
                        await asyncio.sleep(0)
                elif isinstance(item, JournalTruncated):
                    fragment = item.data
                elif isinstance(item, JournalExit):
                    exit_code = item.code
                    break
        d = await self._emit(translator.finish(exit_code, fragment), aligner)
        aligner.finish()
        if d is not None:
            return d
        return self.machine.on(M.Failed("the journal ended without a terminal event", "incomplete_journal"))

    async def _emit(self, chunks: list[Chunk], aligner: Aligner) -> M.Decision | None:
        new: list[Chunk] = []
        terminal: M.Event | None = None
        for c in chunks:
            try:
                tagged = aligner.feed(c)
            except JournalReplayDiverged as exc:
                raise await self._refine(exc, aligner, c) from None
            self.stats.replayed += 1
            self.builder.feed(c)
            self._snap_dirty = True
            if tagged.tag == "stored":
                self.machine.saw_chunk(c)
                if M.is_terminal_chunk(c):
                    terminal = M.StoredTerminal(c)
                    break
            else:
                new.append(c)
                if M.is_terminal_chunk(c):
                    terminal = M.AgentTerminal(c)
                    break
        if new:
            await self._append(new, "journal")
        if terminal is not None:
            return self.machine.on(terminal)
        return None

    async def _refine(self, exc: JournalReplayDiverged, aligner: Aligner, replayed: Chunk) -> JournalReplayDiverged:
        """Tell a thread-id-only mismatch from any other divergence (reads one stored body)."""
        if "threadId" not in replayed or exc.stored is None:
            return exc
        header = aligner.header(exc.index)
        body = await self.deps.read_chunk(self.run_id, header.offset) if header is not None else None
        if isinstance(body, dict) and "threadId" in body and body["threadId"] != replayed["threadId"]:
            from baton.fingerprint import fingerprint

            if fingerprint({**replayed, "threadId": body["threadId"]}) == exc.stored:
                return JournalReplayThreadIdMismatch(exc.index, exc.stored, exc.replayed)
        return exc

    async def append_host(self, chunks: list[Chunk]) -> None:
        """Append host-origin chunks under the fence (the final writes' ``APPEND`` step)."""
        await self._append_now(chunks, "host")

    async def _append(self, chunks: list[Chunk], origin: Literal["journal", "host"]) -> None:
        """Append under the fence; the publish itself is shielded from cancellation."""
        task = asyncio.ensure_future(self._append_now(chunks, origin))
        self._inflight = task
        await asyncio.shield(task)

    async def _append_now(self, chunks: list[Chunk], origin: Literal["journal", "host"]) -> None:
        if self.stats.first_append_at is None and self.mode == "attach" and self.deps.settings.quiet_time > 0:
            await asyncio.sleep(self.deps.settings.quiet_time)  # baseline emulation (bench only)
        remaining = list(chunks)
        conflicts = 0
        while conflicts < 8:
            try:
                await self.writer.append(remaining, origin=origin)
                break
            except LogStorageFull as full:
                # Keep the claim and wait for storage (issue 19): a handover would only
                # meet the same full store on the next host. Only the unstored rest is
                # sent again, its first record with the same message id.
                landed = len(full.landed)
                self._count(remaining[:landed])
                remaining = remaining[landed:]
                await self._wait_for_storage(full)
                continue
            except AppendConflict as conflict:
                # Another writer (not a successor) moved the head: keep what landed, adopt
                # the head, and append only the rest. Never re-send a landed chunk.
                landed = len(conflict.landed)
                self._count(remaining[:landed])
                remaining = remaining[landed:]
                conflicts += 1
                await self.writer.resync()
        else:
            raise RunClaimLost(self.run_id, self.epoch, "append-conflicts")
        self._storage_waits = 0
        self._count(remaining)

    async def _wait_for_storage(self, full: LogStorageFull) -> None:
        """Pause before the next try while the log cannot store (growing, at most 5 s).

        Bounded by the session, not by a budget: the run is not lost while the store is
        full, and its journal keeps growing in the sandbox meanwhile.

        Raises:
            LogStorageFull: ``full`` again, once this host's session is lost.
        """
        if self.deps.session.lost.is_set():
            raise full
        self._storage_waits += 1
        pause = min(0.5 * 2 ** min(self._storage_waits - 1, 4), 5.0)
        if self._storage_waits == 1 or self._storage_waits % 10 == 0:
            log.warning("run %s: the delivery log cannot store (%s); keeping the claim, retrying (try %d)",
                        self.run_id, full.detail, self._storage_waits)
        try:
            async with asyncio.timeout(pause):
                await self.deps.session.lost.wait()
        except TimeoutError:
            return
        raise full

    def _count(self, chunks: list[Chunk]) -> None:
        if chunks and self.stats.first_append_at is None:
            self.stats.first_append_at = time.monotonic()
            self.stats.marks["append"] = self.stats.first_append_at - self._began
            if self.mode == "attach":
                log.info("run %s: takeover at epoch %d: first append after %s (s since the driver began; "
                         "%d stored chunks replayed)", self.run_id, self.epoch,
                         {k: round(v, 3) for k, v in self.stats.marks.items()}, self.stats.stored_prefix)
        self.stats.appended += len(chunks)
        for c in chunks:
            self.machine.saw_chunk(c)

    # --- finishing ------------------------------------------------------------------------

    async def _execute(self, d: M.Decision) -> None:
        """Carry out decision ``d``: its final writes, as :class:`Finisher` steps."""
        self.stats.outcome = self.stats.outcome or d.status or ("handed-over" if d.release_claim else "stopped")
        if d.terminal and self.fence_seq is None:
            # A cancel can arrive before this claim's fence landed: fence first, since
            # every write of a claim comes after its fence (docs/design.md §4.1).
            try:
                self.fence_seq = await retry_unavailable(
                    self.writer.fence, deadline=time.monotonic() + self.deps.settings.finish_budget,
                    session=self.deps.session, what=f"run {self.run_id}: fence", errors=(LogUnavailable,))
            except RunClaimLost:
                return
            except LogAlreadyClosed as closed:
                try:
                    d = self.machine.decision = M.decide(await self._stored_close(closed),
                                                         keep_sandbox=self.record.keep_sandbox)
                except LogUnavailable:
                    d = M.Decision(release_claim=True, stop=True)
            except LogUnavailable:
                d = M.Decision(release_claim=True, stop=True)  # let go: a successor fences
        if d.terminal:
            save = d.save_transcript
        else:
            save = d.release_claim and self._replay_complete()
        outcomes = await Finisher(self, d, save_transcript=save, release_delay=self._release_delay).finish()
        if any(o == "gave-up" for o in outcomes.values()):
            self.stats.outcome = f"{self.stats.outcome} (let go)"

    async def _watch(self) -> None:
        """Turn record changes (WatchRun) into control events."""
        deps = self.deps
        lost = asyncio.ensure_future(deps.session.lost.wait())
        try:
            # aclosing: a return below ends the WatchRun call now, not when the generator is collected.
            async with contextlib.aclosing(deps.cc.watch_run(self.run_id)) as changes:
                async for ev in changes:
                    if lost.done():
                        self.post(M.SessionLost())
                        return
                    rec = ev.record
                    if rec is None:
                        self.post(M.ClaimLost("record-gone"))
                        return
                    if rec.cancel_requested:
                        self.post(M.CancelRequested(reason=rec.cancel_reason or "user", path="watch"))
                    elif rec.cancel_on_disconnect and rec.HasField("detached_since"):
                        self.post(M.Detached(cancel_on_disconnect=True))
                    claim = ev.claim
                    if claim is not None and claim.epoch > self.epoch:
                        self.post(M.ClaimLost(f"claim@{claim.epoch}"))
                        return
        finally:
            lost.cancel()

