"""The log of one claim: every write a driver makes to its run's delivery log and transcript,
and its reads of what the log stored (docs/design.md §4.1, §4.2, §5.4, §5.5).

A :class:`ClaimLog` is the run's log as one claim (run id, epoch) sees it:

* the fenced writer: the fence, the appends (the publish shielded from cancellation, an
  ``AppendConflict`` resynced to the head and only the unstored rest sent again), the close;
  a full or unavailable store is waited out while the session holds (``LogStorageFull``);
* the takeover read: the headers the log held before this claim's fence, the run input
  (``run.accepted``) among them, and the close record a fence met;
* the transcript: the builder of what the log holds (stored prefix and new chunks), made
  whole before the final writes (rebuilt from the journal when the replay did not catch
  up), saved fenced by run id, epoch and run start, and saved as snapshots while the run
  streams; a ``TranscriptFenced`` from a successor stops the driver (``ClaimLost``).

The driver (:class:`~sandbox_host.driver.RunDriver`) decides when; the final writes
(:class:`~sandbox_host.finishing.Finisher`) use it as well.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Literal

from baton.errors import (
    AppendConflict, BatonError, JournalReplayDiverged, LogAlreadyClosed, LogStorageFull, LogUnavailable,
    RunClaimLost, TranscriptConflict, TranscriptFenced,
)
from baton.log import TranscriptWriter
from baton.runs import RUN_ACCEPTED
from baton.transcript import TranscriptBuilder
from baton.v1 import runs_pb2
from sandbox_host import machine as M
from sandbox_host._tasks import cancel_and_wait, reraise_if_cancelling, retry_unavailable
from sandbox_host.pipeline import Replay

if TYPE_CHECKING:
    from baton.log import LogWriter
    from sandbox_host.deps import HostDeps
    from sandbox_host.journal import JournalItem
    from sandbox_host.sandboxes import Sandbox

log = logging.getLogger("baton.sandbox_host.driver")  # the driver's logger: its lines, as before

Chunk = dict[str, Any]
Mode = Literal["fresh", "attach", "finalize"]
__all__ = ["ClaimLog", "Mode", "RunStats"]


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
    #: ``time.monotonic()`` when the driver's body began (the origin of :attr:`marks`).
    began: float = field(default_factory=time.monotonic)


class ClaimLog:
    """The delivery log and transcript of one claim (see the module docstring).

    Args:
        deps: the host's clients and settings.
        record: the run record as the claim returned it.
        epoch: the claim's epoch.
        mode: the driver's mode (``fresh``: the input is known and the log needs no replay
            to be whole; a successor reads both from the log).
        writer: the claim's log writer (already fenced for ``fresh``: ``fence_seq``).
        machine: the run's state machine (told of every chunk known to be in the log; its
            phase gates snapshots).
        stats: the driver's counters (appends).
        post: hands a control event to the driver (a successor's transcript fence).
        input_messages: the run input's messages (``fresh`` only).
        fence_seq: the sequence of this claim's fence, when it landed already.
    """

    def __init__(self, deps: "HostDeps", record: runs_pb2.RunRecord, epoch: int, mode: Mode, writer: "LogWriter", *,
                 machine: M.RunMachine, stats: RunStats, post: Callable[[M.Event], bool],
                 input_messages: list[dict[str, Any]] | None = None, fence_seq: int | None = None) -> None:
        self.deps = deps
        self.record = record
        self.run_id = record.run_id
        self.epoch = epoch
        self.mode: Mode = mode
        self.writer = writer
        self.fence_seq = fence_seq
        self.machine = machine
        self.stats = stats
        self._post = post
        self.builder = TranscriptBuilder(input_messages)
        self.input_messages: list[dict[str, Any]] = list(input_messages or [])
        self.inputs_loaded = mode == "fresh"
        #: Whether the log lacks the run input (run.accepted) although an earlier claim
        #: existed (a start that failed half-way): then no agent is launched and no
        #: transcript saved. Known once the stored log was read.
        self.input_missing = False
        #: The driver's replay, once it streams: whether it caught up with the stored log
        #: says whether the builder holds all the log holds.
        self.replay: Replay | None = None
        #: Set when this claim starts being released (the final writes' ``RELEASE`` step):
        #: nothing is written under it after that, so the host may take the run again.
        self.releasing = False
        self._inflight: asyncio.Task[None] | None = None
        self._storage_waits = 0
        self._transcript_rev: int | None = None
        self._transcript_loaded = False
        self._transcript_fenced: TranscriptFenced | None = None
        self._snap_dirty = False

    # --- the fence ------------------------------------------------------------------------

    async def fence(self) -> int:
        """Fence the log for this claim (once), waiting while the log store is full.

        Returns:
            The fence's sequence.

        Raises:
            LogAlreadyClosed: the log is closed (read the close with :meth:`stored_close`).
            RunClaimLost: a higher epoch fenced or closed the log.
            LogStorageFull: the store is full and this host's session is lost.
            LogUnavailable: JetStream did not answer.
        """
        while self.fence_seq is None:
            try:
                self.fence_seq = await self.writer.fence()
            except LogStorageFull as full:
                await self._wait_for_storage(full)
        return self.fence_seq

    async def fence_to_finish(self) -> int:
        """Fence before final writes (a cancel that came before the fence landed), retried
        while the log is unavailable within ``settings.finish_budget``.

        Raises:
            RunClaimLost, LogAlreadyClosed, LogUnavailable: as :meth:`fence` (the last
                once the budget or the session is gone).
        """
        self.fence_seq = await retry_unavailable(
            self.writer.fence, deadline=time.monotonic() + self.deps.settings.finish_budget,
            session=self.deps.session, what=f"run {self.run_id}: fence", errors=(LogUnavailable,))
        return self.fence_seq

    # --- appends --------------------------------------------------------------------------

    async def append(self, chunks: list[Chunk]) -> None:
        """Append the replay's new chunks (origin ``journal``) under the fence; the publish
        itself is shielded from cancellation (:meth:`settle_inflight` decides its fate)."""
        task = asyncio.ensure_future(self.append_now(chunks, "journal"))
        self._inflight = task
        await asyncio.shield(task)

    async def append_host(self, chunks: list[Chunk]) -> None:
        """Append host-origin chunks under the fence (the final writes' ``APPEND`` step)."""
        await self.append_now(chunks, "host")

    async def append_now(self, chunks: list[Chunk], origin: Literal["journal", "host"]) -> None:
        """Append ``chunks``, each exactly once: waits while the store is full, resyncs
        after an ``AppendConflict`` and sends only what did not land.

        Raises:
            RunClaimLost: a successor fenced the log, or 8 conflicts in a row.
            LogStorageFull: the store is full and this host's session is lost.
            LogUnavailable: JetStream did not answer.
        """
        if self.stats.first_append_at is None and self.mode == "attach" and self.deps.settings.quiet_time > 0:
            await asyncio.sleep(self.deps.settings.quiet_time)  # baseline emulation (bench only)
        remaining = list(chunks)
        conflicts = 0
        while conflicts < 8:
            try:
                await self.writer.append(remaining, origin=origin)
                break
            except LogStorageFull as full:
                # Keep the claim and wait for storage: a handover would only
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
        stats = self.stats
        if chunks and stats.first_append_at is None:
            stats.first_append_at = time.monotonic()
            stats.marks["append"] = stats.first_append_at - stats.began
            if self.mode == "attach":
                log.info("run %s: takeover at epoch %d: first append after %s (s since the driver began; "
                         "%d stored chunks replayed)", self.run_id, self.epoch,
                         {k: round(v, 3) for k, v in stats.marks.items()}, stats.stored_prefix)
        stats.appended += len(chunks)
        for c in chunks:
            self.machine.saw_chunk(c)

    async def settle_inflight(self, *, wait: bool) -> None:
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

    async def drop_inflight(self) -> None:
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

    async def close(self, status: str, error: dict[str, str] | None, *, finished_at: float) -> bool:
        """Close the log with ``status`` (the final writes' ``CLOSE`` step).

        Returns:
            False when a successor's fence is there (nothing written).

        Raises:
            LogUnavailable: JetStream did not answer.
        """
        return await self.writer.close(status, error, finished_at=finished_at)  # type: ignore[arg-type]

    # --- the takeover read ----------------------------------------------------------------

    async def stored_close(self, closed: LogAlreadyClosed) -> M.StoredClose:
        """How the log ended, for a fence that met its close record."""
        stored = await self.deps.log.stored_headers(self.run_id)
        rec = next((r for r in reversed(stored) if r.kind == "close"), None)
        return M.StoredClose(closed.status or "completed", getattr(rec, "error", None), getattr(rec, "error_code", None))

    async def stored_before_fence(self) -> tuple[list[Any], dict[int, bytes]]:
        """What the log held before this claim's fence (headers), and the bodies of its
        host-origin chunks when they came along (the run input among them).

        When every chunk's body came along, the writer gets them for its snapshot prime
        (:meth:`LogWriter.take_stored_chunks`), which then reads nothing again."""
        over = self.writer.fenced_over
        if over is None:  # not this writer's fence (cannot happen after the body's fence)
            return await self.deps.log.stored_headers(self.run_id, before=self.fence_seq), {}
        records, bodies = await self.deps.stored_before_fence(self.run_id, over)
        chunks = [r for r in records if r.kind == "chunk"]
        if all(r.offset in bodies for r in chunks):
            self.writer.take_stored_chunks([(r.offset, bodies[r.offset]) for r in chunks])
        return records, {r.offset: bodies[r.offset] for r in chunks if r.origin == "host" and r.offset in bodies}

    async def load_input(self, stored: list[Any], bodies: dict[int, bytes] | None = None) -> None:
        """Read the run input (``run.accepted``) among ``stored``: sets the builder's input,
        :attr:`input_messages` and :attr:`input_missing`.

        Raises:
            LogUnavailable: its body could not be read.
        """
        first_host = next((r for r in stored if r.kind == "chunk" and r.origin == "host"), None)
        found = False
        if first_host is not None:
            raw = (bodies or {}).get(first_host.offset)
            if raw is not None:
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = None
            else:
                body = await self.deps.read_chunk(self.run_id, first_host.offset)
            if isinstance(body, dict) and body.get("name") == RUN_ACCEPTED:
                self.builder.feed(body)  # run.accepted: sets the input messages
                value = body.get("value")
                if isinstance(value, dict) and isinstance(value.get("messages"), list):
                    self.input_messages = list(value["messages"])
                    found = True
        # The StartRun's claim writes run.accepted right after its fence: a log with an
        # earlier claim's records but no run.accepted is a start that failed half-way. An
        # empty log is a record no StartRun wrote (seeded by a tool or the reaper with its
        # agent options only): it still runs, without input messages. (The epoch says
        # nothing here: a reaper's or a refused claim also takes one.)
        self.input_missing = not found and any(r.epoch < self.epoch for r in stored)
        # Marked loaded only now: a body cancelled inside the read above (a cancel seen via
        # WatchRun while a successor is still loading) must let the final writes load the
        # inputs again, else the saved transcript loses the user's messages.
        self.inputs_loaded = True

    async def read_chunk(self, offset: int) -> dict[str, Any] | None:
        """The stored chunk at ``offset`` (one record read), or ``None``.

        Raises:
            LogUnavailable: JetStream did not answer.
        """
        return await self.deps.read_chunk(self.run_id, offset)

    # --- the transcript -------------------------------------------------------------------

    def saw(self, chunk: Chunk) -> None:
        """A replayed chunk (stored or new) is part of the run's conversation."""
        self.builder.feed(chunk)
        self._snap_dirty = True

    def replay_complete(self) -> bool:
        """Whether the builder holds at least what the log holds (else a save would shrink
        the saved transcript below what an earlier host saved)."""
        return self.replay is not None and self.replay.caught_up

    async def see_stored_end(self) -> None:
        """Show the machine the last chunk stored before this claim's fence, so that it knows
        whether the log already ends in a terminal event (``RUN_FINISHED``/``RUN_ERROR``).

        A successor that decides before its replay reached the stored end (a cancel carried
        by its claim, a failure before streaming) must not append after that end (AG-UI:
        nothing follows a terminal event). Chunks this claim appended were shown already.

        Raises:
            LogUnavailable: JetStream did not answer.
        """
        if self.machine.terminal_emitted or self.fence_seq is None:
            return
        stored = await self.deps.log.stored_headers(self.run_id, before=self.fence_seq)
        last = next((r for r in reversed(stored) if r.kind == "chunk"), None)
        if last is None:
            return
        body = await self.deps.read_chunk(self.run_id, last.offset)
        if isinstance(body, dict):
            self.machine.saw_chunk(body)

    async def prepare_transcript(self, sbx: "Sandbox | None") -> None:
        """Make the builder hold what the log holds before the sandbox goes or the transcript
        is saved: rebuild it from the journal (``sbx``) when the replay did not catch up,
        and load the run input when the body stopped before it did.

        Raises:
            LogUnavailable: the run input could not be read (``sbx`` is None).
        """
        if sbx is not None:
            if self.mode != "fresh" and (self.replay is None or not self.replay.caught_up):
                # The replay did not reach the end of what is stored: rebuild the
                # transcript of what clients saw from the journal before it is destroyed.
                await self._rebuild_transcript_from_journal(sbx)
            return
        if not self.inputs_loaded:
            # Stopped before the body loaded the run input (no sandbox to rebuild from, or
            # its journal unreadable): the transcript still starts with the user's messages.
            stored = await self.deps.log.stored_headers(self.run_id, before=self.fence_seq)
            await self.load_input(stored)

    async def _rebuild_transcript_from_journal(self, sbx: "Sandbox") -> None:
        """The transcript of what the log holds (stored prefix), from the journal on disk."""
        try:
            stored = await self.deps.log.stored_headers(self.run_id, before=self.fence_seq)
            if not self.inputs_loaded:
                await self.load_input(stored)
        except (BatonError, OSError):
            return
        from sandbox_host.journal import JournalExit, JournalLine, JournalResume, read_journal

        unreadable = False  # the journal is gone, or a read failed: no transcript from it

        async def lines() -> "AsyncIterator[JournalItem]":
            nonlocal unreadable
            # Read a MiB at a time, never whole (its lines too: sandbox_host/journal.py).
            ended = False  # a sentinel was the last item: the journal's end unless a marker follows
            try:
                async for item in read_journal(sbx.provider, sbx.handle, sbx.handle.journal_path, sbx.nonce):
                    if ended and not isinstance(item, JournalResume):
                        return
                    # An agent process that ended and was resumed (its marker follows) is
                    # not the journal's end.
                    ended = isinstance(item, JournalExit)
                    if isinstance(item, JournalLine):
                        yield item
            except (BatonError, OSError):  # FileNotFoundError included
                unreadable = True

        replay = Replay(self.deps.translator(self.record, self.run_id), stored,
                        yield_every=self.deps.settings.replay_yield_lines)
        builder = TranscriptBuilder(self.input_messages)
        try:
            async with contextlib.aclosing(replay.batches(lines(), complete=False)) as batches:
                async for batch in batches:
                    known = [t.chunk for t in batch.chunks if t.tag == "stored"]
                    for c in known:
                        builder.feed(c)
                        self.machine.saw_chunk(c)
                    if len(known) < len(batch.chunks):
                        break  # caught up: the rest is not in the log
        except JournalReplayDiverged:
            pass
        if not unreadable:
            self.builder = builder

    async def save_transcript_quietly(self) -> None:
        """:meth:`save_transcript`, a failure only logged (a snapshot)."""
        try:
            await self.save_transcript()
        except BatonError as exc:
            reraise_if_cancelling()
            log.warning("run %s: transcript not saved: %s", self.run_id, exc)

    async def save_transcript(self) -> None:
        """Save the builder's transcript, fenced (run id, epoch, run start): a successor's or
        a later run's transcript is never replaced. A run whose input is unknown saves
        nothing (it would replace the thread's transcript with less).

        A later run of the thread having saved is no error: the thread's transcript is that
        run's from then on, so this run saves nothing more but still ends as usual (closes
        its log, writes its status); it is typically a run interrupted by that later one.

        Raises:
            TranscriptFenced: a successor (a higher epoch of this run) saved; this claim
                never saves again and the driver is told to stop (its claim is gone).
            TranscriptConflict: other writers kept saving in between.
            LogUnavailable: JetStream did not answer.
        """
        if self._transcript_fenced is not None:
            if self._transcript_fenced.stored_run_id != self.run_id:
                return
            raise self._transcript_fenced
        if self.input_missing:
            log.warning("run %s: transcript not saved: the run input is missing", self.run_id)
            return
        ts = self.deps.transcripts
        thread = self.record.thread_id
        writer = TranscriptWriter(self.run_id, self.epoch, self.record.started_at, self.record.thread_seq)
        msgs = self.builder.messages()
        for _ in range(8):
            if not self._transcript_loaded:
                _, self._transcript_rev = await ts.load(thread)
                self._transcript_loaded = True
            try:
                self._transcript_rev = await ts.save(thread, msgs, expected_revision=self._transcript_rev,
                                                     writer=writer)
                self._snap_dirty = False
                return
            except TranscriptConflict:
                self._transcript_loaded = False
            except TranscriptFenced as fenced:
                self._transcript_fenced = fenced
                if fenced.stored_run_id != self.run_id:
                    # A later run of the thread: this run's claim is still good.
                    log.info("run %s: transcript not saved: later run %s of the thread saved it",
                             self.run_id, fenced.stored_run_id)
                    return
                self._post(M.ClaimLost(f"transcript@{fenced.stored_epoch}"))
                raise
        raise TranscriptConflict(thread, self._transcript_rev)

    async def snapshots(self) -> None:
        """Save the transcript every ``settings.snapshot_interval`` seconds while the run
        streams, caught up and with something new (runs until cancelled)."""
        interval = self.deps.settings.snapshot_interval
        if interval <= 0:
            return
        while True:
            await asyncio.sleep(interval)
            if self._transcript_fenced is not None:
                return  # a successor saved: this claim never saves again
            if self._snap_dirty and self.machine.phase is M.Phase.STREAMING and self.replay_complete():
                await self.save_transcript_quietly()
