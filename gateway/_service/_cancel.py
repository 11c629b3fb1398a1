"""Cancelling a run (durable flag + fast path to its host), and what a run's log says about it."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from baton import errors as e
from baton.runs import RUN_ACCEPTED, RUN_CANCELLED, TERMINAL_PB, is_host_chunk
from baton.v1 import runs_pb2, sandbox_host_pb2
from gateway._errors import CancelWaitTimeout
from gateway._service._requests import CancelRequest
from gateway._service._views import run_view_for, thread_visible_for
from gateway._state import GatewayState

log = logging.getLogger("gateway.cancel")

#: Seconds a read of a run's host chunks (its input, its cancel confirmation) may take.
CONFIRMATION_READ_TIMEOUT = 2.0


@dataclass(frozen=True)
class CancelOutcome:
    """What a cancel did: the run, and with ``wait`` its terminal ``RunView`` and the host's
    ``run.cancelled`` value (``None`` without ``wait``, or when not readable in time).
    ``run_known`` false: no run had the id, the intent is kept for its start."""

    run_id: str
    view: Any | None = None
    confirmation: dict[str, Any] | None = None
    run_known: bool = True


async def visible_active(st: GatewayState, tenant_id: str, thread_id: str) -> runs_pb2.RunRecord | None:
    """The thread's active run if ``tenant_id`` may see it, else ``None``."""
    rec = await st.coordinator.find_active_run(thread_id)
    if rec is None or (st.settings.auth_enabled and rec.tenant != tenant_id):
        return None
    return rec  # type: ignore[no-any-return]


async def _thread_known(st: GatewayState, tenant_id: str, thread_id: str) -> bool:
    """Whether the thread has a run ``tenant_id`` may see (with auth: the thread is its own)."""
    if st.settings.auth_enabled:
        try:
            await thread_visible_for(st, tenant_id, thread_id, must_exist=True)
        except e.UnknownThread:
            return False
        return True
    return bool(await st.coordinator.list_runs(thread_id=thread_id, limit=1))


async def request_cancel(st: GatewayState, run_id: str, reason: str) -> runs_pb2.RunRecord:
    """Durable cancel (the flag in the record) + the fast path to the driving host.

    A run with no live claim is handed to a live host to finalize (DESIGN §5.5: a cancel
    of a run whose host is dead is carried out by whoever takes the claim).
    """
    rec = await st.coordinator.request_run_cancel(run_id, reason=reason)
    view = await st.coordinator.get_run(run_id)
    if view.claim is not None:
        address = await st.hosts.address_of(view.claim.host_id)
        if address is not None:
            try:
                await st.hosts.call(address, "CancelRun", sandbox_host_pb2.CancelRunRequest(run_id=run_id, reason=reason))
            except e.BatonError as exc:
                # The durable flag reaches the driver through WatchRun anyway.
                log.warning("fast-path cancel of run %s on %s failed: %s", run_id, view.claim.host_id, exc)
    else:
        st.takeovers.consider(run_id, view.record, None)
    return rec  # type: ignore[no-any-return]


async def cancel(st: GatewayState, tenant_id: str, req: CancelRequest) -> CancelOutcome:
    """Cancel ``req.run_id``, else ``req.thread_id``'s active run; with ``wait``, until terminal.

    A run id with no run (yet) records the intent and answers at once, ``run_known``
    false, ``wait`` or not: the run may never come (a mistyped id looks the same).

    Raises:
        InvalidArgument: neither id. UnknownThread: by thread, a thread with no run the
            caller may see. UnknownRun: by thread, no active run; by run id, another
            tenant's run. CancelWaitTimeout: with ``wait``, the run was not terminal in time.
    """
    run_id = req.run_id
    by_thread = not run_id
    if not run_id:
        if not req.thread_id:
            raise e.InvalidArgument("runId", "send a runId or a threadId")
        rec = await visible_active(st, tenant_id, req.thread_id)
        if rec is None:
            if not await _thread_known(st, tenant_id, req.thread_id):
                raise e.UnknownThread(req.thread_id)
            raise e.UnknownRun(f"(active run of thread {req.thread_id})")
        run_id = rec.run_id
    try:
        view = await run_view_for(st, tenant_id, run_id)
    except e.UnknownRun:
        if by_thread:
            raise
        # No run by that id (yet): a client that minted the id may send its Stop before its
        # POST landed. The coordinator keeps the intent (tenant-scoped, expiring); a start
        # that comes later is born cancelled. Another tenant's run stays unknown.
        if await st.coordinator.user_cancel(run_id, tenant_id, "user") is None:
            log.info("cancel of run %s before its start: intent recorded", run_id)
            return CancelOutcome(run_id, run_known=False)
        view = await run_view_for(st, tenant_id, run_id)  # created meanwhile
    if view.record.status not in TERMINAL_PB:
        await request_cancel(st, run_id, "user")
    if not req.wait:
        return CancelOutcome(run_id)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + req.timeout
    while True:
        try:
            view = await st.coordinator.get_run(run_id)
            if view.record.status in TERMINAL_PB:
                break
        except e.UnknownRun:
            pass  # created, then deleted by retention meanwhile: the timeout ends the wait
        if loop.time() >= deadline:
            raise CancelWaitTimeout(run_id, req.timeout)
        await asyncio.sleep(min(0.05, max(deadline - loop.time(), 0)))
    return CancelOutcome(run_id, view, await _confirmation(st, run_id))


async def _host_chunk_value(st: GatewayState, run_id: str, name: str, *, first: bool) -> tuple[bool, Any]:
    """``(found, value)`` of the run's ``name`` host chunk, read from the log's start.

    ``first``: stop at the first one; else the last one stored before the read caught up
    (bounded by ``CONFIRMATION_READ_TIMEOUT``). Not readable in time counts as not found.
    """
    found: list[Any] = []

    async def scan() -> None:
        reader = st.log.read(run_id, after="-1")
        try:
            async for _offset, chunk in reader:
                if is_host_chunk(chunk, name):
                    found[:] = [chunk.get("value")]
                    if first:
                        return
        finally:
            await reader.aclose()

    try:
        async with asyncio.timeout(CONFIRMATION_READ_TIMEOUT):
            await scan()
    except (TimeoutError, e.BatonError):
        pass
    return (True, found[0]) if found else (False, None)


async def run_input(st: GatewayState, run_id: str) -> list[dict[str, Any]] | None:
    """The input messages of a run, from its ``run.accepted`` chunk (``None``: not readable in time)."""
    found, value = await _host_chunk_value(st, run_id, RUN_ACCEPTED, first=True)
    if not found:
        return None
    messages = value.get("messages") if isinstance(value, dict) else None
    return [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []


async def _confirmation(st: GatewayState, run_id: str) -> dict[str, Any] | None:
    """The ``run.cancelled`` chunk's value (what the host confirmed), read from the log."""
    found, value = await _host_chunk_value(st, run_id, RUN_CANCELLED, first=False)
    if not found:
        return None
    return value if isinstance(value, dict) else {"value": value}
