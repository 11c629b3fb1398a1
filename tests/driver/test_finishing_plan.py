"""The pure part of finishing: which final writes a decision needs, in which
order, and what is left when a step is done, refused by a fence, or cannot be done within
the budget (then the run is let go, so another owner finalizes from what is stored)."""
from __future__ import annotations

import pytest

from sandbox_host import machine as M
from sandbox_host.finishing import Plan, Step, after, plan

K, A, T, C, S, R, D = (Step.KILL, Step.APPEND, Step.TRANSCRIPT, Step.CLOSE, Step.STATUS, Step.RELEASE,
                       Step.DESTROY)
FINISHED = {"type": "RUN_FINISHED", "threadId": "t", "runId": "r"}


@pytest.mark.parametrize("event,save,steps,log_final", [
    (M.AgentTerminal(FINISHED), True, (T, C, S, R, D), False),
    (M.AgentTerminal({"type": "RUN_ERROR", "message": "x", "code": "y"}), True, (T, C, S, R, D), False),
    (M.CancelRequested("user"), True, (K, A, T, C, S, R, D), False),
    (M.Failed("the run's input is missing", "run_input_missing"), False, (K, A, C, S, R, D), False),
    (M.StoredClose("completed"), False, (S, R, D), True),   # a successor finalizes from the close record
    (M.Drain(), True, (T, R), False),                         # hand-over: transcript, then the claim
    (M.Drain(), False, (R,), False),
    (M.ClaimLost("fence@2"), True, (), False),                # someone else owns it: write nothing
    (M.SessionLost(), False, (), False),
])
def test_plan(event: M.Event, save: bool, steps: tuple[Step, ...], log_final: bool) -> None:
    d = M.decide(event)
    assert plan(d, save_transcript=save and (d.save_transcript or not d.terminal)) == Plan(steps, log_final)


def test_interrupted_keeps_its_sandbox_but_removes_leftovers() -> None:
    d = M.decide(M.AgentTerminal({"type": "RUN_FINISHED", "outcome": {"type": "interrupt"}}))
    assert d.sandbox == "keep" and plan(d, save_transcript=True).steps == (T, C, S, R, D)


FULL = Plan((K, A, T, C, S, R, D))
CLOSED = Plan((S, R, D), log_final=True)


@pytest.mark.parametrize("p,step,outcome,left", [
    (FULL, K, "done", (A, T, C, S, R, D)),
    (FULL, C, "done", (S, R, D)),
    (FULL, R, "done", (D,)),
    (FULL, D, "done", ()),
    # a successor's fence/close/transcript refused the write: nothing more, not even a release
    (FULL, A, "fenced", ()),
    (FULL, T, "fenced", ()),
    (FULL, C, "fenced", ()),
    # the status refused because this claim lapsed after it closed the log: remove the sandbox,
    # no claim to release
    (FULL, S, "claim-lapsed", (D,)),
    # cannot be done in the budget before the log is final: let go, keep the sandbox
    (FULL, A, "gave-up", (R,)),
    (FULL, T, "gave-up", (R,)),
    (FULL, C, "gave-up", (R,)),
    # ... after the log is final: the rest still runs (the successor finalizes the record)
    (FULL, S, "gave-up", (R, D)),
    (FULL, R, "gave-up", (D,)),       # the session is gone, and so is the claim
    (FULL, D, "gave-up", ()),
    (CLOSED, S, "gave-up", (R, D)),
    (Plan((T, R)), T, "gave-up", (R,)),
])
def test_after(p: Plan, step: Step, outcome: str, left: tuple[Step, ...]) -> None:
    assert after(p, step, outcome) == left  # type: ignore[arg-type]
