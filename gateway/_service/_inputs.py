"""Inputs to a live run from its users (docs/hitl.md): answering a tool approval, steering a
message into the running turn, and the JSON view of a run's inputs.

Both writes are one ``PutRunInput`` of the coordinator: the answer is stored (and fenced:
the first answer wins) before anything reaches the agent; the host holding the run's claim
watches the record and delivers it. Nothing here talks to a host, so any gateway can answer.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from baton import errors as e
from baton.ids import validate_id, validate_input_id
from baton.runs import MAX_INPUT_PAYLOAD, MAX_INPUT_TEXT, MAX_RUN_INPUTS
from baton.v1 import coordinator_pb2, runs_pb2
from gateway._service._requests import MAX_JSON_DEPTH, json_depth
from gateway._state import GatewayState

Op = coordinator_pb2.PutRunInputRequest
Out = coordinator_pb2.PutRunInputResponse

#: Agent kinds whose process reads messages while it runs (the others: 409 STEER_UNSUPPORTED).
STEERABLE_AGENTS = ("claude-code", "replay")


#: Bytes of a payload's JSON besides the text it carries (the stream-json ``user`` line's
#: or the ``control_response``'s fields).
_PAYLOAD_FRAME = 512


def _checked_text(value: Any, field: str, *, empty_ok: bool) -> str:
    """``value`` as a text an inbox line can carry: a string of at most
    :data:`MAX_INPUT_TEXT` UTF-8 bytes whose escaped JSON fits :data:`MAX_INPUT_PAYLOAD`.

    Raises:
        InvalidArgument: not a string, empty (unless ``empty_ok``), lone surrogates, too long.
    """
    if not isinstance(value, str) or (not empty_ok and not value.strip()):
        raise e.InvalidArgument(field, f"must be a non-empty string of at most {MAX_INPUT_TEXT} bytes")
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        raise e.InvalidArgument(field, "must be valid Unicode text (it holds a lone surrogate)") from None
    escaped = len(json.dumps(value, ensure_ascii=False).encode())
    if size > MAX_INPUT_TEXT or escaped + _PAYLOAD_FRAME > MAX_INPUT_PAYLOAD:
        raise e.InvalidArgument(field, f"must be at most {MAX_INPUT_TEXT} bytes, and at most "
                                       f"{MAX_INPUT_PAYLOAD - _PAYLOAD_FRAME} bytes once escaped as JSON")
    return value


def _parsed(raw: str) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def input_json(given: runs_pb2.RunInput) -> dict[str, Any]:
    """The public view of one input (``GET /api/runs/{id}``'s ``inputs[]``), camelCase.

    Approval: ``{id, kind: "approval", state: "pending"|"answered", toolCallId, toolName,
    input, requestedAt, expiresAt}`` and, once answered, ``decision`` ("allow"|"deny"),
    ``approved``, ``message``, ``answeredBy`` ("user"|"expired"), ``answeredAt``,
    ``updatedInput``. Message: ``{id, kind: "message", state, message, requestedAt}``.
    Times are Unix seconds.
    """
    out: dict[str, Any] = {"id": given.id, "kind": given.kind, "state": given.state,
                           "requestedAt": given.requested_at or None}
    if given.kind == "approval":
        out.update(toolCallId=given.tool_call_id, toolName=given.tool_name,
                   input=_parsed(given.tool_input_json), expiresAt=given.expires_at or None)
        if given.state == "answered":
            out.update(decision=given.decision, approved=given.decision == "allow",
                       message=given.message or None, answeredBy=given.answered_by,
                       answeredAt=given.answered_at or None)
            if given.updated_input_json:
                out["updatedInput"] = _parsed(given.updated_input_json)
    else:
        out["message"] = given.message
    return out


def awaiting_approval(record: runs_pb2.RunRecord) -> bool:
    """Whether an approval the run's agent asked for waits for an answer (a run that ended
    waits for nothing: an approval left pending by a cancel stays ``pending`` in ``inputs``)."""
    return record.status == runs_pb2.RUN_STATUS_RUNNING and any(
        i.kind == "approval" and i.state == "pending" for i in record.inputs)


@dataclass(frozen=True)
class ApprovalAnswer:
    """A user's answer to one approval, checked.

    Attributes:
        run_id, approval_id: which approval.
        approved: allow (true) or deny.
        message: the reason ("" = none; the agent sees it on a denial).
        updated_input_json: with ``approved``, the tool input to use instead ("" = as asked).
    """

    run_id: str
    approval_id: str
    approved: bool
    message: str = ""
    updated_input_json: str = ""


def approval_answer(run_id: Any, approval_id: Any, approved: Any, message: Any = None,
                    updated_input: Any = None) -> ApprovalAnswer:
    """Check an answer's parts as any edge received them (``updated_input``: a JSON object
    or ``None``).

    Raises:
        InvalidArgument: a bad id, ``approved`` not a boolean, ``message`` not a text an
            inbox line can carry (``_checked_text``), ``updated_input`` not an object, too deep or
            too large, or given with a denial.
    """
    validate_id(run_id, "runId")
    validate_input_id(approval_id, "approvalId")
    if not isinstance(approved, bool):
        raise e.InvalidArgument("approved", "must be true or false")
    if message is None:
        message = ""
    message = _checked_text(message, "message", empty_ok=True)
    raw = ""
    if updated_input is not None:
        if not approved:
            raise e.InvalidArgument("updatedInput", "only goes with approved: true")
        if not isinstance(updated_input, dict) or json_depth(updated_input) > MAX_JSON_DEPTH:
            raise e.InvalidArgument("updatedInput", f"must be a JSON object at most {MAX_JSON_DEPTH} deep")
        try:
            raw = json.dumps(updated_input, separators=(",", ":"), ensure_ascii=False)
            raw_size = len(raw.encode())
        except UnicodeEncodeError:
            raise e.InvalidArgument("updatedInput", "must be valid Unicode text (it holds a lone surrogate)") from None
        if raw_size > MAX_INPUT_TEXT:
            raise e.InvalidArgument("updatedInput", f"must be at most {MAX_INPUT_TEXT} bytes as JSON")
    return ApprovalAnswer(run_id, approval_id, approved, message, raw)


@dataclass(frozen=True)
class SteerRequest:
    """A message into a run's running turn, checked (``input_id``: the client's, or minted)."""

    run_id: str
    text: str
    input_id: str


def steer_request(run_id: Any, text: Any, input_id: Any = None) -> SteerRequest:
    """Check a steer's parts; mint an input id when the client sent none.

    Raises:
        InvalidArgument: a bad run or input id; ``text`` empty, not a string, holding a
            lone surrogate, over :data:`MAX_INPUT_TEXT` bytes or too long once escaped.
    """
    validate_id(run_id, "runId")
    text = _checked_text(text, "content", empty_ok=False)
    if input_id is None or input_id == "":
        input_id = f"msg-{uuid.uuid4().hex}"
    validate_input_id(input_id, "id")
    return SteerRequest(run_id, text, input_id)


def _raise_for(outcome: int, run_id: str, input_id: str, existing: runs_pb2.RunInput | None,
               limit: int = 0) -> None:
    if outcome == Out.NOT_FOUND:
        raise e.ApprovalNotFound(run_id, input_id)
    if outcome == Out.ENDED:
        raise e.RunEnded(run_id)
    if outcome == Out.CONFLICT:
        assert existing is not None
        raise e.ApprovalAlreadyAnswered(run_id, input_id, json.dumps(input_json(existing), separators=(",", ":")))
    if outcome == Out.TOO_MANY:
        raise e.TooManyInputs(run_id, limit)
    if outcome != Out.OK:
        raise e.StoreUnavailable(f"unexpected input outcome {outcome}")


async def answer(st: GatewayState, tenant: str, req: ApprovalAnswer) -> runs_pb2.RunInput:
    """Store the answer (the first wins); the run's host delivers it to the agent.

    Returns:
        The approval as stored after the answer.

    Raises:
        ApprovalNotFound: no such run or approval for ``tenant``.
        ApprovalAlreadyAnswered: answered (or expired) before: carries the stored answer.
        RunEnded: the run has ended.
        TooManyInputs: the answer would take the run's record past its byte budget.
    """
    given = runs_pb2.RunInput(id=req.approval_id, decision="allow" if req.approved else "deny",
                              message=req.message, answered_by="user", answered_at=time.time(),
                              updated_input_json=req.updated_input_json)
    scope = tenant if st.settings.auth_enabled else ""
    outcome, record, existing = await st.coordinator.put_run_input(req.run_id, Op.ANSWER, given, tenant=scope)
    _raise_for(outcome, req.run_id, req.approval_id, existing, MAX_RUN_INPUTS)
    stored: runs_pb2.RunInput = next(i for i in record.inputs if i.id == req.approval_id and i.kind == "approval")
    return stored


async def steer(st: GatewayState, tenant: str, req: SteerRequest) -> runs_pb2.RunInput:
    """Store the message for the run's running turn; the run's host delivers it once.

    Returns:
        The message as stored.

    Raises:
        UnknownRun: no such run for ``tenant``.
        SteerUnsupported: the run's agent cannot take a message while it runs.
        RunEnded: the run has ended.
        InputIdTaken: one of the run's approvals has the message's id.
        TooManyInputs: the run holds the most inputs it may (by count, or by the bytes of
            its record: ``MAX_RECORD_BYTES``).
    """
    view = await st.coordinator.get_run(req.run_id)
    if st.settings.auth_enabled and view.record.tenant != tenant:
        raise e.UnknownRun(req.run_id)
    if view.record.agent.kind not in STEERABLE_AGENTS:
        raise e.SteerUnsupported(req.run_id, view.record.agent.kind or "unknown")
    given = runs_pb2.RunInput(id=req.input_id, message=req.text, requested_at=time.time())
    scope = tenant if st.settings.auth_enabled else ""
    outcome, record, existing = await st.coordinator.put_run_input(req.run_id, Op.STEER, given, tenant=scope)
    if outcome == Out.NOT_FOUND:
        raise e.UnknownRun(req.run_id)
    if outcome == Out.CONFLICT:
        raise e.InputIdTaken(req.run_id, req.input_id)
    _raise_for(outcome, req.run_id, req.input_id, existing, MAX_RUN_INPUTS)
    stored: runs_pb2.RunInput = next(i for i in record.inputs if i.id == req.input_id)
    return stored
