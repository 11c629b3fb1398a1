"""Human-in-the-loop lines of a journal → AG-UI chunks (pure; docs/hitl.md).

Two journal lines carry the exchange between an agent and its user while a turn runs:

- the agent's **ask**: Claude Code's stream-json control protocol writes
  ``{"type":"control_request","request_id":R,"request":{"subtype":"can_use_tool",
  "tool_name":N,"input":{…},"tool_use_id":T,…}}`` on stdout and waits for the answer on
  stdin (the replay agent plays recorded ones the same way);
- what reached the agent's stdin: the launch wrapper's relay writes
  ``{"type":"baton_input","id":I,"input":<the line it passed on>}`` into the journal just
  before the agent reads it. ``input`` is a ``control_response`` (an approval's answer,
  ``id`` = the request id) or a stream-json ``user`` message (a message steered into the
  running turn, ``id`` = the client's input id).

Both become chunks at their place in the journal, so every host that replays it produces
the same ones (the transcript shows them where they happened):

- an ask → ``CUSTOM approval-requested`` ``{toolCallId, toolName, input, approval: {id,
  needsApproval: true}}`` (the event ``@tanstack/ai-client`` turns into a tool-call part in
  state ``approval-requested``), then ``ACTIVITY_SNAPSHOT`` ``approval:<id>`` (activity type
  ``approval``) whose content holds the same and ``interrupt``, shaped as AG-UI's
  ``Interrupt`` (``id``, ``reason: "tool_approval"``, ``message``, ``toolCallId``);
- an answer → ``ACTIVITY_SNAPSHOT`` ``approval:<id>:answer`` (activity type
  ``approval_answer``) ``{approvalId, toolCallId, approved, message?}``;
- a steered message → a ``role: "user"`` text message ``input:<id>`` (``TEXT_MESSAGE_START`` /
  ``CONTENT`` / ``END``).

A resumed agent process (its predecessor died while the call waited) asks again for the same
call: same ``tool_use_id``, or a new one with the same tool and input (docs/hitl.md). That is
the same approval, not a new one: → ``CUSTOM approval.reasked`` ``{approvalId, requestId,
toolCallId}`` (the host answers ``requestId`` with the stored answer), and its answer's
activity names the approval (``approval:<approval id>:answer``). An approval's answer activity
appears once: when the answer already reached the journal (the dead process's relay passed it
on just before it went), the resumed process's copy becomes ``CUSTOM approval.redelivered``
``{approvalId, requestId}`` instead. Except for an **allow** that reached the dead process: it
may have run the call before it died (its result not written yet), so the stored allow is not
given again (that would run it twice): the new ask is a new approval the user answers, after
``CUSTOM approval.asked_again`` ``{approvalId, previousApprovalId, toolCallId, mayHaveRun: true}``.

The expiry time of an approval is not in the chunks (it is the host's clock, not the
journal's); it is on the run record (``RunRecord.inputs``).
"""
from __future__ import annotations

from typing import Any, Callable

from baton.ids import input_id_for

Chunk = dict[str, Any]

#: CUSTOM name of an approval request (``@tanstack/ai``'s stream processor name for it).
APPROVAL_REQUESTED = "approval-requested"
#: CUSTOM name of a resumed agent process's repeated ask.
APPROVAL_REASKED = "approval.reasked"
#: CUSTOM name of an answer passed again to a resumed agent process.
APPROVAL_REDELIVERED = "approval.redelivered"
#: CUSTOM name of a resumed process's ask for a call its predecessor was allowed (a new approval).
APPROVAL_ASKED_AGAIN = "approval.asked_again"
#: Activity types of the request and of its answer.
APPROVAL_ACTIVITY = "approval"
ANSWER_ACTIVITY = "approval_answer"
#: Message id prefixes (``approval:<id>``, ``approval:<id>:answer``, ``input:<id>``).
APPROVAL_PREFIX = "approval:"
STEER_PREFIX = "input:"


def approval_message_id(approval_id: str) -> str:
    """The activity message id of an approval request."""
    return f"{APPROVAL_PREFIX}{approval_id}"


def answer_message_id(approval_id: str) -> str:
    """The activity message id of an approval's answer."""
    return f"{APPROVAL_PREFIX}{approval_id}:answer"


def steer_message_id(input_id: str) -> str:
    """The user message id of a steered message."""
    return f"{STEER_PREFIX}{input_id}"


def ask_chunks(obj: dict[str, Any]) -> list[Chunk] | None:
    """The chunks of a ``control_request`` line, or ``None`` when it is not a tool approval
    (another control subtype: the caller reports it as it did before).

    Shapes: see the module docstring. ``input`` is the tool's input as the agent asked
    (``{}`` when absent or not an object). The approval's id is the request id when it is an
    input id (:func:`baton.ids.validate_input_id`: a user must be able to name it in a URL,
    the inbox to carry it), else one derived from it (:func:`baton.ids.input_id_for`, the same
    on every replay); then the request id itself is in the ``CUSTOM`` value as ``requestId``
    (what the agent is answered under).
    """
    req = obj.get("request")
    rid = obj.get("request_id")
    if not isinstance(req, dict) or req.get("subtype") != "can_use_tool" or not isinstance(rid, str) or not rid:
        return None
    name = req.get("tool_name")
    name = name if isinstance(name, str) else ""
    inp = req.get("input")
    inp = inp if isinstance(inp, dict) else {}
    tcid = req.get("tool_use_id")
    tcid = tcid if isinstance(tcid, str) and tcid else None
    reason = req.get("decision_reason")
    message = f"Allow {name or 'this tool'}?" + (f" ({reason})" if isinstance(reason, str) and reason else "")
    aid = input_id_for(rid)
    interrupt: dict[str, Any] = {"id": aid, "reason": "tool_approval", "message": message}
    if tcid is not None:
        interrupt["toolCallId"] = tcid
    request: dict[str, Any] = {"toolCallId": tcid, "toolName": name, "input": inp,
                               "approval": {"id": aid, "needsApproval": True}}
    if aid != rid:
        request["requestId"] = rid
    content = {"approvalId": aid, "toolCallId": tcid, "toolName": name, "input": inp, "interrupt": interrupt}
    return [
        {"type": "CUSTOM", "name": APPROVAL_REQUESTED, "value": request},
        {"type": "ACTIVITY_SNAPSHOT", "messageId": approval_message_id(aid), "activityType": APPROVAL_ACTIVITY,
         "content": content, "replace": True},
    ]


def reask_chunk(approval_id: str, request_id: str, tool_call_id: str | None) -> Chunk:
    """The chunk of a repeated ask (see the module docstring)."""
    return {"type": "CUSTOM", "name": APPROVAL_REASKED,
            "value": {"approvalId": approval_id, "requestId": request_id, "toolCallId": tool_call_id}}


def asked_again_chunk(approval_id: str, previous: str, tool_call_id: str | None) -> Chunk:
    """The notice before a new approval for a call an earlier process was allowed (see the
    module docstring)."""
    return {"type": "CUSTOM", "name": APPROVAL_ASKED_AGAIN,
            "value": {"approvalId": approval_id, "previousApprovalId": previous, "toolCallId": tool_call_id,
                      "mayHaveRun": True}}


def _user_text(message: Any) -> str | None:
    """The text of a stream-json user message's ``message`` (string or text blocks)."""
    if not isinstance(message, dict):
        return None
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text")
    return None


def input_chunks(obj: dict[str, Any], tool_call_of: Callable[[str], str | None],
                 approval_of: dict[str, str] | None = None, answered: dict[str, bool] | None = None) -> list[Chunk]:
    """The chunks of a ``baton_input`` line (what reached the agent's stdin, and where).

    Args:
        obj: the line.
        tool_call_of: the tool call id an approval id gates (from its ask), ``None`` if unknown.
        approval_of: a request id → the approval it answers (a repeated ask's, or one whose
            approval id was derived from it).
        answered: approvals whose answer activity was already emitted → approved; updated in
            place (an answer to one of them becomes ``approval.redelivered``).

    Returns:
        An answer's activity, a steered user message, or ``[]`` for an input of another
        shape (never raises).
    """
    iid, payload = obj.get("id"), obj.get("input")
    if not isinstance(iid, str) or not iid or not isinstance(payload, dict):
        return []
    if payload.get("type") == "control_response":
        resp = payload.get("response")
        resp = resp if isinstance(resp, dict) else {}
        inner = resp.get("response")
        inner = inner if isinstance(inner, dict) else {}
        given = resp.get("request_id")
        rid: str = given if isinstance(given, str) and given else iid
        tool_call = tool_call_of(rid)
        request_id, rid = rid, (approval_of or {}).get(rid) or input_id_for(rid)
        approved = inner.get("behavior") == "allow"
        if answered is not None:
            if rid in answered:
                return [{"type": "CUSTOM", "name": APPROVAL_REDELIVERED,
                         "value": {"approvalId": rid, "requestId": request_id}}]
            answered[rid] = approved
        content: dict[str, Any] = {"approvalId": rid, "toolCallId": tool_call or tool_call_of(rid), "approved": approved}
        msg = inner.get("message")
        if isinstance(msg, str) and msg:
            content["message"] = msg
        return [{"type": "ACTIVITY_SNAPSHOT", "messageId": answer_message_id(rid), "activityType": ANSWER_ACTIVITY,
                 "content": content, "replace": True}]
    if payload.get("type") == "user":
        text = _user_text(payload.get("message"))
        if text is None:
            return []
        mid = steer_message_id(iid)
        out: list[Chunk] = [{"type": "TEXT_MESSAGE_START", "messageId": mid, "role": "user"}]
        if text:
            out.append({"type": "TEXT_MESSAGE_CONTENT", "messageId": mid, "delta": text})
        out.append({"type": "TEXT_MESSAGE_END", "messageId": mid})
        return out
    return []
