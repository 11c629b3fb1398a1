"""The run state machine: every row of docs/design.md §5.5's table, without servers."""
from __future__ import annotations

import pytest

from sandbox_host.machine import (
    AgentTerminal, CancelRequested, ClaimLost, Detached, Diverged, Drain, Failed, Phase,
    RunMachine, SessionLost, StoredClose, StoredTerminal, agent_end, decide,
)

FINISHED = {"type": "RUN_FINISHED", "threadId": "t", "runId": "r"}
INTERRUPT = {**FINISHED, "outcome": {"type": "interrupt", "interrupts": [{"id": "i1"}]}}
ERROR = {"type": "RUN_ERROR", "message": "boom", "code": "incomplete_journal"}


def test_detach_keeps_everything_open() -> None:
    d = decide(Detached(cancel_on_disconnect=False))
    assert (d.status, d.close, d.append, d.sandbox, d.kill_agent, d.stop) == (None, None, (), "untouched", False, False)


def test_detach_with_cancel_on_disconnect_is_a_cancel() -> None:
    d = decide(Detached(cancel_on_disconnect=True))
    assert d.status == "aborted" and d.close == "aborted" and d.kill_agent and d.sandbox == "destroy"
    assert d.append[0]["name"] == "run.cancelled" and d.append[0]["value"]["reason"] == "disconnected"


@pytest.mark.parametrize("path", ["watch", "fast", "reaper"])
def test_cancel_in_each_path(path: str) -> None:
    d = decide(CancelRequested(reason="user", path=path), keep_sandbox=True)  # type: ignore[arg-type]
    assert d.status == "aborted" and d.error == ("run cancelled (user)", "cancelled")
    assert d.sandbox == "destroy"  # always, keep_sandbox or not
    assert d.kill_agent and d.close == "aborted" and d.save_transcript and d.release_claim
    assert [c["type"] for c in d.append] == ["CUSTOM", "RUN_ERROR"]
    assert d.append[0] == {"type": "CUSTOM", "name": "run.cancelled",
                           "value": {"reason": "user", "processGone": True, "sandboxDestroyed": True}}
    assert d.append[1]["code"] == "cancelled"


def test_cancel_after_terminal_chunk_appends_nothing_after_it() -> None:
    d = decide(CancelRequested(), terminal_emitted=True)
    assert d.append == () and d.close == "aborted"


def test_host_death_is_not_terminal() -> None:
    for ev in (SessionLost(), ClaimLost("fence@2")):
        d = decide(ev)
        assert d.stop and d.status is None and d.close is None and d.sandbox == "untouched" and not d.release_claim


@pytest.mark.parametrize("keep,fate", [(False, "destroy"), (True, "keep")])
def test_success(keep: bool, fate: str) -> None:
    d = decide(AgentTerminal(FINISHED), keep_sandbox=keep)
    assert (d.status, d.error, d.close, d.sandbox, d.append) == ("completed", None, "completed", fate, ())


def test_failure_never_keeps_the_sandbox() -> None:
    d = decide(AgentTerminal(ERROR), keep_sandbox=True)
    assert (d.status, d.error, d.close, d.sandbox) == ("failed", ("boom", "incomplete_journal"), "failed", "destroy")


def test_interrupt_keeps_sandbox_and_stays_interrupted() -> None:
    for ev in (AgentTerminal(INTERRUPT), StoredTerminal(INTERRUPT)):
        d = decide(ev)
        assert (d.status, d.close, d.sandbox) == ("interrupted", "interrupted", "keep")


def test_stored_close_finalizes_record_only() -> None:
    d = decide(StoredClose("completed"))
    assert d.status == "completed" and d.close is None and d.append == () and d.sandbox == "destroy"
    assert decide(StoredClose("interrupted")).sandbox == "keep"
    assert decide(StoredClose("failed", "x", "y")).error == ("x", "y")


def test_divergence_is_loud() -> None:
    d = decide(Diverged(7))
    assert d.status == "failed" and d.close == "failed"
    assert d.append == ({"type": "RUN_ERROR", "message": "journal replay diverged at index 7",
                         "code": "journal_replay_diverged"},)
    assert decide(Diverged(0, thread_id_only=True)).error[1] == "journal_replay_thread_id_mismatch"  # type: ignore[index]


def test_drain_hands_over_without_terminal() -> None:
    d = decide(Drain())
    assert d.release_claim and d.stop and d.status is None and d.close is None and d.sandbox == "untouched"


def test_failed_kills_and_fails() -> None:
    d = decide(Failed("sandbox build failed", "sandbox_build_failed"))
    assert d.status == "failed" and d.kill_agent and d.append[0]["code"] == "sandbox_build_failed"


def test_machine_first_stop_wins_and_phases() -> None:
    m = RunMachine()
    m.advance(Phase.FENCED)
    m.advance(Phase.PREPARING)
    m.advance(Phase.STREAMING)
    assert m.on(Detached(cancel_on_disconnect=False)).stop is False and m.phase is Phase.STREAMING
    d = m.on(CancelRequested())
    assert d.status == "aborted" and m.phase is Phase.CANCELLING
    assert m.on(AgentTerminal(FINISHED)).status is None  # a later event changes nothing
    m.advance(Phase.FINISHING)
    m.advance(Phase.DONE)
    with pytest.raises(RuntimeError):
        m.advance(Phase.STREAMING)


def test_machine_tracks_terminal_chunks() -> None:
    m = RunMachine()
    m.saw_chunk(ERROR)
    assert m.on(CancelRequested()).append == ()
    assert m.phase is Phase.CANCELLING


def test_machine_drain_stops() -> None:
    m = RunMachine()
    m.on(Drain())
    assert m.phase is Phase.STOPPED


def test_a_cancel_flag_read_after_the_stored_end_wins_over_it() -> None:
    """The flag landed before the agent's terminal chunk was stored but reached the driver
    by neither WatchRun nor the fast path: the record read after the store carries it out
    (aborted, nothing appended after the stored terminal, the log closed aborted)."""
    m = RunMachine()
    m.advance(Phase.FENCED)
    m.advance(Phase.PREPARING)
    m.advance(Phase.STREAMING)
    m.saw_chunk(FINISHED)  # appended: the end is stored
    d = m.on(agent_end(FINISHED, cancel_requested=True, cancel_reason="user"))
    assert (d.status, d.close, d.append, d.error) == ("aborted", "aborted", (), ("run cancelled (user)", "cancelled"))
    assert m.phase is Phase.CANCELLING
    assert m.on(CancelRequested(path="fast")).stop is False  # the late fast path changes nothing


def test_no_cancel_flag_after_the_stored_end_keeps_the_agents_outcome() -> None:
    """A flag that lands after the read came after the terminal chunk was stored: the run
    keeps the agent's outcome, and a cancel seen later is ignored."""
    assert agent_end(FINISHED, cancel_requested=False) == AgentTerminal(FINISHED)
    assert agent_end(ERROR, cancel_requested=True) == CancelRequested(reason="user", path="watch")
    m = RunMachine()
    m.advance(Phase.FENCED)
    m.advance(Phase.PREPARING)
    m.advance(Phase.STREAMING)
    d = m.on(agent_end(FINISHED, cancel_requested=False))
    assert (d.status, d.close) == ("completed", "completed")
    assert m.on(CancelRequested(path="watch")) == decide(Detached(cancel_on_disconnect=False))
