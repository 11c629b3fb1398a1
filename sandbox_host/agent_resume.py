"""An agent process relaunched in its run: it ended while its turn waited on an approval, and
goes on with ``--resume`` in the same sandbox, journal and agent session (docs/hitl.md
"A resumed agent").

The journal of such a run holds each process's part in turn: the first process's lines and
its exit sentinel, then the relaunched wrapper's resume marker
(:class:`~sandbox_host.journal.JournalResume`, written before the new process starts), its
lines and its sentinel, and so on. :func:`journal_with_resumes` follows it as one journal:

- a sentinel followed by a marker is not the end: it is dropped (with a fragment the dead
  process left before it), and the marker is reported to ``on_resume`` (the new process's
  inbox; the input desk's :meth:`~sandbox_host.run_inputs.InputDesk.restarted`);
- a sentinel with nothing after it asks ``wanted(attempt)`` whether to relaunch (the driver
  decides from its input desk, :func:`should_relaunch`) and then ``relaunch(attempt)``; a
  successor that replays the journal meets the same sentinel and the same marker, or, when
  its predecessor died between the sentinel and the relaunch, decides the same itself;
- anything else after a sentinel ends the journal there, as before.

A relaunch that is still starting (processes alive, no marker yet) is waited for, never
launched a second time.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, AsyncGenerator, Awaitable, Callable

from sandbox_host.agents import RESUME_PROMPT
from sandbox_host.journal import (
    JournalExit, JournalItem, JournalResume, JournalTruncated, follow_journal, parse_resume,
)

if TYPE_CHECKING:
    from sandbox_host.run_inputs import InputDesk
    from sandbox_host.providers import Sandbox

#: Agent processes a run may relaunch (after the first), so an agent that dies at once on
#: every start does not loop.
MAX_AGENT_RESUMES = 3
__all__ = ["MAX_AGENT_RESUMES", "RESUME_PROMPT", "journal_with_resumes", "should_relaunch"]

#: Seconds a relaunch that is still starting (processes alive, no marker) is waited for.
STARTING_WAIT = 10.0


def should_relaunch(desk: "InputDesk | None", attempt: int) -> bool:
    """Whether to relaunch the agent as process number ``attempt`` (2 for the first
    relaunch): its turn waited on an approval (:meth:`InputDesk.resume_wanted`) and the run
    has relaunches left (:data:`MAX_AGENT_RESUMES`)."""
    return desk is not None and attempt <= MAX_AGENT_RESUMES + 1 and desk.resume_wanted()


_MARKER_READ = 8192  # bytes read after a sentinel: a resume marker is shorter (its inbox a path)


async def _after_sentinel(sbx: "Sandbox", end: int) -> bool | None:
    """What follows a sentinel: ``True`` a resume marker, ``False`` another line, ``None``
    nothing yet (or a line still being written)."""
    data = await sbx.provider.read_file(sbx.handle, sbx.handle.journal_path, end, _MARKER_READ)
    line, nl, _ = data.partition(b"\n")
    if not nl:
        return False if len(data) >= _MARKER_READ else None  # (longer than any marker)
    return parse_resume(line.rstrip(b"\r"), sbx.nonce) is not None


async def _goes_on(sbx: "Sandbox", item: JournalExit, attempt: int, wanted: Callable[[int], bool],
                   relaunch: Callable[[int], Awaitable[bool]], poll: float) -> bool:
    """Whether the journal goes on after the sentinel ``item`` (see the module docstring).

    ``wanted`` is decided from the journal before the sentinel alone, so it is the same on
    every host: where it says no, no host relaunched, and a run that simply ended reads
    nothing more."""
    if not wanted(attempt):
        return False
    after = await _after_sentinel(sbx, item.end)
    if after is not None:
        return after
    deadline = time.monotonic() + STARTING_WAIT
    while await sbx.provider.processes_alive(sbx.handle) and time.monotonic() < deadline:
        # The ended process's wrapper is still exiting, or a relaunch is under way (a
        # predecessor's, just before a takeover): its marker comes first.
        await asyncio.sleep(poll)
        after = await _after_sentinel(sbx, item.end)
        if after is not None:
            return after
    return await relaunch(attempt)


async def journal_with_resumes(
    sbx: "Sandbox",
    *,
    poll_interval: float,
    wanted: Callable[[int], bool],
    relaunch: Callable[[int], Awaitable[bool]],
    on_resume: Callable[[JournalResume], None],
    on_lag: Callable[[int], None] | None = None,
) -> AsyncGenerator[JournalItem, None]:
    """The run's journal from byte 0 across its agent processes (see the module docstring).

    Args:
        sbx: the run's sandbox (its handle's journal path and the sentinel nonce).
        poll_interval: as :func:`~sandbox_host.journal.follow_journal`'s.
        wanted: at a sentinel nothing follows, whether to relaunch the agent as process
            number ``attempt`` (:func:`should_relaunch`); it is asked first, so a run that
            simply ends waits for nothing.
        relaunch: then called with that number once the ended process is gone; returns
            whether it relaunched the agent (the journal then goes on).
        on_resume: called for each resume marker, before the new process's lines.
        on_lag: the journal's lag in bytes at each read, as
            :func:`~sandbox_host.journal.follow_journal` reports it.

    Yields:
        ``JournalLine`` items, and at the end ``JournalTruncated`` / ``JournalExit`` as
        :func:`~sandbox_host.journal.follow_journal` does.
    """
    offset = 0
    attempt = 1
    while True:
        held: JournalTruncated | None = None
        went_on = False
        async with contextlib.aclosing(follow_journal(sbx.provider, sbx.handle, sbx.handle.journal_path,
                                                      offset=offset, nonce=sbx.nonce,
                                                      poll_interval=poll_interval, on_lag=on_lag)) as items:
            async for item in items:
                if isinstance(item, JournalResume):
                    attempt = max(attempt, item.attempt)
                    on_resume(item)
                    continue
                if isinstance(item, JournalTruncated):
                    held = item  # a fragment comes right before a sentinel or at the end
                    continue
                if isinstance(item, JournalExit) and await _goes_on(sbx, item, attempt + 1, wanted, relaunch,
                                                                         poll_interval):
                    offset, went_on = item.end, True
                    break
                if held is not None:
                    yield held
                    held = None
                yield item
        if not went_on:
            if held is not None:
                yield held
            return
