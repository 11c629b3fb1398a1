"""The run state machine (docs/design.md §5.5) as pure transitions.

The driver (``sandbox_host/driver.py``) does the I/O; this module decides what a run's
events mean: which status the record gets, which host chunks are appended, whether the log
is closed, whether the sandbox is kept and whether the agent is killed. Every row of the
table in docs/design.md §5.5 is a case of :func:`decide`, so the table is unit-tested without
servers.

| Event | sandbox | record | delivery log |
|---|---|---|---|
| last reader leaves, no cancel | kept | running, detached_since stamped | open |
| cancel (either path) | destroyed, always | aborted + finished_at | run.cancelled, RUN_ERROR cancelled, close |
| host dies | kept | running | open; successor continues |
| agent exits 0 with a terminal line | destroyed (unless keep-alive) | completed | RUN_FINISHED, close |
| agent fails / journal truncated | destroyed | failed + error | RUN_ERROR, close |
| interrupt (HITL) | kept | interrupted | RUN_FINISHED outcome interrupt, close |
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from baton.runs import RUN_ACCEPTED, RUN_CANCELLED

Chunk = dict[str, Any]
SandboxFate = Literal["keep", "destroy", "untouched"]
CancelPath = Literal["watch", "fast", "detach", "reaper", "interrupt"]


class Phase(enum.Enum):
    """Where a driven run is."""

    CLAIMED = "claimed"        # claim held, fence not yet landed
    FENCED = "fenced"          # fence landed
    PREPARING = "preparing"    # building the sandbox (fresh) or preflight + replay (attach)
    STREAMING = "streaming"    # following the journal, appending new chunks
    CANCELLING = "cancelling"  # killing the agent and destroying the sandbox
    FINISHING = "finishing"    # final writes (transcript, status, close)
    DONE = "done"              # terminal writes done, claim released
    STOPPED = "stopped"        # stopped without terminal writes (claim lost, drain, session lost)


TERMINAL_PHASES = frozenset({Phase.DONE, Phase.STOPPED})


# --- events -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Detached:
    """The last reader left (the coordinator stamped ``detached_since``).

    ``cancel_on_disconnect``: the run was started to be cancelled, not detached, then.
    """

    cancel_on_disconnect: bool


@dataclass(frozen=True)
class CancelRequested:
    """A cancel reached the driver (record flag via WatchRun, or the in-process fast path)."""

    reason: str = "user"
    path: CancelPath = "watch"


@dataclass(frozen=True)
class AgentTerminal:
    """The translator emitted the run's terminal chunk (``RUN_FINISHED`` or ``RUN_ERROR``)."""

    chunk: Chunk


@dataclass(frozen=True)
class StoredTerminal:
    """Alignment met a stored journal-origin terminal chunk (the old host appended it but
    did not close the log). It is interpreted before it is dropped (docs/design.md §5.5)."""

    chunk: Chunk


@dataclass(frozen=True)
class StoredClose:
    """The log already ends with a ``close`` record: finalize the record from it."""

    status: str
    error_message: str | None = None
    error_code: str | None = None


@dataclass(frozen=True)
class Diverged:
    """Alignment failed (``JournalReplayDiverged``)."""

    index: int
    thread_id_only: bool = False


@dataclass(frozen=True)
class ClaimLost:
    """A successor's fence or close was found, or the claim key is gone."""

    observed: str


@dataclass(frozen=True)
class Drain:
    """The host is draining (SIGTERM): hand the run over."""


@dataclass(frozen=True)
class SessionLost:
    """The host's session lease expired: another host owns the run now."""


@dataclass(frozen=True)
class Failed:
    """The driver could not go on (sandbox build failed, attach preflight failed, ...)."""

    message: str
    code: str


Event = Union[Detached, CancelRequested, AgentTerminal, StoredTerminal, StoredClose, Diverged,
              ClaimLost, Drain, SessionLost, Failed]


# --- decisions ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What the driver must do for an event.

    Attributes:
        status: record status to write (``None``: no status write).
        error: ``(message, code)`` for the record, or ``None``.
        append: host-origin chunks to append before closing (in order).
        close: status carried by the ``close`` record, or ``None`` for no close.
        kill_agent: SIGTERM → grace → SIGKILL the agent's process group first.
        sandbox: ``destroy``, ``keep`` or ``untouched`` (the driver stops without deciding).
        save_transcript: save the transcript before the status write.
        release_claim: release the claim (after the terminal writes, or to hand over).
        stop: the driver stops following the journal.
        terminal: the decision ends the run (status terminal or interrupted + close).
    """

    status: str | None = None
    error: tuple[str, str] | None = None
    append: tuple[Chunk, ...] = ()
    close: str | None = None
    kill_agent: bool = False
    sandbox: SandboxFate = "untouched"
    save_transcript: bool = False
    release_claim: bool = False
    stop: bool = False
    terminal: bool = False
    notes: tuple[str, ...] = field(default=())


CONTINUE = Decision()


def terminal_outcome(chunk: Chunk) -> tuple[str, tuple[str, str] | None]:
    """The record status (and error) a translator terminal chunk means.

    Returns:
        ``("completed", None)`` for ``RUN_FINISHED``; ``("interrupted", None)`` for
        ``RUN_FINISHED`` with ``outcome.type == "interrupt"``; ``("aborted", …)`` for
        ``RUN_FINISHED`` with outcome ``cancelled``; ``("failed", (message, code))`` for
        ``RUN_ERROR``.

    Raises:
        ValueError: for a chunk that is not a terminal.
    """
    t = chunk.get("type")
    if t == "RUN_FINISHED":
        outcome = chunk.get("outcome")
        kind = outcome.get("type") if isinstance(outcome, dict) else None
        if kind == "interrupt":
            return "interrupted", None
        if kind == "cancelled":
            return "aborted", ("agent reported the run cancelled", "cancelled")
        return "completed", None
    if t == "RUN_ERROR":
        return "failed", (str(chunk.get("message") or "run failed"), str(chunk.get("code") or "agent_error"))
    raise ValueError(f"not a terminal chunk: {t!r}")


def is_terminal_chunk(chunk: Chunk) -> bool:
    """Whether ``chunk`` ends a run (``RUN_FINISHED`` or ``RUN_ERROR``)."""
    return chunk.get("type") in ("RUN_FINISHED", "RUN_ERROR")


def cancelled_chunk(*, reason: str, process_gone: bool | None, sandbox_destroyed: bool) -> Chunk:
    """The ``CUSTOM run.cancelled`` chunk stating what was confirmed.

    Args:
        reason: why the cancel was requested (``user``, ``reaped``, ...).
        process_gone: the agent's processes are confirmed gone (``None``: the provider
            cannot tell, e.g. it cannot kill; destroying the sandbox is the cancel).
        sandbox_destroyed: the sandbox is confirmed destroyed (or was never built).
    """
    return {"type": "CUSTOM", "name": RUN_CANCELLED,
            "value": {"reason": reason, "processGone": process_gone, "sandboxDestroyed": sandbox_destroyed}}


def accepted_chunk(run_id: str, thread_id: str, agent: str | None, messages: list[dict[str, Any]],
                   previous_turn_lost: dict[str, str] | None = None) -> Chunk:
    """The ``CUSTOM run.accepted`` chunk (origin host) a fresh start appends first.

    It carries the run input's messages, so a successor host can rebuild the transcript
    (docs/design.md §4.2) from the log alone, and launch the agent with its input; and, for
    a thread's run whose previous turn could not be saved, ``previousTurnLost`` (``{runId,
    reason}``): this run starts from the turn before it.
    """
    value: dict[str, Any] = {"runId": run_id, "threadId": thread_id, "agent": agent or None, "messages": messages}
    if previous_turn_lost:
        value["previousTurnLost"] = {"runId": previous_turn_lost.get("run", ""),
                                     "reason": previous_turn_lost.get("reason", "")}
    return {"type": "CUSTOM", "name": RUN_ACCEPTED, "value": value}


def run_error_chunk(message: str, code: str) -> Chunk:
    """A host-origin ``RUN_ERROR`` chunk."""
    return {"type": "RUN_ERROR", "message": message, "code": code}


def divergence_message(index: int) -> str:
    """The exact text of the divergence ``RUN_ERROR`` (docs/design.md §5.4)."""
    return f"journal replay diverged at index {index}"


def agent_end(chunk: Chunk, *, cancel_requested: bool, cancel_reason: str = "") -> Event:
    """The event an agent's terminal chunk leads to, once it is stored (docs/design.md §5.5).

    The driver reads the record after the chunk is stored and before it decides, so a
    cancel whose flag landed before the run's end was stored is carried out even when
    neither ``WatchRun`` nor the fast path brought it in time; a flag that lands after
    the read came after the terminal chunk was stored, and the run keeps that outcome.

    Args:
        chunk: the translator's terminal chunk (``RUN_FINISHED`` or ``RUN_ERROR``), stored.
        cancel_requested: the record's ``cancel_requested`` as read after the chunk was stored.
        cancel_reason: the record's ``cancel_reason`` (``user`` when empty).

    Returns:
        :class:`CancelRequested` when the flag was set, else :class:`AgentTerminal`.
    """
    if cancel_requested:
        return CancelRequested(reason=cancel_reason or "user", path="watch")
    return AgentTerminal(chunk)


def decide(event: Event, *, keep_sandbox: bool = False, terminal_emitted: bool = False) -> Decision:
    """The decision for one event (docs/design.md §5.5).

    Args:
        event: what happened.
        keep_sandbox: the run asked to keep its sandbox after a successful finish.
        terminal_emitted: the run's log already holds a terminal chunk (``RUN_FINISHED`` or
            ``RUN_ERROR``), so no further AG-UI chunk may be appended (nothing after
            ``RUN_ERROR`` — AG-UI verify rules); a cancel then only confirms via close.

    Returns:
        The :class:`Decision`; the host-origin chunks in it lack only the confirmation
        values of ``run.cancelled``, which the driver fills in with :func:`cancelled_chunk`.
    """
    if isinstance(event, Detached):
        if not event.cancel_on_disconnect:
            return CONTINUE
        return decide(CancelRequested(reason="disconnected", path="detach"), terminal_emitted=terminal_emitted)
    if isinstance(event, CancelRequested):
        appended: tuple[Chunk, ...] = () if terminal_emitted else (
            cancelled_chunk(reason=event.reason, process_gone=True, sandbox_destroyed=True),
            run_error_chunk(f"run cancelled ({event.reason})", "cancelled"),
        )
        return Decision(status="aborted", error=(f"run cancelled ({event.reason})", "cancelled"),
                        append=appended, close="aborted", kill_agent=True, sandbox="destroy",
                        save_transcript=True, release_claim=True, stop=True, terminal=True)
    if isinstance(event, (AgentTerminal, StoredTerminal)):
        status, error = terminal_outcome(event.chunk)
        if status == "interrupted":
            fate: SandboxFate = "keep"
        elif status == "completed":
            fate = "keep" if keep_sandbox else "destroy"
        else:
            fate = "destroy"
        return Decision(status=status, error=error, close=status, sandbox=fate,
                        save_transcript=True, release_claim=True, stop=True, terminal=True)
    if isinstance(event, StoredClose):
        error = (event.error_message or event.status, event.error_code or event.status) \
            if event.status in ("failed", "aborted") else None
        fate = "keep" if event.status == "interrupted" or (event.status == "completed" and keep_sandbox) else "destroy"
        return Decision(status=event.status, error=error, sandbox=fate, release_claim=True,
                        stop=True, terminal=True, save_transcript=False)
    if isinstance(event, Diverged):
        msg = divergence_message(event.index)
        code = "journal_replay_thread_id_mismatch" if event.thread_id_only else "journal_replay_diverged"
        return Decision(status="failed", error=(msg, code),
                        append=() if terminal_emitted else (run_error_chunk(msg, code),),
                        close="failed", sandbox="destroy", save_transcript=True, release_claim=True,
                        stop=True, terminal=True)
    if isinstance(event, Failed):
        return Decision(status="failed", error=(event.message, event.code),
                        append=() if terminal_emitted else (run_error_chunk(event.message, event.code),),
                        close="failed", kill_agent=True, sandbox="destroy", save_transcript=True,
                        release_claim=True, stop=True, terminal=True)
    if isinstance(event, Drain):
        # No run is finalized by a deploy: hand over with the sandbox and log untouched.
        return Decision(release_claim=True, stop=True)
    if isinstance(event, (ClaimLost, SessionLost)):
        # Someone else owns the run now: write nothing, not even a release.
        return Decision(stop=True)
    raise TypeError(f"unknown event {event!r}")


_ALLOWED: dict[Phase, frozenset[Phase]] = {
    Phase.CLAIMED: frozenset({Phase.FENCED, Phase.FINISHING, Phase.STOPPED, Phase.CANCELLING}),
    Phase.FENCED: frozenset({Phase.PREPARING, Phase.CANCELLING, Phase.FINISHING, Phase.STOPPED}),
    Phase.PREPARING: frozenset({Phase.STREAMING, Phase.CANCELLING, Phase.FINISHING, Phase.STOPPED}),
    Phase.STREAMING: frozenset({Phase.CANCELLING, Phase.FINISHING, Phase.STOPPED}),
    Phase.CANCELLING: frozenset({Phase.FINISHING, Phase.STOPPED}),
    Phase.FINISHING: frozenset({Phase.DONE, Phase.STOPPED}),
    Phase.DONE: frozenset(),
    Phase.STOPPED: frozenset(),
}


class RunMachine:
    """Phase tracking of one driven run; refuses impossible transitions.

    Args:
        keep_sandbox: the run asked to keep its sandbox after success.
    """

    def __init__(self, *, keep_sandbox: bool = False) -> None:
        self.phase = Phase.CLAIMED
        self.keep_sandbox = keep_sandbox
        self.terminal_emitted = False
        self.decision: Decision | None = None

    def advance(self, phase: Phase) -> None:
        """Move to ``phase``.

        Raises:
            RuntimeError: when the transition is not allowed (a driver bug).
        """
        if phase is self.phase:
            return
        if phase not in _ALLOWED[self.phase]:
            raise RuntimeError(f"run cannot go from {self.phase.value} to {phase.value}")
        self.phase = phase

    def saw_chunk(self, chunk: Chunk) -> None:
        """Record that ``chunk`` is in the log (stored or appended)."""
        if is_terminal_chunk(chunk):
            self.terminal_emitted = True

    def on(self, event: Event) -> Decision:
        """Decide ``event`` and move to the phase it leads to.

        A run that already has a decision that stops it ignores later events (returns
        :data:`CONTINUE`), except that a terminal decision wins over a pending hand-over.
        """
        if self.phase in TERMINAL_PHASES:
            return CONTINUE
        d = decide(event, keep_sandbox=self.keep_sandbox, terminal_emitted=self.terminal_emitted)
        if self.decision is not None and self.decision.stop:
            return CONTINUE
        if d.stop:
            self.decision = d
            if d.kill_agent and isinstance(event, CancelRequested):
                self.advance(Phase.CANCELLING)
            elif d.terminal:
                self.advance(Phase.FINISHING)
            else:
                self.advance(Phase.STOPPED)
        return d
