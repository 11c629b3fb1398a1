"""Inputs to a live run against a real etcd (docs/hitl.md): the host asks under its claim,
two users answer at once and exactly one wins, a takeover fences the old host's writes, and an
update by the driver keeps the inputs."""
from __future__ import annotations

import asyncio

import pytest

from baton import errors
from baton.coordinator_client import CoordinatorClient
from baton.v1.coordinator_pb2 import PutRunInputRequest as Op
from baton.v1.coordinator_pb2 import PutRunInputResponse as Out
from baton.v1.runs_pb2 import RunInput, RunRecord, RunStatus
from tests.conftest import unique


async def _asked(cc: CoordinatorClient) -> tuple[RunRecord, object, int]:
    rec, _ = await cc.create_or_resume_run(RunRecord(run_id=unique("run-"), thread_id=unique("th-"), tenant="acme"))
    # A TTL a starved keep-alive cannot lapse on a machine at many times its cores (2 s did).
    session = await cc.open_session(15.0, owner="host-a")
    epoch, _ = await cc.claim_run(rec.run_id, session, "host-a")
    outcome, after, _ = await cc.put_run_input(
        rec.run_id, Op.REQUEST, RunInput(id="req-1", tool_call_id="toolu_1", tool_name="Bash",
                                         tool_input_json='{"command":"ls"}', requested_at=1.0, expires_at=9e9),
        session_id=session.id, epoch=epoch)  # type: ignore[attr-defined]
    assert outcome == Out.OK and after.inputs[0].state == "pending"
    return after, session, epoch


async def test_two_answers_at_once_one_wins_the_other_gets_it(cc: CoordinatorClient) -> None:
    rec, session, _ = await _asked(cc)
    answers = [RunInput(id="req-1", decision=d, answered_by="user", answered_at=2.0) for d in ("allow", "deny")]
    got = await asyncio.gather(*(cc.put_run_input(rec.run_id, Op.ANSWER, a, tenant="acme") for a in answers))
    outcomes = sorted(g[0] for g in got)
    assert outcomes == sorted([Out.OK, Out.CONFLICT])
    winner = next(g for g in got if g[0] == Out.OK)[1].inputs[0]
    loser_saw = next(g for g in got if g[0] == Out.CONFLICT)[2]
    assert loser_saw == winner and winner.state == "answered"
    stored = (await cc.get_run(rec.run_id)).record.inputs[0]
    assert stored == winner
    await session.close()  # type: ignore[attr-defined]


async def test_a_takeover_fences_the_old_hosts_request(cc: CoordinatorClient) -> None:
    rec, session, epoch = await _asked(cc)
    await session.close()  # type: ignore[attr-defined]
    successor = await cc.open_session(2.0, owner="host-b")
    new_epoch, _ = await cc.claim_run(rec.run_id, successor, "host-b")
    late = RunInput(id="req-2", tool_name="Bash", expires_at=9e9)
    outcome, _, _ = await cc.put_run_input(rec.run_id, Op.REQUEST, late, session_id=session.id, epoch=epoch)  # type: ignore[attr-defined]
    assert outcome == Out.FENCED
    outcome, after, _ = await cc.put_run_input(rec.run_id, Op.REQUEST, late, session_id=successor.id, epoch=new_epoch)
    assert outcome == Out.OK and [i.id for i in after.inputs] == ["req-1", "req-2"]
    await successor.close()


async def test_updates_keep_inputs_and_a_terminal_run_takes_no_answer(cc: CoordinatorClient) -> None:
    rec, session, epoch = await _asked(cc)
    await cc.update_run(rec.run_id, RunRecord(run_id=rec.run_id, status=RunStatus.RUN_STATUS_COMPLETED,
                                  finished_at=3.0), ["status", "finished_at"], epoch=epoch,
                        session_id=session)  # type: ignore[arg-type]
    after = (await cc.get_run(rec.run_id)).record
    assert [i.id for i in after.inputs] == ["req-1"]
    outcome, _, _ = await cc.put_run_input(rec.run_id, Op.ANSWER, RunInput(id="req-1", decision="allow"), tenant="acme")
    assert outcome == Out.ENDED
    await session.close()  # type: ignore[attr-defined]


async def test_bad_requests_are_refused_clearly(cc: CoordinatorClient) -> None:
    rec, session, _ = await _asked(cc)
    with pytest.raises(errors.InvalidArgument, match="decision"):
        await cc.put_run_input(rec.run_id, Op.ANSWER, RunInput(id="req-1", decision="maybe"))
    with pytest.raises(errors.InvalidArgument, match="input.id"):
        await cc.put_run_input(rec.run_id, Op.STEER, RunInput(id="bad id!", message="x"))
    with pytest.raises(errors.InvalidArgument, match="session"):
        await cc.put_run_input(rec.run_id, Op.REQUEST, RunInput(id="req-3"))
    outcome, _, _ = await cc.put_run_input(rec.run_id, Op.ANSWER, RunInput(id="req-1", decision="allow"),
                                           tenant="globex")
    assert outcome == Out.NOT_FOUND
    await session.close()  # type: ignore[attr-defined]


class _Inbox:
    """Where the host's input actions land (the provider's ``send_input``), in order."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send_input(self, handle: object, input_id: str, payload: bytes) -> None:
        self.sent.append(input_id)


async def test_a_message_steered_as_the_turn_ends_is_delivered_and_one_after_the_close_is_refused(
        cc: CoordinatorClient) -> None:
    """The host closes the agent's input (claude-code's stdin) only through a fenced CLOSE
    compared with the inputs it has seen: a message that came after it looked is delivered
    first, and a message after the close is refused ``ENDED`` (a 409 to its user), never
    stored where no process reads it."""
    from types import SimpleNamespace

    from sandbox_host.run_inputs import EOF_ID, TURN_RESULT, InputDesk
    from sandbox_host.run_inputs_io import _act

    rec, _ = await cc.create_or_resume_run(RunRecord(run_id=unique("run-"), thread_id=unique("th-"), tenant="acme"))
    session = await cc.open_session(15.0, owner="host-a")
    epoch, _ = await cc.claim_run(rec.run_id, session, "host-a")
    desk = InputDesk(approval_timeout=60.0, closes_input=True)
    desk.on_record([])
    desk.saw([{"type": "CUSTOM", "name": TURN_RESULT, "value": {}}])  # the turn's result: over
    # The user's message lands after the host last looked at the record.
    outcome, _, _ = await cc.put_run_input(rec.run_id, Op.STEER, RunInput(id="m1", message="one more thing"),
                                           tenant="acme")
    assert outcome == Out.OK
    inbox = _Inbox()
    deps, sbx = SimpleNamespace(cc=cc, session=session), SimpleNamespace(provider=inbox, handle=None)
    await _act(deps, rec, epoch, sbx, desk)  # type: ignore[arg-type]
    assert inbox.sent == ["m1"]  # delivered, the input still open
    assert not (await cc.get_run(rec.run_id)).record.inputs_closed
    # The agent took it (the journal shows it) and its turn ended again: now the input closes.
    desk.saw([{"type": "TEXT_MESSAGE_START", "role": "user", "messageId": "input:m1"},
              {"type": "CUSTOM", "name": TURN_RESULT, "value": {}}])
    await _act(deps, rec, epoch, sbx, desk)  # type: ignore[arg-type]
    assert inbox.sent == ["m1", EOF_ID]
    assert (await cc.get_run(rec.run_id)).record.inputs_closed
    outcome, _, _ = await cc.put_run_input(rec.run_id, Op.STEER, RunInput(id="m2", message="too late"), tenant="acme")
    assert outcome == Out.ENDED
    outcome, _, _ = await cc.put_run_input(rec.run_id, Op.STEER, RunInput(id="m1", message="one more thing"),
                                           tenant="acme")
    assert outcome == Out.OK  # a retry of the delivered one: still its 202
    # Another session's close is fenced.
    other = await cc.open_session(15.0, owner="host-b")
    outcome, _, _ = await cc.put_run_input(rec.run_id, Op.CLOSE, RunInput(), session_id=other.id, epoch=epoch,
                                           known_inputs=1)
    assert outcome == Out.FENCED
    await other.close()
    await session.close()  # type: ignore[attr-defined]
