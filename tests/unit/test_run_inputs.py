"""The input desk and the approval/steer chunks (pure): what a host registers, delivers,
expires and closes, from the chunks it replays and the record it watches."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import pytest

from baton.ids import input_id_for, validate_input_id
from baton.transcript import build_transcript
from sandbox_host.run_inputs import NO_ROOM, CloseInput, Deliver, Expire, InputDesk, Register, record_tool_input
from sandbox_host.translate import translator_for

pytestmark = pytest.mark.unit


@dataclass
class Inp:
    """The fields of a ``RunInput`` the desk reads."""

    id: str
    kind: str = "approval"
    state: str = "pending"
    decision: str = ""
    message: str = ""
    updated_input_json: str = ""
    expires_at: float = 0.0


ASK = {"type": "control_request", "request_id": "req-1",
       "request": {"subtype": "can_use_tool", "tool_name": "Bash", "input": {"command": "rm -rf build"},
                   "permission_suggestions": [], "tool_use_id": "toolu_1"}}


def _lines(*objs: dict) -> list[bytes]:
    return [json.dumps(o).encode() for o in objs]


def _translate(*objs: dict) -> list[dict]:
    tr = translator_for("claude-stream-json", "run-1", "thread-1")
    out: list[dict] = []
    for line in _lines(*objs):
        out += tr.feed(line)
    return out


def test_an_ask_becomes_tanstacks_approval_request_and_an_activity_in_place() -> None:
    chunks = _translate(ASK)
    custom = [c for c in chunks if c["type"] == "CUSTOM"]
    assert custom == [{"type": "CUSTOM", "name": "approval-requested", "value": {
        "toolCallId": "toolu_1", "toolName": "Bash", "input": {"command": "rm -rf build"},
        "approval": {"id": "req-1", "needsApproval": True}}}]
    act = [c for c in chunks if c["type"] == "ACTIVITY_SNAPSHOT"]
    assert act[0]["messageId"] == "approval:req-1"
    assert act[0]["content"]["interrupt"] == {"id": "req-1", "reason": "tool_approval",
                                              "message": "Allow Bash?", "toolCallId": "toolu_1"}


def test_the_answer_and_a_steer_stand_where_the_relay_delivered_them() -> None:
    answer = {"type": "baton_input", "id": "req-1", "input": {"type": "control_response", "response": {
        "subtype": "success", "request_id": "req-1", "response": {"behavior": "deny", "message": "not now"}}}}
    steer = {"type": "baton_input", "id": "m1", "input": {"type": "user", "message": {
        "role": "user", "content": "also update the README"}}}
    chunks = _translate(ASK, answer, steer)
    msgs = build_transcript(chunks)
    assert [m["id"] for m in msgs] == ["approval:req-1", "approval:req-1:answer", "input:m1"]
    assert msgs[1]["content"] == {"approvalId": "req-1", "toolCallId": "toolu_1", "approved": False,
                                  "message": "not now"}
    assert msgs[2] == {"id": "input:m1", "role": "user", "content": "also update the README"}


def test_other_control_requests_stay_notices() -> None:
    chunks = _translate({"type": "control_request", "request_id": "x", "request": {"subtype": "interrupt"}})
    assert [c.get("name") for c in chunks if c["type"] == "CUSTOM"] == ["claude.control_request"]


def _desk(**kw) -> InputDesk:
    return InputDesk(approval_timeout=60.0, **kw)


def _ask_chunks() -> list[dict]:
    return [c for c in _translate(ASK) if c["type"] != "RUN_STARTED"]


def test_an_ask_is_registered_before_anything_else_then_never_again() -> None:
    desk = _desk()
    asks = desk.saw(_ask_chunks())
    assert [a.id for a in asks] == ["req-1"]
    assert desk.actions(100.0) == [Register(asks[0], 160.0)]
    desk.registered_ask("req-1")
    assert desk.actions(100.0) == []
    assert desk.saw(_ask_chunks()) == []  # a replay of the same ask
    assert desk.pending_approvals() == ["req-1"]


def test_an_answer_is_delivered_once_and_the_echo_settles_it() -> None:
    desk = _desk()
    desk.saw(_ask_chunks())
    desk.on_record([Inp("req-1", state="answered", decision="allow")])
    [d] = desk.actions(0.0)
    assert isinstance(d, Deliver) and d.input_id == "req-1"
    assert json.loads(d.payload)["response"] == {"subtype": "success", "request_id": "req-1", "response": {
        "behavior": "allow", "updatedInput": {"command": "rm -rf build"}}}
    desk.sent_input("req-1")
    assert desk.actions(0.0) == []
    # A successor knows nothing of what was sent: it delivers again unless the journal shows it.
    succ = _desk()
    succ.saw(_ask_chunks())
    succ.on_record([Inp("req-1", state="answered", decision="allow")])
    echo = {"type": "baton_input", "id": "req-1", "input": json.loads(d.payload)}
    succ.saw(_translate(ASK, echo))
    assert succ.actions(0.0) == []
    assert succ.pending_approvals() == []


def test_an_unanswered_approval_expires_at_its_time_and_not_before() -> None:
    desk = _desk()
    desk.saw(_ask_chunks())
    desk.on_record([Inp("req-1", expires_at=50.0)])
    assert desk.next_deadline() == 50.0
    assert desk.actions(49.9) == []
    assert desk.actions(50.0) == [Expire("req-1")]
    desk.expiry_sent("req-1")
    assert desk.actions(51.0) == []
    desk.on_record([Inp("req-1", state="answered", decision="deny", message="the approval expired", expires_at=50.0)])
    [d] = desk.actions(51.0)
    assert json.loads(d.payload)["response"]["response"] == {"behavior": "deny", "message": "the approval expired"}


def test_an_answer_for_an_ask_the_journal_never_showed_is_not_delivered() -> None:
    desk = _desk()
    desk.on_record([Inp("req-9", state="answered", decision="allow")])
    assert desk.actions(0.0) == []


def test_input_closes_after_the_turn_only_when_nothing_waits() -> None:
    desk = _desk(closes_input=True)
    result = {"type": "result", "subtype": "success", "is_error": False, "result": "ok"}
    desk.saw(_translate({"type": "system", "subtype": "init", "session_id": "s"}, result))
    desk.on_record([Inp("m1", kind="message", message="one more thing")])
    [d] = desk.actions(0.0)
    assert isinstance(d, Deliver) and json.loads(d.payload)["message"]["content"] == "one more thing"
    desk.sent_input("m1")
    assert desk.actions(0.0) == []  # delivered, not yet seen: it may start another turn
    echo = {"type": "baton_input", "id": "m1", "input": json.loads(d.payload)}
    desk.saw(_translate(echo))
    assert desk.actions(0.0) == []  # the steered turn runs
    desk.saw(_translate({"type": "system", "subtype": "init", "session_id": "s"}, result))
    assert desk.actions(0.0) == [CloseInput()]
    desk.sent_input("eof")
    assert desk.actions(0.0) == []


def test_a_replay_agent_input_is_never_closed() -> None:
    desk = _desk(closes_input=False)
    desk.saw(_translate({"type": "result", "subtype": "success", "is_error": False}))
    assert desk.actions(0.0) == []


# --- a resumed agent process (docs/hitl.md "A resumed agent") ----------------------------

INIT = {"type": "system", "subtype": "init", "session_id": "0b8f2b1e-3c1d-4e55-9a6b-4a8f3c2d1e00"}
TOOL_USE = {"type": "assistant", "message": {"id": "msg_1", "role": "assistant", "content": [
    {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "rm -rf build"}}]},
    "parent_tool_use_id": None}
REASK = {**ASK, "request_id": "req-2"}
RESULT = {"type": "user", "message": {"role": "user", "content": [
    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "removed"}]}, "parent_tool_use_id": None}


def _answer_line(rid: str, behavior: str = "allow") -> dict:
    inner = {"behavior": "allow", "updatedInput": {}} if behavior == "allow" else {"behavior": "deny", "message": "no"}
    return {"type": "baton_input", "id": rid, "input": {"type": "control_response", "response": {
        "subtype": "success", "request_id": rid, "response": inner}}}


def test_a_resumed_process_asking_again_is_the_same_approval_answered_under_its_new_request() -> None:
    chunks = _translate(INIT, TOOL_USE, ASK, INIT, REASK, _answer_line("req-2"), RESULT)
    asks = [c for c in chunks if c.get("name") == "approval-requested"]
    assert len(asks) == 1  # no second request for the same call
    [again] = [c for c in chunks if c.get("name") == "approval.reasked"]
    assert again["value"] == {"approvalId": "req-1", "requestId": "req-2", "toolCallId": "toolu_1"}
    [answer] = [c for c in chunks if c.get("activityType") == "approval_answer"]
    assert answer["messageId"] == "approval:req-1:answer"
    assert answer["content"] == {"approvalId": "req-1", "toolCallId": "toolu_1", "approved": True}


def test_a_resumed_process_giving_the_call_a_new_id_is_matched_by_tool_and_input() -> None:
    other_use = {**TOOL_USE, "message": {**TOOL_USE["message"], "id": "msg_2", "content": [
        {**TOOL_USE["message"]["content"][0], "id": "toolu_9"}]}}
    reask = {**REASK, "request": {**ASK["request"], "tool_use_id": "toolu_9"}}
    chunks = _translate(INIT, TOOL_USE, ASK, INIT, other_use, reask)
    [again] = [c for c in chunks if c.get("name") == "approval.reasked"]
    assert again["value"] == {"approvalId": "req-1", "requestId": "req-2", "toolCallId": "toolu_9"}
    # Within one process, the same command asked twice is two approvals.
    same_process = _translate(INIT, TOOL_USE, ASK, other_use, reask)
    assert len([c for c in same_process if c.get("name") == "approval-requested"]) == 2


def test_after_a_relaunch_a_stored_denial_goes_to_the_new_request_once() -> None:
    desk = _desk(closes_input=True)
    desk.saw(_translate(INIT, TOOL_USE, ASK))
    desk.on_record([Inp("req-1", state="answered", decision="deny", message="no")])
    [d] = desk.actions(0.0)
    desk.sent_input(d.key or d.input_id)
    desk.saw(_translate(INIT, TOOL_USE, ASK, _answer_line("req-1", "deny")))  # delivered; then the process died
    assert desk.resume_wanted()  # no result for the call, the turn not over, the session known
    assert desk.agent_session == INIT["session_id"]
    desk.restarted()
    assert desk.actions(0.0) == []  # the new process has not asked yet: nothing goes to it blind
    desk.saw(_translate(INIT, TOOL_USE, ASK, _answer_line("req-1", "deny"), INIT, REASK)[-1:])
    [again] = desk.actions(0.0)
    assert isinstance(again, Deliver) and (again.input_id, again.key) == ("req-2", "req-1")
    assert json.loads(again.payload)["response"]["request_id"] == "req-2"
    desk.sent_input(again.key)
    assert desk.actions(0.0) == []
    tail = _translate(INIT, TOOL_USE, ASK, _answer_line("req-1", "deny"), INIT, REASK, _answer_line("req-2", "deny"), RESULT)
    desk.saw(tail[-6:])
    assert not desk.resume_wanted()  # the call ran


def test_a_denial_the_dead_process_was_given_stands_once_and_its_redelivery_settles_the_reask() -> None:
    # The dead process's relay passed the answer on just before it went; the resumed process
    # asks again and gets it again: one answer activity, where it first reached the journal.
    lines = (INIT, TOOL_USE, ASK, _answer_line("req-1", "deny"), INIT, REASK, _answer_line("req-2", "deny"), RESULT)
    chunks = _translate(*lines)
    answers = [i for i, c in enumerate(chunks) if c.get("activityType") == "approval_answer"]
    [again] = [i for i, c in enumerate(chunks) if c.get("name") == "approval.reasked"]
    [redelivered] = [c for c in chunks if c.get("name") == "approval.redelivered"]
    assert len(answers) == 1 and answers[0] < again
    assert redelivered["value"] == {"approvalId": "req-1", "requestId": "req-2"}
    desk = _desk(closes_input=True)
    desk.on_record([Inp("req-1", state="answered", decision="deny", message="no")])
    desk.saw(_translate(*lines[:4]))
    desk.restarted()
    desk.saw(_translate(*lines[:6])[len(_translate(*lines[:4])):])
    [d] = desk.actions(0.0)
    assert isinstance(d, Deliver) and d.input_id == "req-2"
    desk.sent_input(d.key)
    desk.saw(_translate(*lines)[len(_translate(*lines[:6])):])
    assert desk.actions(0.0) == [] and not desk.resume_wanted()
    # Every host replaying the journal produces the same chunks.
    assert _translate(*lines) == chunks


def test_an_allow_the_dead_process_was_given_is_never_given_again_unasked() -> None:
    # The dead process may have run the allowed call before it died (no result written yet):
    # the resumed process's ask is a new approval, for the user to answer.
    lines = (INIT, TOOL_USE, ASK, _answer_line("req-1"), INIT, REASK)
    chunks = _translate(*lines)
    assert not [c for c in chunks if c.get("name") in ("approval.reasked", "approval.redelivered")]
    [notice] = [c for c in chunks if c.get("name") == "approval.asked_again"]
    assert notice["value"] == {"approvalId": "req-2", "previousApprovalId": "req-1", "toolCallId": "toolu_1",
                               "mayHaveRun": True}
    asks = [c["value"]["approval"]["id"] for c in chunks if c.get("name") == "approval-requested"]
    assert asks == ["req-1", "req-2"]
    desk = _desk(closes_input=True)
    desk.on_record([Inp("req-1", state="answered", decision="allow")])
    desk.saw(_translate(*lines[:4]))
    desk.restarted()
    desk.saw(chunks[len(_translate(*lines[:4])):])
    acts = desk.actions(0.0)
    assert [type(a).__name__ for a in acts] == ["Register"] and acts[0].ask.id == "req-2"  # nothing delivered
    assert desk.pending_approvals() == ["req-2"]
    # A third process (another death before the user answered) asks again: still req-2's approval.
    third = _translate(*lines, INIT, {**ASK, "request_id": "req-3"})
    [reasked] = [c for c in third if c.get("name") == "approval.reasked"]
    assert reasked["value"]["approvalId"] == "req-2"


def test_no_relaunch_for_a_turn_that_ended_or_an_agent_without_a_session() -> None:
    desk = _desk(closes_input=True)
    desk.saw(_translate(TOOL_USE, ASK))
    assert not desk.resume_wanted()  # no init: no session to resume
    ended = _desk(closes_input=True)
    ended.saw(_translate(INIT, TOOL_USE, ASK, {"type": "result", "subtype": "success", "is_error": False}))
    assert not ended.resume_wanted()
    replay = _desk(closes_input=False)
    replay.saw(_translate(INIT, TOOL_USE, ASK))
    assert not replay.resume_wanted()


def test_a_relaunched_turn_that_never_asks_again_does_not_wait_for_it() -> None:
    desk = _desk(closes_input=True)
    desk.saw(_translate(INIT, TOOL_USE, ASK))
    desk.on_record([Inp("req-1", state="answered", decision="allow")])
    desk.restarted()
    assert desk.actions(0.0) == []
    desk.saw(_translate(INIT, {"type": "result", "subtype": "success", "is_error": False})[-4:])
    assert desk.actions(0.0) == [CloseInput()]


def test_an_ask_whose_id_a_message_holds_is_denied_under_another_inbox_id() -> None:
    desk = _desk(closes_input=True)
    desk.saw(_translate(INIT, TOOL_USE, ASK))
    desk.on_record([Inp("req-1", kind="message", state="pending", message="hi")])
    desk.sent_input("req-1")  # the message went in under its id
    desk.refuse("req-1")
    [d] = desk.actions(0.0)
    assert isinstance(d, Deliver) and d.key == "refused:req-1" and d.input_id.startswith("a-") and len(d.input_id) == 42
    body = json.loads(d.payload)["response"]
    assert body["request_id"] == "req-1" and body["response"]["behavior"] == "deny"
    desk.sent_input(d.key)
    assert desk.actions(0.0) == [] and desk.pending_approvals() == ["req-1"]
    echo = {"type": "baton_input", "id": d.input_id, "input": json.loads(d.payload)}
    desk.saw(_translate(INIT, TOOL_USE, ASK, echo)[-1:])
    assert desk.pending_approvals() == []


@pytest.mark.parametrize("raw", ["bad id/with spaces", "eof", "x" * 200, "\u00e9t\u00e9", "-lead"])
def test_a_request_id_that_is_no_input_id_gets_a_derived_approval_id_on_every_replay(raw: str) -> None:
    # The agent picks its request ids; one a user cannot name in a URL or the relay cannot
    # carry gets an approval id derived from it, the same on every host (a takeover replays
    # the journal and must find the approval its predecessor stored).
    aid = input_id_for(raw)
    assert aid == input_id_for(raw) and aid.startswith("a-") and len(aid) == 42
    assert validate_input_id(aid, "approvalId") == aid
    assert input_id_for("req-1") == "req-1"  # an input id stays as the agent chose it
    assert input_id_for("half \ud800") == "a-" + hashlib.sha256(b"half \xed\xa0\x80").hexdigest()[:40]
    odd = {**ASK, "request_id": raw}
    chunks = _translate(INIT, TOOL_USE, odd)
    assert chunks == _translate(INIT, TOOL_USE, odd)
    [custom] = [c for c in chunks if c.get("name") == "approval-requested"]
    assert custom["value"]["approval"]["id"] == aid and custom["value"]["requestId"] == raw
    [act] = [c for c in chunks if c["type"] == "ACTIVITY_SNAPSHOT"]
    assert act["messageId"] == f"approval:{aid}" and act["content"]["interrupt"]["id"] == aid
    desk = _desk()
    [asked] = desk.saw(chunks)
    assert asked.id == aid  # what the host registers on the record (the coordinator checks it)
    desk.registered_ask(aid)
    desk.on_record([Inp(aid, state="answered", decision="allow")])
    [d] = desk.actions(0.0)
    # Delivered under the derived id, answered under the agent's own request id.
    assert d.input_id == aid and d.key == aid
    assert json.loads(d.payload)["response"]["request_id"] == raw
    # The relay's echo names the same approval, so it is delivered once and the transcript
    # shows the answer under the approval's id.
    echo = {"type": "baton_input", "id": d.input_id, "input": json.loads(d.payload)}
    full = _translate(INIT, TOOL_USE, odd, echo)
    [answer] = [c for c in full if c["type"] == "ACTIVITY_SNAPSHOT" and c["activityType"] == "approval_answer"]
    assert answer["messageId"] == f"approval:{aid}:answer" and answer["content"]["approvalId"] == aid
    assert answer["content"]["toolCallId"] == "toolu_1"
    desk.saw(full[len(chunks):])
    assert desk.pending_approvals() == [] and desk.actions(0.0) == []


def test_a_tool_input_the_record_cannot_hold_is_stored_as_a_preview() -> None:
    # A Write of a 100 KB file: the coordinator refuses a tool input over 64 KiB, and an ask
    # it refuses would be retried for ever (the agent left waiting), so the record keeps a preview.
    assert record_tool_input({"command": "ls"}) == '{"command":"ls"}'
    stored = json.loads(record_tool_input({"content": "é" * 60_000}))
    assert stored["truncated"] is True and stored["bytes"] == len(json.dumps({"content": "é" * 60_000},
                                                                            separators=(",", ":"), ensure_ascii=False).encode())
    assert stored["preview"].startswith('{"content":"éé') and len(record_tool_input({"content": "é" * 60_000}).encode()) < 9000
    # A lone surrogate from the journal (JSON "\ud800") cannot go in a UTF-8 record as is.
    odd = record_tool_input(json.loads('{"x":"\\ud800"}'))
    odd.encode()
    assert json.loads(odd) == {"x": "\ud800"}


def test_an_ask_the_record_has_no_room_for_is_denied_with_why() -> None:
    desk = _desk()
    desk.saw(_translate(INIT, TOOL_USE, ASK))
    desk.refuse("req-1", NO_ROOM)
    [d] = desk.actions(0.0)
    inner = json.loads(d.payload)["response"]["response"]
    assert isinstance(d, Deliver) and inner == {"behavior": "deny", "message": NO_ROOM}
