"""The inputs of a live run: which approvals to register, deliver or expire, and when the
agent's input closes (pure; docs/hitl.md).

A host driving a run keeps one :class:`InputDesk`. It learns from two sides:

- the run's chunks as the replay pipeline produces them (stored and new alike), which say
  what the agent asked (``approval-requested``), what reached its stdin (an answer's
  ``approval_answer`` activity, a steered ``input:<id>`` user message) and where a turn
  ended (``CUSTOM claude.result``): the journal is the truth of what was delivered;
- the run record's ``inputs`` (``RunRecord.inputs``, from ``WatchRun``): which approvals are
  answered (one answer wins, stored before delivery) and which messages wait to be steered in.

From both it decides (:meth:`InputDesk.actions`):

- :class:`Register`: an approval the agent asked for that the record does not hold yet: the
  host writes it to the record (with its expiry) **before** the chunk is appended to the log,
  so no reader sees a request that cannot be answered;
- :class:`Deliver`: an answered approval, or a pending message, not yet seen on the agent's
  stdin: the host appends it to the sandbox's inbox (the relay passes each id once, so a
  repeated delivery, by this host or a successor, is harmless);
- :class:`Expire`: a pending approval whose ``expires_at`` passed: the host stores the
  denial (fail closed; an answer stored first wins);
- :class:`CloseInput`: the agent's turn ended (a ``result`` after every delivered input) and
  nothing waits to be delivered: its stdin is closed so it exits (claude-code only; a replay
  agent ends by itself).

When the agent's process ends while its turn waits on an approval (:meth:`InputDesk.resume_wanted`),
the host relaunches it with ``--resume`` (:mod:`sandbox_host.agent_resume`) and tells the desk
(:meth:`InputDesk.restarted`): what it appended to the dead process's inbox is sent again, and
the approvals it waited on are answered again once the new process asks again
(``approval.reasked``: its request id is the one answered), exactly once for that process.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from baton.ids import input_id_for
from baton.runs import MAX_INPUT_TEXT
from sandbox_host.translate._inputs import (
    ANSWER_ACTIVITY, APPROVAL_ACTIVITY, APPROVAL_REASKED, APPROVAL_REDELIVERED, APPROVAL_REQUESTED, STEER_PREFIX,
)

#: The inbox id that closes the agent's stdin (sandbox_host/_wrapper.py).
EOF_ID = "eof"
#: CUSTOM chunk that ends a Claude turn, and the one that starts its process (or turn).
TURN_RESULT = "claude.result"
AGENT_INIT = "claude.init"


@dataclass(frozen=True)
class Ask:
    """An approval the agent asked for (from its ``approval-requested`` chunk)."""

    id: str
    tool_call_id: str
    tool_name: str
    input: Any


@dataclass(frozen=True)
class Register:
    """Store ``ask`` on the run record, expiring at ``expires_at`` (seconds since the epoch)."""

    ask: Ask
    expires_at: float


@dataclass(frozen=True)
class Deliver:
    """Append ``payload`` (one compact JSON line) under ``input_id`` to the agent's inbox.

    ``key`` is the record's input id when it differs (an approval answered under the request
    id of its repeated ask)."""

    input_id: str
    payload: bytes
    key: str = ""


@dataclass(frozen=True)
class Expire:
    """Store the expiry (a denial) of the pending approval ``approval_id``."""

    approval_id: str


@dataclass(frozen=True)
class CloseInput:
    """Close the agent's stdin (its turn is over and nothing waits)."""


Action = Register | Deliver | Expire | CloseInput


def _compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def answer_payload(approval_id: str, decision: str, message: str, updated_input: Any) -> bytes:
    """The ``control_response`` line Claude Code reads for an approval's answer.

    Args:
        approval_id: the request id.
        decision: ``"allow"`` or ``"deny"``.
        message: why it was denied (deny only; a default is used when empty).
        updated_input: the tool input to run with (allow only).
    """
    if decision == "allow":
        inner: dict[str, Any] = {"behavior": "allow", "updatedInput": updated_input if updated_input is not None else {}}
    else:
        inner = {"behavior": "deny", "message": message or "The user denied this tool use."}
    return _compact({"type": "control_response",
                     "response": {"subtype": "success", "request_id": approval_id, "response": inner}})


def steer_payload(text: str) -> bytes:
    """The stream-json ``user`` line of a steered message."""
    return _compact({"type": "user", "message": {"role": "user", "content": text},
                     "parent_tool_use_id": None, "session_id": ""})


#: What the agent is told when its ask cannot be stored (its id is a message's of the run).
ID_TAKEN = "This request could not be put to the user (its id is taken), so the tool is denied."
#: ... or when the run's record has no room left for it (``MAX_RECORD_BYTES``).
NO_ROOM = "This request could not be put to the user (the run holds too many inputs), so the tool is denied."
#: Bytes of a tool input's JSON the record keeps as is (``MAX_INPUT_TEXT``); a larger one is
#: kept as a preview (the log's ``approval-requested`` chunk has it whole).
_PREVIEW = 8 * 1024


def record_tool_input(value: Any) -> str:
    """The JSON of an ask's tool input as the run record stores it: compact, at most
    :data:`~baton.runs.MAX_INPUT_TEXT` bytes of UTF-8 (the coordinator refuses more).

    An input too large becomes ``{"truncated": true, "bytes": <its size>, "preview": <its
    first 8 KiB of JSON>}``; lone surrogates (which the record's UTF-8 cannot hold) stay as
    ``\\u`` escapes. Never raises.
    """
    raw = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    try:
        size = len(raw.encode())
    except UnicodeEncodeError:
        raw = json.dumps(value, separators=(",", ":"))
        size = len(raw)
    if size <= MAX_INPUT_TEXT:
        return raw
    preview = raw.encode("utf-8", "backslashreplace")[:_PREVIEW].decode("utf-8", "ignore")
    # At most 6 bytes of JSON per byte of preview (a control character's \\u escape): < 64 KiB.
    return json.dumps({"truncated": True, "bytes": size, "preview": preview}, separators=(",", ":"), ensure_ascii=False)


#: The desk's key of a refused ask's denial (its id may be a message's too).
REFUSED_KEY = "refused:"


#: A request id the relay can carry as is, else one derived from it (the same on every host;
#: the approval id of an ask whose request id is not an input id is that derived one too).
_safe_inbox_id = input_id_for


@dataclass
class InputDesk:
    """The inputs of one driven run (see the module docstring).

    Args:
        approval_timeout: seconds an approval may wait for its answer.
        closes_input: the agent reads stdin until EOF (claude-code): close it after its turn.
    """

    approval_timeout: float
    closes_input: bool = False
    asks: dict[str, Ask] = field(default_factory=dict)
    delivered: set[str] = field(default_factory=set)
    #: Inputs appended to the inbox by this host (not yet seen back in the journal).
    sent: set[str] = field(default_factory=set)
    registered: set[str] = field(default_factory=set)
    expiring: set[str] = field(default_factory=set)
    #: The record's inputs by id (protobuf ``RunInput`` or anything with its fields).
    record: dict[str, Any] = field(default_factory=dict)
    turn_over: bool = False
    closed: bool = False
    #: The agent session its ``init`` announced (what a relaunch resumes).
    agent_session: str = ""
    #: Tool call ids with a result in the journal.
    tool_results: set[str] = field(default_factory=set)
    #: Approval id → the request id of its latest (repeated) ask.
    request_ids: dict[str, str] = field(default_factory=dict)
    #: Approvals a relaunched process has not asked again yet, and those its turn ended without.
    awaiting_reask: set[str] = field(default_factory=set)
    abandoned: set[str] = field(default_factory=set)
    #: Asks the record refused (their id is a message's): denied to the agent (fail closed).
    refused: set[str] = field(default_factory=set)
    #: Why each refused ask was refused (what the agent is told).
    refused_why: dict[str, str] = field(default_factory=dict)
    refused_done: set[str] = field(default_factory=set)
    _ask_order: list[str] = field(default_factory=list)

    # --- what the journal says ---------------------------------------------------------

    def saw(self, chunks: Iterable[dict[str, Any]]) -> list[Ask]:
        """Learn from chunks in log order; returns the asks among them the record lacks
        (to :class:`Register` before these chunks are appended)."""
        new: list[Ask] = []
        for c in chunks:
            t = c.get("type")
            if t == "CUSTOM":
                name = c.get("name")
                if name == APPROVAL_REQUESTED:
                    ask = _ask_of(c.get("value"))
                    if ask is not None and ask.id not in self.asks:
                        raw = (c.get("value") or {}).get("requestId")
                        if isinstance(raw, str) and raw:
                            # An ask whose request id is not an input id goes under a derived
                            # approval id; the agent is answered under its own request id.
                            self.request_ids.setdefault(ask.id, raw)
                        self.asks[ask.id] = ask
                        self._ask_order.append(ask.id)
                        self.turn_over = False
                        if ask.id not in self.record and ask.id not in self.registered:
                            new.append(ask)
                elif name == TURN_RESULT:
                    self.turn_over = True
                    self.abandoned |= self.awaiting_reask
                    self.awaiting_reask.clear()
                elif name == APPROVAL_REASKED:
                    value = c.get("value") or {}
                    aid, rid = value.get("approvalId"), value.get("requestId")
                    if isinstance(aid, str) and isinstance(rid, str) and aid in self.asks:
                        # The new process waits on it: its answer goes to it under ``rid``.
                        self.request_ids[aid] = rid
                        self.delivered.discard(aid)
                        self.sent.discard(aid)
                        self.awaiting_reask.discard(aid)
                        self.abandoned.discard(aid)
                        self.turn_over = False
                elif name == APPROVAL_REDELIVERED:
                    aid = (c.get("value") or {}).get("approvalId")
                    if isinstance(aid, str):
                        self.delivered.add(aid)
                        if aid in self.refused:
                            self.refused_done.add(aid)
                elif name == AGENT_INIT:
                    value = c.get("value") or {}
                    if isinstance(value.get("session_id"), str):
                        self.agent_session = value["session_id"]
            elif t == "TOOL_CALL_RESULT" and isinstance(c.get("toolCallId"), str):
                self.tool_results.add(c["toolCallId"])
            elif t == "ACTIVITY_SNAPSHOT" and c.get("activityType") == ANSWER_ACTIVITY:
                content = c.get("content")
                if isinstance(content, dict) and isinstance(content.get("approvalId"), str):
                    self.delivered.add(content["approvalId"])
                    if content["approvalId"] in self.refused:
                        self.refused_done.add(content["approvalId"])
            elif t == "TEXT_MESSAGE_START" and c.get("role") == "user":
                mid = c.get("messageId")
                if isinstance(mid, str) and mid.startswith(STEER_PREFIX):
                    self.delivered.add(mid[len(STEER_PREFIX):])
                    self.turn_over = False
            elif t in ("STEP_STARTED", "TEXT_MESSAGE_START", "TOOL_CALL_START"):
                if t != "TEXT_MESSAGE_START" or c.get("role") in (None, "assistant"):
                    self.turn_over = False
            elif t == "ACTIVITY_SNAPSHOT" and c.get("activityType") == APPROVAL_ACTIVITY:
                pass
        return new

    def registered_ask(self, ask_id: str) -> None:
        """The record now holds ``ask_id`` (its :class:`Register` was stored)."""
        self.registered.add(ask_id)

    # --- what the record says ----------------------------------------------------------

    def on_record(self, inputs: Sequence[Any]) -> None:
        """The record's ``inputs`` as of now (a ``WatchRun`` change or a write's result)."""
        self.record = {i.id: i for i in inputs}
        self.registered.update(i for i in self.record if self.record[i].kind == "approval")

    # --- decisions ---------------------------------------------------------------------

    def pending_approvals(self) -> list[str]:
        """Ids of approvals asked and not answered on the record, in ask order."""
        out = []
        for aid in self._ask_order:
            rec = self.record.get(aid)
            if aid in self.abandoned or aid in self.refused_done:
                continue
            if aid in self.refused:
                out.append(aid)
                continue
            if aid not in self.delivered and (rec is None or rec.state != "answered"):
                out.append(aid)
        return out

    def unresolved_asks(self) -> list[str]:
        """Approvals whose tool call has no result yet (the agent still waits on them, or
        was about to run the call), in ask order."""
        out = []
        for aid in self._ask_order:
            ask = self.asks[aid]
            done = ask.tool_call_id in self.tool_results if ask.tool_call_id else aid in self.delivered
            if not done and aid not in self.abandoned:
                out.append(aid)
        return out

    def resume_wanted(self) -> bool:
        """Whether an agent process that ended now should be relaunched with ``--resume``:
        its turn was not over and waited on an approval (claude-code, whose session is known)."""
        return (self.closes_input and not self.turn_over and bool(self.agent_session)
                and bool(self.unresolved_asks()))

    def restarted(self) -> None:
        """The agent's process was relaunched (a resume marker in the journal): what was
        appended to the old inbox and never reached it is sent again, and the approvals it
        waited on wait for the new process to ask again."""
        self.sent.clear()
        self.closed = False
        self.turn_over = False
        self.awaiting_reask = set(self.unresolved_asks())

    def actions(self, now: float) -> list[Action]:
        """What to do now (each action at most once per call; the caller reports results
        through :meth:`sent_input`, :meth:`expiry_sent`, :meth:`on_record`)."""
        out: list[Action] = []
        for aid in self._ask_order:
            if aid not in self.record and aid not in self.registered:
                out.append(Register(self.asks[aid], now + self.approval_timeout))
        waiting = False
        for aid in sorted(self.refused - self.refused_done):
            if REFUSED_KEY + aid not in self.sent:
                rid = self.request_ids.get(aid, aid)
                why = self.refused_why.get(aid, ID_TAKEN)
                out.append(Deliver(self.inbox_id(rid), answer_payload(rid, "deny", why, None),
                                   key=REFUSED_KEY + aid))
        for rec in self.record.values():
            if rec.id in self.delivered or rec.id in self.abandoned:
                continue
            if rec.kind == "approval":
                if rec.id not in self.asks:
                    continue  # asked by a process this journal does not show (never delivered blind)
                if rec.state == "answered":
                    if rec.id not in self.sent and rec.id not in self.awaiting_reask:
                        rid = self.request_ids.get(rec.id, rec.id)
                        out.append(Deliver(self.inbox_id(rid), answer_payload(rid, rec.decision, rec.message,
                                                               _json_or(rec.updated_input_json, self.asks[rec.id].input)),
                                           key=rec.id))
                    waiting = rec.id not in self.awaiting_reask or waiting
                elif rec.expires_at and rec.expires_at <= now and rec.id not in self.expiring:
                    out.append(Expire(rec.id))
            elif rec.kind == "message" and not self.closed:
                if rec.id not in self.sent:
                    out.append(Deliver(rec.id, steer_payload(rec.message)))
                waiting = True
        if (self.closes_input and self.turn_over and not self.closed and not waiting
                and not self.pending_approvals()):
            out.append(CloseInput())
        return out

    def inbox_id(self, request_id: str) -> str:
        """The inbox id an answer to ``request_id`` goes under: the request id, unless the
        relay cannot carry it or a message of the run has it (the relay passes each id once),
        then one derived from it."""
        rec = self.record.get(request_id)
        if rec is not None and rec.kind == "message":
            return "a-" + hashlib.sha256(request_id.encode("utf-8", "surrogatepass")).hexdigest()[:40]
        return _safe_inbox_id(request_id)

    def refuse(self, approval_id: str, why: str = ID_TAKEN) -> None:
        """The record refused the ask ``approval_id`` (its id is a message's, or the record
        has no room for it): the agent gets a denial saying ``why``."""
        self.refused.add(approval_id)
        self.refused_why[approval_id] = why
        self.registered.add(approval_id)

    def next_deadline(self) -> float | None:
        """The earliest ``expires_at`` of a pending approval (seconds since the epoch)."""
        times = [r.expires_at for r in self.record.values()
                 if r.kind == "approval" and r.state != "answered" and r.expires_at and r.id not in self.delivered
                 and r.id not in self.abandoned]
        return min(times) if times else None

    def sent_input(self, input_id: str) -> None:
        """``input_id`` was appended to the inbox (``eof`` closes it)."""
        if input_id == EOF_ID:
            self.closed = True
        else:
            self.sent.add(input_id)

    def expiry_sent(self, approval_id: str) -> None:
        """The expiry of ``approval_id`` was stored (or lost to an answer)."""
        self.expiring.add(approval_id)


def _ask_of(value: Any) -> Ask | None:
    if not isinstance(value, dict):
        return None
    approval = value.get("approval")
    aid = approval.get("id") if isinstance(approval, dict) else None
    if not isinstance(aid, str) or not aid:
        return None
    tcid = value.get("toolCallId")
    return Ask(aid, tcid if isinstance(tcid, str) else "", str(value.get("toolName") or ""), value.get("input"))


def _json_or(text: str, default: Any) -> Any:
    if not text:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default
