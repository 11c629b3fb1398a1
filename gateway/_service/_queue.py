"""A message to a busy thread (docs/hitl.md): refuse it, queue it, interrupt the active run
for it, or steer it into the active run's turn; and the dispatcher that starts queued runs.

Strategies (``multitask``, as LangGraph names its double-texting choices):

- ``reject`` (the default): ``THREAD_BUSY``, as before;
- ``enqueue``: the run waits in the thread's queue (the coordinator's, in etcd) and starts
  once the thread has no active run, in the same workspace and agent session the active run
  leaves;
- ``interrupt``: the active run is cancelled, and this run goes first in the queue;
- ``steer``: the message goes into the active run's running turn (``POST
  /api/runs/{id}/messages``).

On an idle thread every strategy starts the run at once. Queued runs are started by
:class:`QueueDispatcher`, which every gateway runs: a sweep of every thread's queue head whose
thread is idle; a start is idempotent by run id and the queue entry is removed after it, so
two gateways dispatching the same head start the run once.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from baton import errors as e
from baton.runs import MAX_QUEUED_RUNS
from gateway._admission import TooManyStarts
from baton.v1 import coordinator_pb2, sandbox_host_pb2
from gateway._errors import mapping_for
from gateway._service import _cancel
from gateway._service._inputs import SteerRequest, steer, steer_request
from gateway._service._requests import StartRequest
from gateway._service._start import host_request, start_host_request
from gateway._service._views import thread_visible_for
from gateway._state import GatewayState

log = logging.getLogger("gateway.queue")

#: Agent kinds whose thread carries a conversation across runs: a queued run of one gets the
#: thread's saved transcript, as it is when the run starts, before its new message.
SESSION_KINDS = ("claude-code", "codex")
#: Seconds between two sweeps of the queues.
DISPATCH_INTERVAL = 0.25
#: Seconds an ``interrupt`` start waits for its run to start before it answers "queued".
INTERRUPT_WAIT = 60.0
#: The cancel reason of a run interrupted by a newer message.
INTERRUPTED = "interrupted-by-new-run"

Outcome = coordinator_pb2.EnqueueRunResponse


@dataclass(frozen=True)
class Queued:
    """A run waiting in its thread's queue (position 1 = next)."""

    run_id: str
    thread_id: str
    position: int
    active_run_id: str = ""


@dataclass(frozen=True)
class Steered:
    """A message steered into the thread's active run."""

    run_id: str
    input_id: str


def last_user_text(messages: list[dict[str, Any]]) -> str:
    """The text of the last user message (content string, or its text parts joined)."""
    for m in reversed(messages):
        if m.get("role") != "user":
            continue
        content = m.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def queued_view(q: coordinator_pb2.QueuedRun) -> dict[str, Any]:
    """The public view of a queued run (``GET /api/threads/{t}/queue`` items)."""
    return {"runId": q.run_id, "threadId": q.thread_id, "status": "queued", "strategy": q.strategy,
            "position": q.position, "enqueuedAt": q.enqueued_at, "prompt": q.prompt}


async def queue_or_steer(st: GatewayState, tenant: str, req: StartRequest, multitask: str) -> Queued | Steered | None:
    """Put a start whose thread is busy where ``multitask`` says; ``None``: start it now
    (the thread is idle, or the run id names a run already: a retry).

    Raises:
        UnknownThread: another tenant's thread.
        ThreadBusy: never (a busy thread is queued or steered).
        QueueFull: the thread's queue holds :data:`~baton.runs.MAX_QUEUED_RUNS` runs.
        The errors of a steer (``RunEnded``, ``SteerUnsupported``...).
    """
    if multitask == "reject":
        # A run id queued already is that run (a retry after the queue took it), never a
        # second run of that id on another thread.
        queued = await st.coordinator.list_queued_runs(run_id=req.run_id)
        if not queued:
            return None
        _same_run(queued[0], tenant, req.thread_id)
        return Queued(queued[0].run_id, queued[0].thread_id, int(queued[0].position))
    await thread_visible_for(st, tenant, req.thread_id, must_exist=False)
    if multitask == "steer":
        active = await _cancel.visible_active(st, tenant, req.thread_id)
        if active is None or active.run_id == req.run_id:
            return None
        sreq: SteerRequest = steer_request(active.run_id, last_user_text(req.messages), _steer_id(req.run_id))
        stored = await steer(st, tenant, sreq)
        return Steered(active.run_id, stored.id)
    already = await st.coordinator.list_queued_runs(run_id=req.run_id)
    if already:
        q = already[0]
        _same_run(q, tenant, req.thread_id)
        active_id = ""
        if q.strategy == "interrupt":
            # A retry of an interrupting start whose first attempt may have stopped between
            # queueing and cancelling: the active run is asked to stop again (idempotent).
            current = await st.coordinator.find_active_run(req.thread_id)
            if current is not None:
                active_id = current.run_id
                await _interrupt(st, active_id)
        return Queued(q.run_id, q.thread_id, int(q.position), active_id)
    # Bounded (entries carry up to a whole start request each). This read refuses early,
    # before a start request is built; the coordinator's EnqueueRun enforces the bound inside
    # its write, so gateways enqueueing at once cannot pass it.
    if len(await st.coordinator.list_queued_runs(req.thread_id)) >= MAX_QUEUED_RUNS:
        raise e.QueueFull(req.thread_id, MAX_QUEUED_RUNS)
    run = coordinator_pb2.QueuedRun(
        run_id=req.run_id, thread_id=req.thread_id, tenant=tenant, strategy=multitask, enqueued_at=time.time(),
        start_request=host_request(req, tenant).SerializeToString(), prompt=last_user_text(req.messages)[:4096])
    outcome, position, active = await st.coordinator.enqueue_run(run)
    if outcome != Outcome.QUEUED:
        return None  # idle thread, or a retry of a run that exists: start (or serve) it
    if multitask == "interrupt" and active:
        await _interrupt(st, active)
    log.info("run %s queued on thread %s at %d (%s, behind %s)", req.run_id, req.thread_id, position, multitask,
             active)
    return Queued(req.run_id, req.thread_id, position, active)


def _same_run(q: coordinator_pb2.QueuedRun, tenant: str, thread_id: str) -> None:
    """Check that a start naming the queued run ``q``'s id is a retry of it.

    Raises:
        UnknownRun: another tenant's run (the answer an unused id gets on a read, docs/api.md
            "What a tenant may learn").
        InvalidArgument: ``runId``, a run of another of the tenant's threads.
    """
    if q.tenant != tenant:
        raise e.UnknownRun(q.run_id)
    if q.thread_id != thread_id:
        raise e.InvalidArgument("runId", "already names a run of another thread")


async def _interrupt(st: GatewayState, active_run_id: str) -> None:
    """Ask the thread's active run to stop for an interrupting run queued behind it."""
    try:
        await _cancel.request_cancel(st, active_run_id, INTERRUPTED)
    except e.UnknownRun:
        pass  # it ended meanwhile: the queue goes on by itself


def _steer_id(run_id: str) -> str:
    """The input id of a steer made from a start: the start's run id, so a retried POST is
    delivered once (an id is plain ASCII: other run ids get a fresh one)."""
    from baton.ids import INPUT_ID

    return run_id if INPUT_ID.fullmatch(run_id) and run_id != "eof" else ""


async def wait_started(st: GatewayState, run_id: str, timeout: float = INTERRUPT_WAIT) -> bool:
    """Whether the queued run ``run_id`` got a record (it was dispatched) within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            await st.coordinator.get_run(run_id)
            return True
        except e.UnknownRun:
            await asyncio.sleep(0.1)
    return False


#: Refusals of a dispatch that pass (another gateway's dispatcher claimed the run at the same
#: moment, this gateway had no start slot): the entry stays for the next sweep.
RETRYABLE: tuple[type[e.BatonError], ...] = (e.RunClaimNotAcquired, e.RunClaimLost, TooManyStarts)


class QueueDispatcher:
    """Starts each thread's next queued run once the thread is idle (see the module docstring).

    Args:
        st: the gateway's clients.
        interval: seconds between sweeps.
    """

    def __init__(self, st: GatewayState, interval: float = DISPATCH_INTERVAL) -> None:
        self.st = st
        self.interval = interval

    async def run(self) -> None:
        """Sweep until cancelled; a sweep's failure is logged and the next one goes on."""
        while True:
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 -- a store or host hiccup: the next sweep retries
                log.warning("queue sweep failed: %r", exc)
            await asyncio.sleep(self.interval)

    async def sweep(self) -> int:
        """One pass over every thread's queue head; returns how many runs it started."""
        heads: dict[str, coordinator_pb2.QueuedRun] = {}
        for q in await self.st.coordinator.list_queued_runs():
            heads.setdefault(q.thread_id, q)
        started = 0
        for q in heads.values():
            try:
                if await self.st.coordinator.find_active_run(q.thread_id) is not None:
                    continue
                if await self.dispatch(q):
                    started += 1
            except e.BatonError as exc:  # one thread's trouble never holds up the others' queues
                log.warning("queued run %s of thread %s not dispatched: %s", q.run_id, q.thread_id, exc)
        return started

    async def dispatch(self, q: coordinator_pb2.QueuedRun) -> bool:
        """Start ``q`` (idempotent by run id), then take it out of the queue."""
        st = self.st
        req = sandbox_host_pb2.StartRunRequest.FromString(q.start_request)
        if req.agent.kind in SESSION_KINDS:
            # The conversation as the thread has it now (the runs before this one ended),
            # then this run's new message.
            saved, _ = await st.transcripts.load(q.thread_id)
            sent = json.loads(req.messages_json or "[]")
            new = [m for m in sent if isinstance(m, dict) and m.get("role") == "user"][-1:]
            req.messages_json = json.dumps([*saved, *new], separators=(",", ":"))
        try:
            await start_host_request(st, req)
        except e.ThreadBusy:
            return False  # another run took the thread meanwhile: it waits its turn again
        except e.BatonError as exc:
            m = mapping_for(exc)
            if m is not None and m.status < 500 and not isinstance(exc, RETRYABLE):
                # The run can never start (its workspace went away, its thread was deleted...):
                # it leaves the queue so the runs behind it go on.
                log.warning("queued run %s of thread %s dropped: %s", q.run_id, q.thread_id, exc)
                await st.coordinator.remove_queued_run(q.thread_id, q.run_id)
            else:
                log.info("queued run %s not started yet: %s", q.run_id, exc)
            return False
        await st.coordinator.remove_queued_run(q.thread_id, q.run_id)
        log.info("queued run %s of thread %s started", q.run_id, q.thread_id)
        return True
