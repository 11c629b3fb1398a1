"""The transcript duty of a :class:`~sandbox_host.driver.RunDriver` (docs/design.md §4.2, §5.5).

The driver's builder holds the conversation of what its run's log holds (stored prefix
and new chunks); these methods make it whole before the final writes (rebuilt from the
journal when the replay did not catch up), save it fenced by run id, epoch and run start,
and save snapshots while the run streams. They belong to the driver (a mixin: they read
and set its state), kept here so ``driver.py`` stays about supervising and streaming.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from baton.errors import BatonError, JournalReplayDiverged, TranscriptConflict, TranscriptFenced
from baton.log import TranscriptWriter
from baton.transcript import TranscriptBuilder
from sandbox_host import machine as M
from sandbox_host._tasks import reraise_if_cancelling
from sandbox_host.align import Aligner
from sandbox_host.driver_state import DriverState
from sandbox_host.sandboxes import Sandbox

log = logging.getLogger("baton.sandbox_host.driver")  # the driver's logger: its lines, as before the split

__all__ = ["TranscriptSteps"]


class TranscriptSteps(DriverState):
    """The driver's transcript methods (mixed into ``RunDriver``, after ``StoredReads``)."""

    if TYPE_CHECKING:
        async def _load_input_messages(self, stored: list[Any], bodies: dict[int, bytes] | None = None) -> None: ...

    async def prepare_transcript(self, sbx: Sandbox | None) -> None:
        """Make the builder hold what the log holds before the sandbox goes or the transcript
        is saved: rebuild it from the journal (``sbx``) when the replay did not catch up,
        and load the run input when the body stopped before it did.

        Raises:
            LogUnavailable: the run input could not be read (``sbx`` is None).
        """
        if sbx is not None:
            if self.mode != "fresh" and (self._aligner is None or not self._aligner.caught_up):
                # The replay did not reach the end of what is stored: rebuild the
                # transcript of what clients saw from the journal before it is destroyed.
                await self._rebuild_transcript_from_journal(sbx)
            return
        if not self._inputs_loaded:
            # Stopped before the body loaded the run input (no sandbox to rebuild from, or
            # its journal unreadable): the transcript still starts with the user's messages.
            stored = await self.deps.log.stored_headers(self.run_id, before=self.fence_seq)
            await self._load_input_messages(stored)

    async def _rebuild_transcript_from_journal(self, sbx: Sandbox) -> None:
        """The transcript of what the log holds (stored prefix), from the journal on disk."""
        try:
            stored = await self.deps.log.stored_headers(self.run_id, before=self.fence_seq)
            if not self._inputs_loaded:
                await self._load_input_messages(stored)
            data = await sbx.provider.read_file(sbx.handle, sbx.handle.journal_path)
        except (FileNotFoundError, BatonError, OSError):
            return
        aligner = Aligner(stored)
        builder = TranscriptBuilder(self.input_messages)
        translator = self.deps.translator(self.record, self.run_id)
        from sandbox_host.journal import LineSplitter, parse_sentinel

        done = False
        every = self.deps.settings.replay_yield_lines
        for n, line in enumerate(LineSplitter().feed(data), 1):
            if done or parse_sentinel(line.data, sbx.nonce) is not None:
                break
            if every and n % every == 0:
                await asyncio.sleep(0)  # the whole journal in memory: let the loop run (see _stream)
            for c in translator.feed(line.data):
                if aligner.caught_up:
                    done = True
                    break
                try:
                    aligner.feed(c)
                except JournalReplayDiverged:
                    done = True
                    break
                builder.feed(c)
                self.machine.saw_chunk(c)
        self.builder = builder

    def _replay_complete(self) -> bool:
        """Whether the builder holds at least what the log holds (else a save would shrink
        the saved transcript below what an earlier host saved)."""
        return self._aligner is not None and self._aligner.caught_up

    async def _save_transcript_quietly(self) -> None:
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
            TranscriptFenced: a successor (a higher epoch of this run) saved; this driver
                never saves again and stops (its claim is gone).
            TranscriptConflict: other writers kept saving in between.
            LogUnavailable: JetStream did not answer.
        """
        if self._transcript_fenced is not None:
            if self._transcript_fenced.stored_run_id != self.run_id:
                return
            raise self._transcript_fenced
        if self._input_missing:
            log.warning("run %s: transcript not saved: the run input is missing", self.run_id)
            return
        ts = self.deps.transcripts
        thread = self.record.thread_id
        writer = TranscriptWriter(self.run_id, self.epoch, self.record.started_at)
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
                self.post(M.ClaimLost(f"transcript@{fenced.stored_epoch}"))
                raise
        raise TranscriptConflict(thread, self._transcript_rev)

    async def _snapshots(self) -> None:
        interval = self.deps.settings.snapshot_interval
        if interval <= 0:
            return
        while True:
            await asyncio.sleep(interval)
            if self._transcript_fenced is not None:
                return  # a successor saved: this driver never saves again
            if self._snap_dirty and self.machine.phase is M.Phase.STREAMING and self._replay_complete():
                await self._save_transcript_quietly()
