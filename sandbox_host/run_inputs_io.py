"""The inputs of a live run, carried out: the record writes and the inbox appends an
:class:`~sandbox_host.run_inputs.InputDesk` decides (docs/hitl.md).

Every record write is fenced by this claim (its session and epoch): a host that lost the run
cannot register or expire anything. Deliveries append to the sandbox's inbox; the launch
wrapper's relay passes each input id to the agent once, so a delivery repeated by a
successor (it cannot know whether its predecessor's append landed) is harmless.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING

from baton.errors import RunClaimLost
from baton.v1 import coordinator_pb2 as cpb
from baton.v1 import runs_pb2
from sandbox_host.run_inputs import (EOF_ID, NO_ROOM, Ask, CloseInput, Deliver, Expire, InputDesk, Register, answer_payload,
                                     record_tool_input)

if TYPE_CHECKING:
    from sandbox_host.deps import HostDeps
    from sandbox_host.sandboxes import Sandbox

log = logging.getLogger("baton.sandbox_host.inputs")

#: Agent kinds whose launch reads further input on stdin (sandbox_host/agents).
INTERACTIVE_KINDS = frozenset({"claude-code", "replay"})
#: Longest wait between two looks at the desk when nothing wakes it (seconds).
IDLE_WAIT = 5.0
#: Seconds before a failed input action (store or sandbox unavailable) is tried again.
RETRY_PAUSE = 1.0


def approval_timeout(deps: "HostDeps", record: runs_pb2.RunRecord) -> float:
    """Seconds an approval of this run waits: its agent's ``approval_timeout`` option, else
    the host's ``BATON_APPROVAL_TIMEOUT``."""
    try:
        opts = json.loads(record.agent.options_json or "{}")
    except ValueError:
        opts = {}
    value = opts.get("approval_timeout") if isinstance(opts, dict) else None
    if isinstance(value, (int, float)) and value > 0:
        return float(value)
    return deps.settings.approval_timeout


def desk_for(deps: "HostDeps", record: runs_pb2.RunRecord, sbx: "Sandbox") -> InputDesk | None:
    """The run's desk, or ``None`` when its agent takes no input (codex, or a sandbox
    launched without an inbox)."""
    if record.agent.kind not in INTERACTIVE_KINDS or not getattr(sbx.handle, "inbox_path", ""):
        return None
    return InputDesk(approval_timeout=approval_timeout(deps, record),
                     closes_input=record.agent.kind == "claude-code")


def _check(outcome: int, run_id: str, epoch: int) -> None:
    if outcome == cpb.PutRunInputResponse.FENCED:
        raise RunClaimLost(run_id, epoch, "inputs-fenced")


async def register(deps: "HostDeps", record: runs_pb2.RunRecord, epoch: int, desk: InputDesk, ask: Ask) -> None:
    """Store an approval the agent asked for on the run record (pending, with its expiry).

    Raises:
        RunClaimLost: this claim no longer holds the run.
        StoreUnavailable: the coordinator did not answer.
    """
    now = time.time()
    item = runs_pb2.RunInput(
        id=ask.id, kind="approval", state="pending", tool_call_id=ask.tool_call_id, tool_name=ask.tool_name,
        tool_input_json=record_tool_input(ask.input),
        requested_at=now, expires_at=now + desk.approval_timeout)
    outcome, rec, _ = await deps.cc.put_run_input(record.run_id, cpb.PutRunInputRequest.REQUEST, item,
                                                  session_id=deps.session.id, epoch=epoch)
    _check(outcome, record.run_id, epoch)
    if outcome == cpb.PutRunInputResponse.CONFLICT:
        # A message of the run has this id (one id space): the ask cannot be answered by
        # anyone, so the agent is told no (fail closed) instead of waiting for ever.
        log.error("run %s: approval %s cannot be stored (its id is a message's); denied", record.run_id, ask.id)
        desk.refuse(ask.id)
        return
    if outcome == cpb.PutRunInputResponse.TOO_MANY:
        # The record has no room left for it (MAX_RECORD_BYTES): nobody could answer it.
        log.error("run %s: approval %s cannot be stored (the record is full); denied", record.run_id, ask.id)
        desk.refuse(ask.id, NO_ROOM)
        return
    desk.registered_ask(ask.id)
    if rec is not None:
        desk.on_record(rec.inputs)
    log.info("run %s: approval %s asked (%s), expires in %.0f s", record.run_id, ask.id, ask.tool_name,
             desk.approval_timeout)


async def serve(deps: "HostDeps", record: runs_pb2.RunRecord, epoch: int, sbx: "Sandbox", desk: InputDesk,
                wake: asyncio.Event) -> None:
    """Carry out the desk's actions until cancelled (the driver's stream ends).

    Raises:
        RunClaimLost: a fenced write found the claim gone.
    """
    while True:
        wake.clear()
        try:
            await _act(deps, record, epoch, sbx, desk)
        except RunClaimLost:
            raise
        except Exception as exc:  # noqa: BLE001 - the store or the sandbox: tried again shortly
            log.warning("run %s: an input action failed (%r); trying again", record.run_id, exc)
            await asyncio.sleep(RETRY_PAUSE)
            continue
        deadline = desk.next_deadline()
        wait = IDLE_WAIT if deadline is None else max(0.0, min(IDLE_WAIT, deadline - time.time()))
        try:
            async with asyncio.timeout(wait):
                await wake.wait()
        except TimeoutError:
            pass


#: What the agent is told when an answer cannot be passed to it (too large for one inbox line).
UNDELIVERABLE = "The answer could not be passed to the agent (it is too large), so the tool is denied."


async def _deliver(sbx: "Sandbox", run_id: str, action: Deliver) -> None:
    """Append one input to the inbox. An input refused for good (``ValueError``: too large
    once escaped, or an id the relay cannot carry; ``PermissionError``: the agent made its
    inbox a link, a FIFO or anything but a regular file, or holds a lease on it) is never
    retried: an approval's
    answer becomes a denial (fail closed), a steered message is dropped (logged), so the
    inputs after it still go through. Any other ``OSError`` propagates: tried again."""
    try:
        await sbx.provider.send_input(sbx.handle, action.input_id, action.payload)
        log.info("run %s: input %s delivered", run_id, action.input_id)
        return
    except (ValueError, PermissionError) as exc:
        log.error("run %s: input %s cannot be delivered: %s", run_id, action.input_id, exc)
    if b'"control_response"' in action.payload:
        request_id = json.loads(action.payload)["response"]["request_id"]
        try:
            await sbx.provider.send_input(sbx.handle, action.input_id,
                                          answer_payload(request_id, "deny", UNDELIVERABLE, None))
        except (ValueError, PermissionError) as exc:
            log.error("run %s: approval %s: not even a denial can be delivered: %s", run_id, action.input_id, exc)


async def _act(deps: "HostDeps", record: runs_pb2.RunRecord, epoch: int, sbx: "Sandbox", desk: InputDesk) -> None:
    """Carry out what the desk says now."""
    run_id = record.run_id
    for action in desk.actions(time.time()):
        if isinstance(action, Register):
            await register(deps, record, epoch, desk, action.ask)
        elif isinstance(action, Deliver):
            await _deliver(sbx, run_id, action)
            desk.sent_input(action.key or action.input_id)
        elif isinstance(action, Expire):
            outcome, rec, _ = await deps.cc.put_run_input(
                run_id, cpb.PutRunInputRequest.EXPIRE, runs_pb2.RunInput(id=action.approval_id),
                session_id=deps.session.id, epoch=epoch, now=time.time())
            _check(outcome, run_id, epoch)
            desk.expiry_sent(action.approval_id)
            if rec is not None:
                desk.on_record(rec.inputs)
            log.info("run %s: approval %s expired (denied)", run_id, action.approval_id)
        elif isinstance(action, CloseInput):
            # The record's input closes first, compared with the inputs this desk has seen:
            # a message steered meanwhile is refused the close and delivered (the watch
            # brings it here again), and one steered after it is refused RUN_ENDED, never
            # stored where no process reads it.
            outcome, rec, _ = await deps.cc.put_run_input(
                run_id, cpb.PutRunInputRequest.CLOSE, runs_pb2.RunInput(), session_id=deps.session.id,
                epoch=epoch, known_inputs=len(desk.record))
            _check(outcome, run_id, epoch)
            if outcome == cpb.PutRunInputResponse.CONFLICT:
                desk.on_record(rec.inputs)
                log.info("run %s: a message came as the turn ended; it is delivered before the input closes", run_id)
                return await _act(deps, record, epoch, sbx, desk)  # once per input the record gained
            await sbx.provider.send_input(sbx.handle, EOF_ID, b"{}")
            desk.sent_input(EOF_ID)
