"""One driven run: supervision of one claim around the pure state machine (docs/design.md §5.4, §5.5).

A :class:`RunDriver` holds one claim (run id, epoch) and does, in its own task:

* fresh: (the claim, fence and ``run.accepted`` were done by :meth:`RunManager.start_run`)
  build the sandbox → register it → prepare it → launch the agent → follow → translate →
  append → finish;
* attach: fence → preflight (or, when the first host never marked its agent launched in the
  sandbox registry, kill whatever runs in its sandbox, destroy it, build + launch our own)
  → replay the journal from byte 0 with a fresh translator → align against the headers
  stored before the fence → append only the new suffix → follow → finish;
* finalize (a cancel or reap of a run whose driver is gone): fence → kill → destroy →
  ``run.cancelled`` + ``RUN_ERROR cancelled`` → ``aborted`` → close.

It is three objects with one job each, which the driver supervises in one task group (the
body, the ``WatchRun`` of its record, the transcript snapshots):

* :class:`~sandbox_host.claim_log.ClaimLog`: every write to the run's log and transcript
  under this claim's fence, and the takeover read of what the log stored;
* :class:`~sandbox_host.pipeline.Replay`: journal → translator → aligner → tagged chunks (pure);
* :class:`~sandbox_host.sandboxes.RunSandboxes`: the sandbox (find or build, launch, kill, destroy).

Control events (a cancel seen via ``WatchRun`` or the in-process fast path, a detach with
``cancel_on_disconnect = true``, a successor's epoch, a lost session, a drain) reach the
driver through :meth:`RunDriver.post`; the state machine (:mod:`sandbox_host.machine`)
decides. A decision's final writes are :class:`~sandbox_host.finishing.Finisher`'s, run
shielded so a cancelled driver still finishes them (bounded), and retried so a short store
or log outage does not leave the run ``running`` forever.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from baton.errors import (
    BatonError, JournalAttachUnavailable, JournalReplayDiverged, JournalReplayThreadIdMismatch, LogAlreadyClosed,
    LogStorageFull, LogUnavailable, RunClaimLost, SandboxError, StoreUnavailable, UnknownRun,
)
from baton.v1 import runs_pb2
from sandbox_host import machine as M
from sandbox_host._tasks import cancel_and_wait, retry_unavailable
from sandbox_host.claim_log import ClaimLog, Mode, RunStats
from sandbox_host.finishing import Finisher
from sandbox_host.pipeline import Batch, Replay
from sandbox_host.run_inputs import InputDesk
from sandbox_host import run_inputs_io, run_trace
from sandbox_host.journal import JournalResume
from sandbox_host.sandboxes import RunSandboxes, Sandbox, adopt

if TYPE_CHECKING:
    from baton.log import LogWriter
    from sandbox_host.deps import HostDeps

log = logging.getLogger("baton.sandbox_host.driver")


async def _given(found: "Sandbox | None") -> "Sandbox | None":
    """The registry entry the attach read already (the lookup's task, without a second read)."""
    return found


__all__ = ["Mode", "RunDriver", "RunStats"]

#: Seconds a driver tries to read its run's record after the agent's terminal chunk was
#: stored, to see a cancel that landed first (docs/design.md §5.5).
END_CHECK_BUDGET = 5.0


@dataclass(frozen=True)
class _BodyEnd:
    """How the body ended: its decision, or the error the supervisor decides on."""

    decision: M.Decision | None = None
    error: Exception | None = None


def _post_to(done: asyncio.Event, control: "asyncio.Queue[M.Event]", event: M.Event) -> bool:
    """:meth:`RunDriver.post` on the driver's parts: what its claim log holds (no cycle)."""
    if done.is_set():
        return False
    try:
        control.put_nowait(event)
    except asyncio.QueueFull:
        return False
    return True


class RunDriver:
    """Drives one run under one claim. Created and owned by :class:`RunManager`.

    Args:
        deps: the host's clients and settings.
        record: the run record as returned by the claim.
        epoch: the claim's epoch.
        mode: ``fresh``, ``attach`` or ``finalize``.
        writer: the claim's log writer (already fenced for ``fresh``).
        input_messages: the run input's messages (``fresh`` only; a successor reads them
            from the stored ``run.accepted`` chunk).
        fence_seq: the sequence of the claim's fence when it landed already (``fresh``).
        cancel_reason: the cancel a ``finalize`` claim carries out.
        opened: what a fresh start appended from the translator before the sandbox existed
            (``RUN_STARTED``): the replay reproduces it first, so it is the stored prefix.
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
        sandbox_read: "tuple[Sandbox | None] | None" = None,
    ) -> None:
        self.deps = deps
        #: The registry's entry of ``record.sandbox_key`` as the attach read it (``None``: not read).
        self._sandbox_read = sandbox_read
        self.record = record
        self.run_id = record.run_id
        self.epoch = epoch
        self.mode: Mode = mode
        self._opened: list[Any] = list(opened or [])
        self._cancel_reason = cancel_reason
        self.machine = M.RunMachine(keep_sandbox=record.keep_sandbox)
        if fence_seq is not None:
            self.machine.advance(M.Phase.FENCED)
        self.stats = RunStats()
        self._control: asyncio.Queue[M.Event] = asyncio.Queue(maxsize=64)
        self.done = asyncio.Event()
        # Not the bound ``self.post``: the claim log would refer back to the driver, a cycle
        # that kept the whole run (its input messages twice) until a full collection.
        self.claim_log = ClaimLog(deps, record, epoch, mode, writer, machine=self.machine, stats=self.stats,
                                  post=functools.partial(_post_to, self.done, self._control),
                                  input_messages=input_messages, fence_seq=fence_seq)
        self.sandboxes = RunSandboxes(deps, record, epoch, mode)
        self._release_delay = 0.0
        #: The run's inputs (approvals, steered messages): set once its sandbox has an inbox.
        self.inputs: InputDesk | None = None
        self._inputs_wake = asyncio.Event()
        self._record_inputs: list[Any] = list(record.inputs)

    @property
    def releasing(self) -> bool:
        """Whether this driver releases its claim: it writes nothing any more, so the host
        may take the run again (a successor after a let-go may be this host)."""
        return self.claim_log.releasing

    # --- control --------------------------------------------------------------------------

    def post(self, event: M.Event) -> bool:
        """Hand a control event to the driver (never blocks; drops when full or done)."""
        return _post_to(self.done, self._control, event)

    def on_inputs(self, inputs: Any) -> None:
        """The record's inputs changed (an answer, a steered message, an expiry)."""
        self._record_inputs = list(inputs)
        if self.inputs is not None:
            self.inputs.on_record(self._record_inputs)
            self._inputs_wake.set()

    def _inputs_ended(self, task: "asyncio.Task[None]") -> None:
        """The inputs loop ended on its own: a lost claim ends the run's driving too."""
        if task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, RunClaimLost):
            self.post(M.ClaimLost(exc.observed))
        elif exc is not None:
            log.warning("run %s: inputs ended with %r", self.run_id, exc)

    # --- supervision ----------------------------------------------------------------------

    async def run(self) -> None:
        """Drive the run to a decision and carry it out. Never raises domain errors."""
        # Its own task: the run's log fields and drive span hold for everything it spawns.
        with run_trace.driving(self.deps.host_id, self.record, self.epoch, self.mode) as span:
            try:
                decision = await self._supervise_all()
                self.stats.decision = decision
                if decision is not None:
                    await self._finish_shielded(decision)
            finally:
                await self.claim_log.drop_inflight()
                self.done.set()
                span.set_attribute("baton.outcome", str(self.stats.outcome))
                log.info("run %s: driver ended at epoch %d (%s)", self.run_id, self.epoch, self.stats.outcome)

    async def _supervise_all(self) -> M.Decision | None:
        """The body, the record's watch and the snapshots in one task group, until a decision."""
        async with asyncio.TaskGroup() as tg:
            side = {tg.create_task(self._quietly(self._watch, "watch"), name=f"watch:{self.run_id}"),
                    tg.create_task(self._quietly(self.claim_log.snapshots, "snapshots"), name=f"snap:{self.run_id}"),
                    tg.create_task(self._quietly(self.sandboxes.keep_certificate, "certificate renewal"),
                                   name=f"cert:{self.run_id}")}
            body = tg.create_task(self._body(), name=f"body:{self.run_id}")
            try:
                try:
                    return await self._supervise(body)
                except Exception as exc:  # a driver bug: hand the run over rather than sit on it
                    log.exception("run %s: driver failed; releasing the claim", self.run_id)
                    self.stats.errors.append(repr(exc))
                    return M.Decision(release_claim=True, stop=True)
            finally:
                await cancel_and_wait({*side, body})

    async def _quietly(self, work: Callable[[], Awaitable[None]], what: str) -> None:
        """A side task of the driver: its failure is logged, it never ends the run."""
        try:
            await work()
        except Exception as exc:  # noqa: BLE001 - logged: a side task's failure is no run's end
            log.warning("run %s: %s ended with %r", self.run_id, what, exc)

    async def _supervise(self, body: "asyncio.Task[_BodyEnd]") -> M.Decision | None:
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
                await self.claim_log.settle_inflight(wait=d.terminal)
                own = body.result().decision if not body.cancelled() else None
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
            end = body.result()
            if end.error is not None:
                return self._decide_failure(end.error)
            return end.decision

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
                    self.on_inputs(rec.inputs)
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

    # --- the body: fence, takeover read, sandbox, replay ----------------------------------

    async def _body(self) -> _BodyEnd:
        """The run's work up to its own decision; its domain failures become the supervisor's
        to decide (cancellation is not one: it propagates)."""
        try:
            return _BodyEnd(decision=await self._drive())
        except Exception as exc:  # noqa: BLE001 - handed on: the supervisor decides on it
            return _BodyEnd(error=exc)

    async def _drive(self) -> M.Decision | None:
        # A successor reads the sandbox registry while it fences and reads the stored log:
        # neither needs the other, and the entry is already fenced by this claim's epoch
        # (the claim landed before this driver began), so it is not read any earlier in
        # the sense that matters. A cancelled or closed run never uses it.
        lookup: asyncio.Task[Sandbox | None] | None = None
        if self.mode == "attach" and self.record.sandbox_key and not self.record.cancel_requested:
            read = self._sandbox_read
            lookup = asyncio.create_task(_given(read[0]) if read is not None
                                         else self.deps.find_sandbox(self.record.sandbox_key),
                                         name=f"sandbox-lookup:{self.run_id}")
        try:
            return await self._steps(lookup)
        finally:
            if lookup is not None:
                await cancel_and_wait({lookup})
                if not lookup.cancelled():
                    lookup.exception()  # retrieved: the body awaited it, or stopped before

    async def _steps(self, lookup: "asyncio.Task[Sandbox | None] | None") -> M.Decision | None:
        t0 = self.stats.began = time.monotonic()
        marks = self.stats.marks
        closed = await self._fence()
        if closed is not None:
            return closed
        marks["fenced"] = time.monotonic() - t0
        stored = await self._read_stored(t0)
        early = self._decide_before_sandbox()
        if early is not None:
            return early
        self.machine.advance(M.Phase.PREPARING)
        # Fresh, or a successor that must build its own: the sandbox is built, registered,
        # prepared (RunSandboxes.prepare_launch) and the agent launched; else the preflight.
        sbx = await self.sandboxes.ensure(self.claim_log.input_messages, lookup=lookup)
        marks["sandbox"] = time.monotonic() - t0
        replay = self.claim_log.replay = Replay(self.deps.translator(self.record, self.run_id), stored,
                                                yield_every=self.deps.settings.replay_yield_lines)
        self.stats.stored_prefix = replay.stored_count
        self.machine.advance(M.Phase.STREAMING)
        return await self._stream(sbx, replay)

    async def _fence(self) -> M.Decision | None:
        """This claim's fence (a fresh start's landed already); the decision when the log
        was closed already (finalize from the close record), else ``None``."""
        if self.claim_log.fence_seq is not None:
            return None
        try:
            await self.claim_log.fence()
        except LogAlreadyClosed as closed:
            return self.machine.on(await self.claim_log.stored_close(closed))
        self.machine.advance(M.Phase.FENCED)
        return None

    async def _read_stored(self, t0: float) -> list[Any]:
        """The stored prefix to align the replay with: a successor's takeover read (headers
        before its fence, and the run input), or what a fresh start appended."""
        if self.mode == "fresh":
            return list(self._opened)
        marks = self.stats.marks
        stored, bodies = await self.claim_log.stored_before_fence()
        marks["headers"] = time.monotonic() - t0
        await self.claim_log.load_input(stored, bodies)
        marks["input"] = time.monotonic() - t0
        return stored

    def _decide_before_sandbox(self) -> M.Decision | None:
        """A run that must end before any sandbox is used: a cancel to carry out, or a log
        without the run's input."""
        if self.mode == "finalize" or (self.mode == "attach" and self.record.cancel_requested):
            reason = self._cancel_reason or self.record.cancel_reason or "user"
            return self.machine.on(M.CancelRequested(reason=reason,
                                                     path="reaper" if self._cancel_reason == "reaped" else "watch"))
        if self.claim_log.input_missing:
            # A start that failed half-way left a log without the run's input: launching
            # the agent would run it on an empty prompt. End the run; readers get the end.
            self.stats.outcome = "input-missing"
            return self.machine.on(M.Failed("the run's input (run.accepted) is missing from its log",
                                            "run_input_missing"))
        return None

    async def _stream(self, sbx: Sandbox, replay: Replay) -> M.Decision | None:
        """Follow the journal (across relaunched agent processes) through the replay
        pipeline and append what is new."""
        from sandbox_host.agent_resume import journal_with_resumes, should_relaunch

        def on_resume(item: JournalResume) -> None:
            if item.inbox and item.inbox != sbx.handle.data.get("inbox"):
                adopt(sbx, {"inbox": item.inbox})
            if self.inputs is not None:
                self.inputs.restarted()
                self._inputs_wake.set()

        async def relaunch(attempt: int) -> bool:
            assert self.inputs is not None  # should_relaunch said yes
            # The desk waits for the new process's asks from now, not only from its resume
            # marker: the launch adopts the new inbox at once, and the marker is read only
            # after it. An answer stored in between was delivered to the new process before
            # it asked again, and its re-ask then read as a new approval nobody answered
            # (docs/hitl.md "A resumed agent"; seen under load in tests/gateway/test_approvals.py).
            self.inputs.restarted()
            await self.sandboxes.relaunch(sbx, self.inputs.agent_session, attempt)
            return True

        items = journal_with_resumes(sbx, poll_interval=self.deps.settings.journal_poll,
                                     wanted=lambda attempt: should_relaunch(self.inputs, attempt),
                                     relaunch=relaunch, on_resume=on_resume,
                                     on_lag=self.deps.metrics.journal_read)
        decision: M.Decision | None = None
        self.inputs = run_inputs_io.desk_for(self.deps, self.record, sbx)
        serving: asyncio.Task[None] | None = None
        if self.inputs is not None:
            self.inputs.on_record(self._record_inputs)
            serving = asyncio.create_task(
                run_inputs_io.serve(self.deps, self.record, self.epoch, sbx, self.inputs, self._inputs_wake),
                name=f"inputs:{self.run_id}")
            serving.add_done_callback(self._inputs_ended)
        try:
            async with contextlib.aclosing(items) as journal, contextlib.aclosing(replay.batches(journal)) as batches:
                try:
                    async for batch in batches:
                        self.stats.marks.setdefault("journal", time.monotonic() - self.stats.began)
                        decision = await self._take(batch)
                        if decision is not None and not batch.final:
                            return decision
                except JournalReplayDiverged as exc:
                    raise await self._refine(exc, replay) from None
        finally:
            if serving is not None:
                await cancel_and_wait({serving})
        if decision is not None:
            return decision
        return self.machine.on(M.Failed("the journal ended without a terminal event", "incomplete_journal"))

    async def _take(self, batch: Batch) -> M.Decision | None:
        """One batch into the transcript, the new chunks into the log; the decision its
        terminal chunk (if any) leads to."""
        for tagged in batch.chunks:
            self.stats.replayed += 1
            self.claim_log.saw(tagged.chunk)
            if tagged.tag == "stored":
                self.machine.saw_chunk(tagged.chunk)
        new = batch.new
        if self.inputs is not None:
            asks = self.inputs.saw(t.chunk for t in batch.chunks)
            # An approval is on the run record (answerable, with its expiry) before any
            # reader can see it in the log.
            for ask in asks:
                await run_inputs_io.register(self.deps, self.record, self.epoch, self.inputs, ask)
            self._inputs_wake.set()
        if new:
            self.stats.marks.setdefault("aligned", time.monotonic() - self.stats.began)  # past the stored prefix
            await self.claim_log.append(new)
        end = batch.terminal
        if end is None:
            return None
        if end.tag == "stored":
            return self.machine.on(M.StoredTerminal(end.chunk))
        rec = await self._record_after_end()
        if rec is None:
            return self.machine.on(M.ClaimLost("record-gone"))
        return self.machine.on(M.agent_end(end.chunk, cancel_requested=rec.cancel_requested,
                                           cancel_reason=rec.cancel_reason))

    async def _record_after_end(self) -> runs_pb2.RunRecord | None:
        """The run record, read after the agent's terminal chunk was stored (a linearizable
        read): a cancel acknowledged before that store is seen here even when its
        ``WatchRun`` event or fast path is late or lost (docs/design.md §5.5).

        Returns:
            The record; ``None`` when it is gone (the run stops, as for a lost claim). A
            store not readable within :data:`END_CHECK_BUDGET` gives a record with no
            cancel flag: the run keeps the agent's outcome rather than hold its readers'
            end through a store outage (only a cancel whose flag landed just before the
            outage and whose fast path and ``WatchRun`` were both lost can lose then).
        """
        budget = min(END_CHECK_BUDGET, self.deps.settings.finish_budget)
        try:
            async with asyncio.timeout(budget):
                view = await retry_unavailable(lambda: self.deps.cc.get_run(self.run_id, timeout=budget),
                                               deadline=time.monotonic() + budget, session=self.deps.session,
                                               what=f"run {self.run_id}: the record at its end",
                                               errors=(StoreUnavailable,))
        except UnknownRun:
            return None
        except (StoreUnavailable, TimeoutError) as exc:
            log.warning("run %s: the record was not readable at the run's end (%r); keeping the agent's outcome",
                        self.run_id, exc)
            return runs_pb2.RunRecord(run_id=self.run_id)
        return view.record

    async def _refine(self, exc: JournalReplayDiverged, replay: Replay) -> JournalReplayDiverged:
        """Tell a thread-id-only mismatch from any other divergence (reads one stored body)."""
        replayed = replay.diverged_chunk
        if replayed is None or "threadId" not in replayed or exc.stored is None:
            return exc
        header = replay.header(exc.index)
        body = await self.claim_log.read_chunk(header.offset) if header is not None else None
        if isinstance(body, dict) and "threadId" in body and body["threadId"] != replayed["threadId"]:
            from baton.fingerprint import fingerprint

            if fingerprint({**replayed, "threadId": body["threadId"]}) == exc.stored:
                return JournalReplayThreadIdMismatch(exc.index, exc.stored, exc.replayed)
        return exc

    # --- finishing ------------------------------------------------------------------------

    async def _finish_shielded(self, decision: M.Decision) -> None:
        """Run the final writes in their own task, shielded from the driver's cancellation.

        A cancelled driver (host shutdown) still gives them ``final_write_timeout`` seconds,
        then cancels them and waits until they ended: the task never outlives its owner.
        """
        fin = asyncio.create_task(self._finish(decision), name=f"final:{self.run_id}")
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

    async def _finish(self, d: M.Decision) -> None:
        """Carry out decision ``d``: its final writes, as :class:`Finisher` steps."""
        self.stats.outcome = self.stats.outcome or d.status or ("handed-over" if d.release_claim else "stopped")
        if d.terminal and self.claim_log.fence_seq is None:
            # A cancel can arrive before this claim's fence landed: fence first, since
            # every write of a claim comes after its fence (docs/design.md §4.1).
            try:
                await self.claim_log.fence_to_finish()
            except RunClaimLost:
                return
            except LogAlreadyClosed as closed:
                try:
                    d = self.machine.decision = M.decide(await self.claim_log.stored_close(closed),
                                                         keep_sandbox=self.record.keep_sandbox)
                except LogUnavailable:
                    d = M.Decision(release_claim=True, stop=True)
            except LogUnavailable:
                d = M.Decision(release_claim=True, stop=True)  # let go: a successor fences
        if d.terminal:
            save = d.save_transcript
        else:
            save = d.release_claim and self.claim_log.replay_complete()
        finisher = Finisher(d, claim_log=self.claim_log, sandboxes=self.sandboxes, deps=self.deps,
                            save_transcript=save, release_delay=self._release_delay)
        outcomes = await finisher.finish()
        if any(o == "gave-up" for o in outcomes.values()):
            self.stats.outcome = f"{self.stats.outcome} (let go)"
