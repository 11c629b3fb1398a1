"""The input rule (:func:`coordinator.input_rules.put_input`) as tables, no servers: a tool approval
asked under the claim, answered once by a user, expired as a denial; a steered message.

The real-etcd test (tests/coordinator/test_run_inputs.py) proves the store applies the plan in
one compare-and-set, so two answers racing each other see one win.
"""
from __future__ import annotations

import pytest

from baton.runs import MAX_INPUT_TEXT, MAX_RECORD_BYTES, MAX_RUN_INPUTS
from baton.v1.coordinator_pb2 import PutRunInputRequest as Op
from baton.v1.coordinator_pb2 import PutRunInputResponse as Out
from baton.v1.runs_pb2 import RunInput, RunRecord
from coordinator import _etcd as E
from coordinator import input_rules
from tests.coordinator.test_rules import CLAIM_REV, COMPLETED, K, OTHER_SESSION, RUN, SESSION, held, record, snap

pytestmark = pytest.mark.unit


def ask(aid: str = "req-1", expires_at: float = 200.0) -> RunInput:
    return RunInput(id=aid, tool_call_id="toolu_1", tool_name="Bash", tool_input_json='{"command":"ls"}',
                    requested_at=100.0, expires_at=expires_at)


def asked(*inputs: RunInput, **fields: object) -> RunRecord:
    rec = record(**fields)  # type: ignore[arg-type]
    for i in inputs:
        stored = rec.inputs.add()
        stored.CopyFrom(i)
        stored.kind, stored.state = "approval", "pending"
    return rec


def answer(decision: str = "allow", aid: str = "req-1", **fields: object) -> RunInput:
    return RunInput(id=aid, decision=decision, answered_at=150.0, **fields)  # type: ignore[arg-type]


def fence() -> list[E.Cmp]:
    return [E.cmp_mod(K.claim(RUN), CLAIM_REV)]


def test_request_appends_a_pending_approval_under_the_claim() -> None:
    plan = input_rules.put_input(snap(record(), held()), keys=K, op=Op.REQUEST, given=ask(),
                           session_id=SESSION, epoch=3)
    outcome, rec, existing = plan.result
    assert outcome == Out.OK and existing is None and plan.write and list(plan.cmps) == fence()
    assert rec is not None and [(i.id, i.kind, i.state, i.tool_name) for i in rec.inputs] == [
        ("req-1", "approval", "pending", "Bash")]


@pytest.mark.parametrize(("claim", "epoch"), [
    pytest.param(None, 3, id="claim-gone"),
    pytest.param(held(session_id=OTHER_SESSION), 3, id="another-session"),
    pytest.param(held(epoch=4), 3, id="taken-over"),
])
def test_request_or_expire_without_the_claim_is_fenced(claim: object, epoch: int) -> None:
    for op in (Op.REQUEST, Op.EXPIRE):
        plan = input_rules.put_input(snap(asked(ask()), claim), keys=K, op=op, given=ask(),  # type: ignore[arg-type]
                               session_id=SESSION, epoch=epoch, now=500.0)
        assert plan.result[0] == Out.FENCED and not plan.write


def test_request_again_is_idempotent() -> None:
    plan = input_rules.put_input(snap(asked(ask()), held()), keys=K, op=Op.REQUEST, given=ask(),
                           session_id=SESSION, epoch=3)
    assert plan.result[0] == Out.OK and not plan.write


def test_first_answer_wins_and_a_second_gets_the_first() -> None:
    plan = input_rules.put_input(snap(asked(ask())), keys=K, op=Op.ANSWER, tenant="acme",
                           given=answer("deny", message="not that", answered_by="user"))
    outcome, rec, _ = plan.result
    assert outcome == Out.OK and plan.write and not plan.cmps  # a user's answer is not fenced
    assert rec is not None
    first = rec.inputs[0]
    assert (first.state, first.decision, first.message, first.answered_at) == ("answered", "deny", "not that", 150.0)
    again = input_rules.put_input(snap(rec), keys=K, op=Op.ANSWER, tenant="acme", given=answer("allow"))
    assert again.result[0] == Out.CONFLICT and not again.write and again.result[2] == first


def test_a_second_answer_after_the_run_ended_still_gets_the_first() -> None:
    rec = input_rules.put_input(snap(asked(ask())), keys=K, op=Op.ANSWER, given=answer("allow")).result[1]
    assert rec is not None
    rec.status = COMPLETED
    plan = input_rules.put_input(snap(rec), keys=K, op=Op.ANSWER, given=answer("deny"))
    assert plan.result[0] == Out.CONFLICT and not plan.write and plan.result[2] == rec.inputs[0]


def test_allow_keeps_updated_input_deny_drops_it() -> None:
    given = answer("allow", updated_input_json='{"command":"ls -la"}')
    rec = input_rules.put_input(snap(asked(ask())), keys=K, op=Op.ANSWER, given=given).result[1]
    assert rec is not None and rec.inputs[0].updated_input_json == '{"command":"ls -la"}'
    given = answer("deny", updated_input_json='{"command":"rm -rf /"}')
    rec = input_rules.put_input(snap(asked(ask())), keys=K, op=Op.ANSWER, given=given).result[1]
    assert rec is not None and rec.inputs[0].updated_input_json == ""


@pytest.mark.parametrize(("cur", "tenant", "aid", "outcome"), [
    pytest.param(None, "acme", "req-1", Out.NOT_FOUND, id="no-run"),
    pytest.param(asked(ask()), "globex", "req-1", Out.NOT_FOUND, id="another-tenant"),
    pytest.param(asked(ask()), "acme", "req-9", Out.NOT_FOUND, id="no-such-approval"),
    pytest.param(asked(ask(), status=COMPLETED), "acme", "req-1", Out.ENDED, id="run-ended"),
])
def test_answer_refusals(cur: RunRecord | None, tenant: str, aid: str, outcome: int) -> None:
    plan = input_rules.put_input(snap(cur), keys=K, op=Op.ANSWER, tenant=tenant, given=answer(aid=aid))
    assert plan.result[0] == outcome and not plan.write


def test_an_answer_cannot_name_a_steered_message() -> None:
    rec = input_rules.put_input(snap(record()), keys=K, op=Op.STEER, given=RunInput(id="m1", message="hi")).result[1]
    assert rec is not None
    plan = input_rules.put_input(snap(rec), keys=K, op=Op.ANSWER, given=answer(aid="m1"))
    assert plan.result[0] == Out.NOT_FOUND


def test_expire_denies_when_due_only() -> None:
    early = input_rules.put_input(snap(asked(ask()), held()), keys=K, op=Op.EXPIRE, given=ask(),
                            session_id=SESSION, epoch=3, now=199.0)
    assert early.result[0] == Out.OK and not early.write
    due = input_rules.put_input(snap(asked(ask()), held()), keys=K, op=Op.EXPIRE, given=ask(),
                          session_id=SESSION, epoch=3, now=200.0)
    rec = due.result[1]
    assert due.result[0] == Out.OK and due.write and list(due.cmps) == fence() and rec is not None
    got = rec.inputs[0]
    assert (got.state, got.decision, got.answered_by, got.message) == ("answered", "deny", "expired",
                                                                      input_rules.EXPIRED_MESSAGE)
    late_answer = input_rules.put_input(snap(rec), keys=K, op=Op.ANSWER, given=answer("allow"))
    assert late_answer.result[0] == Out.CONFLICT and late_answer.result[2] == got


def test_expire_after_an_answer_is_a_conflict() -> None:
    rec = input_rules.put_input(snap(asked(ask())), keys=K, op=Op.ANSWER, given=answer("allow")).result[1]
    plan = input_rules.put_input(snap(rec, held()), keys=K, op=Op.EXPIRE, given=ask(), session_id=SESSION,
                           epoch=3, now=500.0)
    assert plan.result[0] == Out.CONFLICT and not plan.write


def test_steer_appends_once_and_is_bounded() -> None:
    plan = input_rules.put_input(snap(record()), keys=K, op=Op.STEER, tenant="acme",
                           given=RunInput(id="m1", message="also add tests", requested_at=120.0))
    rec = plan.result[1]
    assert plan.result[0] == Out.OK and rec is not None
    assert [(i.id, i.kind, i.state, i.message) for i in rec.inputs] == [("m1", "message", "pending", "also add tests")]
    again = input_rules.put_input(snap(rec), keys=K, op=Op.STEER, given=RunInput(id="m1", message="also add tests"))
    assert again.result[0] == Out.OK and not again.write
    full = record()
    for n in range(MAX_RUN_INPUTS):
        full.inputs.add(id=f"m{n}", kind="message", state="pending")
    over = input_rules.put_input(snap(full), keys=K, op=Op.STEER, given=RunInput(id="one-more", message="x"))
    assert over.result[0] == Out.TOO_MANY and not over.write
    ended = input_rules.put_input(snap(record(COMPLETED)), keys=K, op=Op.STEER, given=RunInput(id="m2", message="x"))
    assert ended.result[0] == Out.ENDED


def test_an_id_the_other_kind_holds_is_a_conflict_never_a_silent_ok() -> None:
    # A steer whose id is an approval's: refused with the approval, nothing written.
    plan = input_rules.put_input(snap(asked(ask())), keys=K, op=Op.STEER, given=RunInput(id="req-1", message="hi"))
    outcome, _, existing = plan.result
    assert outcome == Out.CONFLICT and not plan.write and existing is not None and existing.kind == "approval"
    # An ask whose id a steered message holds: refused too (the host then denies it).
    steered = input_rules.put_input(snap(record(), held()), keys=K, op=Op.STEER,
                              given=RunInput(id="req-1", message="hi")).result[1]
    assert steered is not None
    plan = input_rules.put_input(snap(steered, held()), keys=K, op=Op.REQUEST, given=ask(), session_id=SESSION, epoch=3)
    assert plan.result[0] == Out.CONFLICT and not plan.write and plan.result[2].kind == "message"


def test_an_input_that_would_take_the_record_past_its_byte_budget_is_too_many() -> None:
    # 64 KiB messages: 256 of them would be 16 MiB, far past what etcd takes in one request
    # (1.5 MiB); the record is refused the input at MAX_RECORD_BYTES, whatever the count.
    big = "x" * MAX_INPUT_TEXT
    rec = record()
    n = 0
    while True:
        plan = input_rules.put_input(snap(rec), keys=K, op=Op.STEER, given=RunInput(id=f"m{n}", message=big))
        if plan.result[0] != Out.OK:
            break
        assert plan.result[1] is not None
        rec = plan.result[1]
        n += 1
    assert plan.result[0] == Out.TOO_MANY and not plan.write and n < MAX_RUN_INPUTS
    assert rec.ByteSize() <= MAX_RECORD_BYTES < rec.ByteSize() + len(big)
    # A small steer still fits; the agent's ask and a user's long answer are refused alike.
    assert input_rules.put_input(snap(rec), keys=K, op=Op.STEER, given=RunInput(id="small", message="hi")).result[0] == Out.OK
    big_ask = RunInput(id="req-9", tool_name="Write", tool_input_json=big)
    plan = input_rules.put_input(snap(rec, held()), keys=K, op=Op.REQUEST, given=big_ask, session_id=SESSION, epoch=3)
    assert plan.result[0] == Out.TOO_MANY and not plan.write
    full = asked(ask(), *(RunInput(id=f"p{i}", tool_input_json=big) for i in range(n - 1)))
    full = asked(ask(), *full.inputs[1:], RunInput(id="pad", tool_input_json="y" * (MAX_RECORD_BYTES - full.ByteSize() - 1000)))
    assert MAX_RECORD_BYTES - 1000 <= full.ByteSize() <= MAX_RECORD_BYTES
    plan = input_rules.put_input(snap(full), keys=K, op=Op.ANSWER, given=answer("deny", message="n" * 2000))
    assert plan.result[0] == Out.TOO_MANY and not plan.write
    assert input_rules.put_input(snap(full), keys=K, op=Op.ANSWER, given=answer("deny", message="no")).result[0] == Out.OK
    # The fail-closed expiry is never refused for size.
    plan = input_rules.put_input(snap(full, held()), keys=K, op=Op.EXPIRE, given=RunInput(id="req-1"),
                           session_id=SESSION, epoch=3, now=500.0)
    assert plan.result[0] == Out.OK and plan.write


def steered(*ids: str) -> RunRecord:
    rec = record()
    for i in ids:
        rec.inputs.add(id=i, kind="message", state="pending", message="m")
    return rec


def test_close_takes_the_inputs_the_host_saw_and_then_steers_are_refused_ended() -> None:
    close = dict(keys=K, op=Op.CLOSE, given=RunInput(), session_id=SESSION, epoch=3)
    # A message the host has not seen: refused with the record (nothing written), so the
    # host delivers it before closing.
    late = input_rules.put_input(snap(steered("m1", "m2"), held()), known_inputs=1, **close)  # type: ignore[arg-type]
    assert late.result[0] == Out.CONFLICT and not late.write and late.result[1] is not None
    assert [i.id for i in late.result[1].inputs] == ["m1", "m2"]
    # Every input seen: closed, under the claim's compare.
    plan = input_rules.put_input(snap(steered("m1", "m2"), held()), known_inputs=2, **close)  # type: ignore[arg-type]
    assert plan.result[0] == Out.OK and plan.new is not None and plan.new.inputs_closed and list(plan.cmps) == fence()
    closed = plan.new
    again = input_rules.put_input(snap(closed, held()), known_inputs=0, **close)  # type: ignore[arg-type]
    assert again.result[0] == Out.OK and not again.write
    # A steer after the close: ENDED, nothing stored; a retry of one stored before: OK.
    after = input_rules.put_input(snap(closed), keys=K, op=Op.STEER, given=RunInput(id="m3", message="late"))
    assert after.result[0] == Out.ENDED and not after.write
    retry = input_rules.put_input(snap(closed), keys=K, op=Op.STEER, given=RunInput(id="m2", message="m"))
    assert retry.result[0] == Out.OK and not retry.write


def test_close_is_fenced_and_ends_with_the_run() -> None:
    close = dict(keys=K, op=Op.CLOSE, given=RunInput(), known_inputs=0)
    for claim in (None, held(session_id=OTHER_SESSION)):
        plan = input_rules.put_input(snap(record(), claim), session_id=SESSION, epoch=3, **close)  # type: ignore[arg-type]
        assert plan.result[0] == Out.FENCED and not plan.write
    plan = input_rules.put_input(snap(record(COMPLETED), held()), session_id=SESSION, epoch=3, **close)  # type: ignore[arg-type]
    assert plan.result[0] == Out.ENDED and not plan.write
