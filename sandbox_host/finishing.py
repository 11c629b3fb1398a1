"""Finishing a run: the final writes of a decision, as a duty (docs/design.md §5.5, CONVENTIONS).

The end of a run is a duty, not a hope. A decision's final writes are steps, in this order:

1. ``KILL``: stop the agent, rebuild the transcript from its journal if the replay did not
   catch up, destroy the sandbox (a cancel states what it confirmed in ``run.cancelled``);
2. ``APPEND``: the host chunks (``run.cancelled``, ``RUN_ERROR``), fenced by the log;
3. ``TRANSCRIPT``: the saved transcript, fenced by the transcript fence;
4. ``CLOSE``: the log's close record, fenced by the log head. Readers get the end here,
   so it comes before the record: a successor that finds a closed log finalizes the record
   from the close record (``LogAlreadyClosed`` → ``StoredClose``), while a terminal record
   over an open log could never be closed by anyone (a terminal run is not attached);
5. ``STATUS``: the record's final status (owner write, fenced by the claim);
6. ``RELEASE``: the claim (the driver is ``releasing`` from here on: it writes nothing to the
   log or the record any more, so the host may take the run again);
7. ``DESTROY``: the sandbox (unless kept) and the run's leftover sandboxes (docs/design.md §5.5:
   after the release).

Each step is idempotent and retried while the store or the log is unavailable, within one
budget (``settings.finish_budget`` seconds) that never outlives the session. When a step
cannot be done the run is let go: if the log is not final yet the sandbox is kept and only
the claim is released, so another owner replays the journal and finishes from what is
stored; the release is retried as long as the session lives (the claim lives no longer).
A step refused by a fence means a successor owns the run: nothing more is written.

:func:`plan` and :func:`after` are the pure part (table-tested); :class:`Finisher` is the I/O,
over the claim's :class:`~sandbox_host.claim_log.ClaimLog`, its
:class:`~sandbox_host.sandboxes.RunSandboxes` and the host's coordinator client.

Work on a sandbox after its agent ended and before it is destroyed goes in ``KILL``, between
the kill and the destroy (cancels and failures), or, for a run whose agent ended on its own
(the sandbox goes in ``DESTROY``, after the release), in a step of its own before ``CLOSE``,
while the claim still fences its writes.
"""
from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Literal, TypeVar

from baton.errors import (
    LogAlreadyClosed, LogUnavailable, RunClaimLost, SandboxError, StoreUnavailable, TranscriptConflict,
    TranscriptFenced, WorkspaceError,
)
from baton.runs import RUN_CANCELLED, STATUS_TO_PB, TERMINAL
from baton.v1 import runs_pb2
from sandbox_host import machine as M
from sandbox_host._tasks import reraise_if_cancelling, retry_unavailable

if TYPE_CHECKING:
    from sandbox_host.claim_log import ClaimLog
    from sandbox_host.deps import HostDeps
    from sandbox_host.providers import Sandbox
    from sandbox_host.sandboxes import RunSandboxes

log = logging.getLogger("baton.sandbox_host.driver")

T = TypeVar("T")
Outcome = Literal["done", "gave-up", "fenced", "claim-lapsed"]
__all__ = ["Finisher", "Outcome", "Plan", "Step", "after", "plan"]


class Step(enum.Enum):
    """One final write (in the order they run)."""

    KILL = "kill"
    APPEND = "append"
    TRANSCRIPT = "transcript"
    WORKSPACE = "workspace"
    CLOSE = "close"
    STATUS = "status"
    RELEASE = "release"
    DESTROY = "destroy"


ORDER = tuple(Step)


@dataclass(frozen=True)
class Plan:
    """The steps of one decision.

    Attributes:
        steps: the steps to do, in :data:`ORDER`.
        log_final: the log already ends with a close record (a ``StoredClose`` decision),
            so the run's end is durable before any step.
    """

    steps: tuple[Step, ...]
    log_final: bool = False


def plan(d: M.Decision, *, save_transcript: bool, snapshot: bool = False) -> Plan:
    """The steps of decision ``d``.

    Args:
        d: a decision that stops the run.
        save_transcript: the transcript may be saved (``d.save_transcript`` and the run's
            input is known: a transcript without it would replace the thread's with less).
        snapshot: the run is a thread's turn whose workspace is snapshotted at its end
            (``WORKSPACE``, before the close: a client that sees the end and sends the
            thread's next message finds the head moved). A killed agent's sandbox is
            snapshotted in ``KILL``, before it is destroyed.

    Returns:
        The :class:`Plan`; empty for a decision that writes nothing (claim or session lost).
    """
    log_final = d.terminal and d.close is None
    steps: list[Step] = []
    if d.kill_agent:
        steps.append(Step.KILL)
    if d.append:
        steps.append(Step.APPEND)
    if save_transcript and (d.terminal or d.release_claim):  # never for a claim lost
        steps.append(Step.TRANSCRIPT)
    if snapshot and save_transcript and d.terminal and d.close is not None and not d.kill_agent:
        steps.append(Step.WORKSPACE)
    if d.close is not None:
        steps.append(Step.CLOSE)
    if d.status is not None:
        steps.append(Step.STATUS)
    if d.release_claim:
        steps.append(Step.RELEASE)
    if d.terminal and (d.sandbox == "destroy" or d.close is not None or log_final):
        steps.append(Step.DESTROY)
    return Plan(tuple(steps), log_final)


def after(p: Plan, step: Step, outcome: Outcome) -> tuple[Step, ...]:
    """The steps left once ``step`` ended with ``outcome``.

    * ``done``: the rest of the plan.
    * ``fenced``: a successor's fence, close or transcript refused the write: the run is
      theirs, nothing more is written (not even a release: the claim is gone).
    * ``claim-lapsed``: the final status was refused because this claim lapsed (lease),
      after this claim closed the log: the run's end is durable, so the sandbox is still
      removed; there is no claim to release.
    * ``gave-up``: the step could not be done within the budget. Before the log is final
      the run is let go: only the release is left (the sandbox stays for the successor's
      replay). Once the log is final the rest still runs (the successor finalizes the
      record from the close record).
    """
    rest = p.steps[p.steps.index(step) + 1:]
    if outcome == "done":
        return rest
    if outcome == "fenced":
        return ()
    if outcome == "claim-lapsed":
        return tuple(s for s in rest if s is not Step.RELEASE)
    log_final = p.log_final or (Step.CLOSE in p.steps and ORDER.index(step) > ORDER.index(Step.CLOSE))
    if log_final:
        return rest
    return (Step.RELEASE,) if step is not Step.RELEASE else ()


class Finisher:
    """Carries out one decision's final writes for one claim (see the module docstring).

    Args:
        d: the decision (it stops the run).
        claim_log: the claim's log and transcript (appends, transcript, close).
        sandboxes: the claim's sandboxes (kill, destroy).
        deps: the host's coordinator client (status, release), session and settings.
        save_transcript: whether the transcript may be saved.
        release_delay: seconds to wait before a hand-over's release (so a cluster-wide
            outage does not turn failover into a hot loop).
    """

    def __init__(self, d: M.Decision, *, claim_log: "ClaimLog", sandboxes: "RunSandboxes", deps: "HostDeps",
                 save_transcript: bool, release_delay: float = 0.0) -> None:
        self.log = claim_log
        self.sandboxes = sandboxes
        self.deps = deps
        self.run_id = claim_log.run_id
        self.epoch = claim_log.epoch
        self.d = d
        self.snapshot = bool(sandboxes.record.turn_json) and deps.workspaces is not None
        self.plan = plan(d, save_transcript=save_transcript, snapshot=self.snapshot)
        self._save_transcript = save_transcript
        self.release_delay = release_delay
        self.deadline = time.monotonic() + deps.settings.finish_budget
        self.outcomes: dict[Step, Outcome] = {}
        self._process_gone: bool | None = True
        self._destroyed = True
        self._finished_at: float | None = None  # one value for the close record and the record

    async def finish(self) -> dict[Step, Outcome]:
        """Do the plan's steps; never raises a domain error.

        Returns:
            Each step that ran → its outcome (steps skipped after a let-go are absent).
        """
        todo = self.plan.steps
        while todo:
            step, todo = todo[0], todo[1:]
            outcome = await self._do(step)
            self.outcomes[step] = outcome
            if outcome != "done":
                todo = after(self.plan, step, outcome)
                level = logging.INFO if outcome == "fenced" else logging.WARNING
                log.log(level, "run %s: %s %s; left: %s", self.run_id, step.value, outcome,
                        [s.value for s in todo] or "nothing")
        return self.outcomes

    async def _do(self, step: Step) -> Outcome:
        try:
            outcome: Outcome = await getattr(self, f"_{step.value}")()
            return outcome
        except (StoreUnavailable, LogUnavailable, TranscriptConflict) as exc:
            reraise_if_cancelling()
            log.warning("run %s: %s not done within the budget: %s", self.run_id, step.value, exc)
            return "gave-up"
        except RunClaimLost as exc:
            log.info("run %s: %s refused: %s", self.run_id, step.value, exc)
            return "claim-lapsed" if step is Step.STATUS else "fenced"
        except (LogAlreadyClosed, TranscriptFenced) as exc:
            log.info("run %s: %s refused: %s", self.run_id, step.value, exc)
            return "fenced"
        except Exception:  # a bug must not leave the run claimed and unfinished: let go
            log.exception("run %s: %s failed", self.run_id, step.value)
            return "gave-up"

    async def _retry(self, op: Callable[[], Awaitable[T]], what: str, *, until_session_lost: bool = False) -> T:
        return await retry_unavailable(op, deadline=None if until_session_lost else self.deadline,
                                       session=self.deps.session, what=f"run {self.run_id}: {what}",
                                       errors=(StoreUnavailable, LogUnavailable))

    # --- steps ------------------------------------------------------------------------

    async def _kill(self) -> Outcome:
        sandboxes = self.sandboxes
        try:
            sbx = await self._retry(sandboxes.find, "finding the sandbox")
        except StoreUnavailable:
            sbx = None  # unknown: the cancel says nothing was confirmed
            self._process_gone, self._destroyed = None, False
        if sbx is not None:
            try:
                self._process_gone = await sandboxes.kill(sbx)
            except (SandboxError, OSError) as exc:
                log.error("run %s: agent not killed: %r", self.run_id, exc)
                self._process_gone = False
            # The agent ended and its sandbox still exists: what must be read from it
            # (the journal, for the transcript) is read here, before it goes.
            await self.log.prepare_transcript(sbx)
            if self.snapshot and self._save_transcript and self.d.terminal:
                await self._snapshot(sbx)
            try:
                self._destroyed = await sandboxes.destroy(sbx)
            except StoreUnavailable:
                self._destroyed = sbx.destroyed  # the registry entry goes in DESTROY
            except (SandboxError, OSError) as exc:
                log.error("run %s: sandbox not destroyed: %r", self.run_id, exc)
                self._destroyed = False
        return "done"

    async def _append(self) -> Outcome:
        chunks = list(self.d.append)
        if chunks:
            # Decided before the replay showed the stored end (a successor's cancel or
            # failure): a log that already ends in a terminal event gets nothing after it.
            await self._retry(self.log.see_stored_end, "reading the stored end")
            if self.log.machine.terminal_emitted:
                log.info("run %s: its log already holds its end; nothing appended after it", self.run_id)
                return "done"
        if chunks and chunks[0].get("name") == RUN_CANCELLED:
            chunks[0] = M.cancelled_chunk(reason=chunks[0]["value"]["reason"], process_gone=self._process_gone,
                                          sandbox_destroyed=self._destroyed)
        # One chunk per attempt: a retried append never sends a chunk that landed again.
        for c in chunks:
            await self._retry(lambda c=c: self.log.append_host([c]), "appending")  # type: ignore[misc]
        return "done"

    async def _transcript(self) -> Outcome:
        await self._retry(lambda: self.log.prepare_transcript(None), "loading the run input")
        await self._retry(self.log.save_transcript, "saving the transcript")
        return "done"

    async def _workspace(self) -> Outcome:
        sbx = await self._retry(self.sandboxes.find, "finding the sandbox")
        await self._snapshot(sbx)
        return "done"

    async def _snapshot(self, sbx: "Sandbox | None") -> None:
        """The turn's workspace snapshot; never fails the run's end: a snapshot that cannot be
        taken leaves the thread's head where it was (the next turn starts where this one did)."""
        from sandbox_host import turns

        sandboxes = self.sandboxes
        messages = len(self.log.builder.messages())
        try:
            await self._retry(lambda: turns.snapshot_turn(self.deps, sandboxes.record, self.epoch, sbx, messages),
                              "snapshotting the workspace")
        except (LogUnavailable, StoreUnavailable, WorkspaceError, SandboxError, OSError) as exc:
            reraise_if_cancelling()
            log.error("run %s: workspace not snapshotted: %r", self.run_id, exc)
        except Exception:  # a bug here must not keep the run from ending (its log from closing)
            reraise_if_cancelling()
            log.exception("run %s: workspace not snapshotted", self.run_id)

    def _finish_time(self) -> float:
        """When the run finished: the time of the first final write that states it."""
        if self._finished_at is None:
            self._finished_at = time.time()
        return self._finished_at

    async def _close(self) -> Outcome:
        d = self.d
        assert d.close is not None
        status = d.close
        err = {"message": d.error[0], "code": d.error[1]} if d.error else None
        finished_at = self._finish_time()
        landed = await self._retry(lambda: self.log.close(status, err, finished_at=finished_at), "closing the log")
        return "done" if landed else "fenced"

    async def _status(self) -> Outcome:
        d, deps = self.d, self.deps
        assert d.status is not None
        fields: dict[str, Any] = {"status": STATUS_TO_PB[d.status]}
        paths = ["status"]
        if d.status in TERMINAL:
            fields["finished_at"] = self._finish_time()
            paths.append("finished_at")
        if d.error is not None:
            fields["error"] = runs_pb2.RunError(message=d.error[0], code=d.error[1])
            paths.append("error")
        rec = runs_pb2.RunRecord(**fields)
        await self._retry(lambda: deps.cc.update_run(self.run_id, rec, paths=paths, epoch=self.epoch,
                                                     session_id=deps.session.id), "final status")
        return "done"

    async def _destroy(self) -> Outcome:
        sandboxes, d = self.sandboxes, self.d
        sbx = await self._retry(sandboxes.find, "finding the sandbox")
        if d.sandbox == "destroy" and sbx is not None:
            try:
                await self._retry(lambda: sandboxes.destroy(sbx), "removing the sandbox")
            except (SandboxError, OSError) as exc:
                log.error("run %s: sandbox %s not destroyed: %r", self.run_id, sbx.handle.key, exc)
        # The run is final: no sandbox of it but a kept one has a use any more.
        keep = sbx.handle.key if sbx is not None and not sbx.destroyed else None
        with contextlib.suppress(SandboxError, OSError):
            await sandboxes.destroy_leftovers(keep)
        return "done"

    async def _release(self) -> Outcome:
        deps = self.deps
        if self.release_delay:
            await asyncio.sleep(self.release_delay)
        # From here on this claim writes nothing: the host may take the run again.
        self.log.releasing = True
        await self._retry(lambda: deps.cc.release_claim(self.run_id, deps.session, self.epoch),
                          "releasing the claim", until_session_lost=True)
        return "done"
