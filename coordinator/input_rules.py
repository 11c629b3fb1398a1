"""The rule of a run's inputs from people, pure (docs/hitl.md §"The record"): the approvals its
agent asks for, their answers and expiries, the messages steered into its running turn, and
the close of its input once the turn is over. One :func:`put_input` per ``PutRunInput``,
bound into :meth:`coordinator._store.RunStore.mutate` as the rules of
:mod:`coordinator.rules` are, and table-tested without servers
(tests/coordinator/test_input_rules.py).
"""
from __future__ import annotations

from baton.runs import MAX_RECORD_BYTES, MAX_RUN_INPUTS
from baton.v1.coordinator_pb2 import PutRunInputRequest, PutRunInputResponse
from baton.v1.runs_pb2 import RunInput, RunRecord

from coordinator import _etcd as E
from coordinator._keys import Keys
from coordinator._records import is_terminal
from coordinator.rules import Plan, Snapshot, _copy, claim_of, holds

#: The deny reason of an approval nobody answered in time (fail closed).
EXPIRED_MESSAGE = "the approval expired"

_Op = PutRunInputRequest
_Out = PutRunInputResponse
#: (outcome, the record after the op or as found, the stored input on a conflict)
InputResult = tuple[int, RunRecord | None, RunInput | None]


def _find_input(rec: RunRecord, input_id: str, kind: str | None = None) -> int:
    """Index of the input ``input_id`` (of ``kind`` when given) in ``rec.inputs``, or -1."""
    for i, existing in enumerate(rec.inputs):
        if existing.id == input_id and (kind is None or existing.kind == kind):
            return i
    return -1


def put_input(snap: Snapshot, *, keys: Keys, op: int, given: RunInput, tenant: str = "",
              session_id: int = 0, epoch: int = 0, now: float = 0.0,
              known_inputs: int = 0) -> Plan[InputResult]:
    """One input op on a run's record (docs/hitl.md §"The record").

    Ops (``PutRunInputRequest.Op``):
      - ``REQUEST`` (the claim holder's): the agent asked ``given`` (an approval): appended
        as ``pending``; an input with its id already there answers ``OK`` unchanged.
      - ``ANSWER`` (a user's, scoped by ``tenant``): the approval ``given.id`` gets
        ``decision`` / ``message`` / ``answered_by`` / ``answered_at`` /
        ``updated_input_json`` from ``given`` and becomes ``answered``: the first answer
        wins, a later one is ``CONFLICT`` with the stored one (also once the run ended).
      - ``EXPIRE`` (the claim holder's): a pending approval whose ``expires_at <= now``
        becomes a denial by ``expired`` (fail closed); one not yet due is ``OK`` unchanged.
      - ``STEER`` (a user's): the message ``given`` is appended as ``pending``; its id
        already there answers ``OK`` unchanged (a retry); beyond :data:`MAX_RUN_INPUTS`
        inputs ``TOO_MANY``; on a record whose input is closed (below) ``ENDED``.
      - ``CLOSE`` (the claim holder's): the agent's turn is over and every input the caller
        saw is delivered: ``inputs_closed`` is set, so no later ``STEER`` is stored where no
        process would read it. A record holding more than ``known_inputs`` inputs (a message
        came after the caller looked) is ``CONFLICT`` with that record and nothing written:
        the caller delivers it first. Closing a closed record is ``OK`` unchanged.
      - ``REQUEST`` / ``STEER`` with an id an input of the other kind holds: ``CONFLICT``
        with that input (one id space: the inbox passes each id once).
      - ``REQUEST`` / ``STEER`` / ``ANSWER`` that would take the serialized record past
        :data:`MAX_RECORD_BYTES`: ``TOO_MANY``, nothing written (etcd would refuse the
        write). ``EXPIRE`` is never refused for size: the denial it stores is the fail-closed
        end of an approval.

    Returns:
        A plan whose result is (outcome, record, existing input on ``CONFLICT``). Outcomes:
        ``NOT_FOUND`` (no run, another tenant's, no such approval), ``ENDED`` (the run is
        terminal), ``FENCED`` (``REQUEST``/``EXPIRE``/``CLOSE`` by a caller not holding the claim at
        ``epoch``; the write compares the claim's mod revision, so a takeover between the
        read and the write fails it).
    """
    cur = snap.record
    if cur is None or (op in (_Op.ANSWER, _Op.STEER) and tenant and cur.tenant != tenant):
        return Plan((_Out.NOT_FOUND, None, None), write=False)
    cmps: list[E.Cmp] = []
    if op in (_Op.REQUEST, _Op.EXPIRE, _Op.CLOSE):
        if not holds(claim_of(snap.claim_kv), session_id, epoch):
            return Plan((_Out.FENCED, cur, None), write=False)
        assert snap.claim_kv is not None
        cmps.append(E.cmp_mod(keys.claim(snap.run_id), snap.claim_kv.mod_revision))
    if op == _Op.CLOSE:
        return _close(cur, known_inputs, cmps)
    at = _find_input(cur, given.id, "message" if op == _Op.STEER else "approval")
    if op == _Op.ANSWER and at < 0:
        return Plan((_Out.NOT_FOUND, cur, None), write=False)
    if op == _Op.ANSWER and cur.inputs[at].state == "answered":
        # The stored answer, even once the run ended: a client's retry of an answer that
        # landed learns what was decided, not only that the run is over.
        return Plan((_Out.CONFLICT, cur, cur.inputs[at]), write=False)
    if is_terminal(cur.status):
        return Plan((_Out.ENDED, cur, None), write=False)
    new = _copy(cur)
    if op in (_Op.REQUEST, _Op.STEER):
        if at >= 0:
            return Plan((_Out.OK, cur, None), write=False)
        other = _find_input(cur, given.id)
        if other >= 0:
            # Approvals and messages share one id space (the inbox passes each id once):
            # an id the other kind holds is refused, never silently dropped.
            return Plan((_Out.CONFLICT, cur, cur.inputs[other]), write=False)
        if op == _Op.STEER and cur.inputs_closed:
            return Plan((_Out.ENDED, cur, None), write=False)
        if op == _Op.STEER and len(cur.inputs) >= MAX_RUN_INPUTS:
            return Plan((_Out.TOO_MANY, cur, None), write=False)
        added = new.inputs.add()
        added.CopyFrom(given)
        added.kind = "message" if op == _Op.STEER else "approval"
        added.state = "pending"
        if new.ByteSize() > MAX_RECORD_BYTES:
            return Plan((_Out.TOO_MANY, cur, None), write=False)
        return Plan((_Out.OK, new, None), new=new, cmps=cmps)
    if at < 0:  # EXPIRE of an approval never asked
        return Plan((_Out.NOT_FOUND, cur, None), write=False)
    stored = cur.inputs[at]
    if stored.state == "answered":
        return Plan((_Out.CONFLICT, cur, stored), write=False)
    target = new.inputs[at]
    if op == _Op.EXPIRE:
        if stored.expires_at > now:
            return Plan((_Out.OK, cur, None), write=False)
        target.decision, target.message, target.answered_by = "deny", EXPIRED_MESSAGE, "expired"
        target.answered_at = now
    elif op == _Op.ANSWER:
        if given.decision not in ("allow", "deny"):
            raise ValueError(f"decision must be allow or deny, not {given.decision!r}")
        target.decision, target.message = given.decision, given.message
        target.answered_by, target.answered_at = given.answered_by or "user", given.answered_at
        target.updated_input_json = given.updated_input_json if given.decision == "allow" else ""
        if new.ByteSize() > MAX_RECORD_BYTES:
            return Plan((_Out.TOO_MANY, cur, None), write=False)
    else:
        raise ValueError(f"unknown input op {op}")
    target.state = "answered"
    return Plan((_Out.OK, new, None), new=new, cmps=cmps)


def _close(cur: RunRecord, known_inputs: int, cmps: list[E.Cmp]) -> Plan[InputResult]:
    if is_terminal(cur.status):
        return Plan((_Out.ENDED, cur, None), write=False)
    if cur.inputs_closed:
        return Plan((_Out.OK, cur, None), write=False)
    if len(cur.inputs) != known_inputs:
        return Plan((_Out.CONFLICT, cur, None), write=False)
    new = _copy(cur)
    new.inputs_closed = True
    return Plan((_Out.OK, new, None), new=new, cmps=cmps)
