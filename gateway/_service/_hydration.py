"""A thread as the live TanStack client showed it: the hydration answer's messages.

The UI messages are folded from the logs of the thread's finished runs
(:func:`gateway._ui_stream.thread_messages`), so a reload shows the same messages, merged
reasoning and parts as the page that watched the runs. When that cannot be done (a log
whose start retention removed, a terminal record retention removed, a log not readable in
time) the answer is the saved transcript converted message by message
(:func:`gateway._ui_messages.to_ui_messages`): the same content, with the saved
transcript's message boundaries. The fold of a thread's finished runs is kept in the
gateway's memory (:class:`gateway._hydration_cache.HydrationCache`) until another run of the thread finishes, so the
pages a client asks for one after the other read the logs once.
"""
from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any

from baton import errors as e
from baton.ids import run_position
from baton.runs import TERMINAL_PB
from baton.v1 import runs_pb2
from gateway._service import _cancel, _start, _views
from gateway._state import GatewayState
from gateway._ui_messages import to_ui_messages
from gateway._ui_stream import prompt_messages, thread_messages

log = logging.getLogger("gateway.hydration")

#: How long one run's log may take to read to its end (seconds).
LOG_READ_TIMEOUT = 10.0
#: How many of a thread's logs one hydration reads at once.
LOG_READS_AT_ONCE = 8


async def _whole_log(st: GatewayState, run_id: str) -> list[dict[str, Any]] | None:
    """Every chunk of a finished run's log, or ``None`` (no log, or not readable in time)."""
    try:
        async with asyncio.timeout(LOG_READ_TIMEOUT):
            tail = await st.log.last_record(run_id)
            if tail is None:
                return None
            reader = st.log.read(run_id, after="-1")
            reader.until = tail.offset
            chunks: list[dict[str, Any]] = []
            try:
                async for _offset, chunk in reader:
                    chunks.append(chunk)
            finally:
                await reader.aclose()
            return chunks
    except (TimeoutError, e.BatonError) as exc:
        log.info("run %s: log not read for a hydration: %s", run_id, exc)
        return None


async def _fold(st: GatewayState, run_ids: list[str]) -> list[dict[str, Any]] | None:
    """The UI messages of these finished runs (oldest first), or ``None`` if a log is not
    readable to its end or does not start with its run's input."""
    gate = asyncio.Semaphore(LOG_READS_AT_ONCE)

    async def read(run_id: str) -> list[dict[str, Any]] | None:
        async with gate:
            return await _whole_log(st, run_id)

    logs = await asyncio.gather(*(read(r) for r in run_ids))
    if any(c is None for c in logs):
        return None
    # A run that never wrote (refused before it began) showed nothing.
    return thread_messages([(r, c) for r, c in zip(run_ids, logs) if c])


def _covers(ui: list[dict[str, Any]], saved: list[dict[str, Any]]) -> bool:
    """Whether every user message of the saved transcript is shown (no run was missed)."""
    shown = {m.get("id") for m in ui}
    return all(m.get("id") in shown for m in saved if m.get("role") == "user")


async def thread_ui(st: GatewayState, tenant: str, thread_id: str) -> tuple[list[dict[str, Any]], runs_pb2.RunRecord | None]:
    """``(UI messages, active run or None)`` of a thread, oldest message first.

    While a run is going its answer is left out (the client re-plays the run from its
    start); its prompt is shown.

    Raises:
        UnknownThread: another tenant's thread.
        LogUnavailable: the saved transcript could not be read.
    """
    await _views.thread_visible_for(st, tenant, thread_id, must_exist=False)
    active = await _cancel.visible_active(st, tenant, thread_id)
    if active is not None and await _start.run_finishing(st, active.run_id):
        # Its log is closed and its record turned terminal: a client that read to the end
        # and at once reloads must get the finished run's answer, not only its prompt (the
        # host writes the terminal status one write after the close).
        active = await _cancel.visible_active(st, tenant, thread_id)
    scope = tenant if st.settings.auth_enabled else None
    recs = await st.coordinator.list_runs(thread_id=thread_id, limit=0, tenant=scope)
    finished = sorted((r for r in recs if r.status in TERMINAL_PB and (active is None or r.run_id != active.run_id)),
                      key=lambda r: run_position(r.started_at, r.run_id))
    key = (thread_id, tuple(r.run_id for r in finished))
    folded = st.hydrations.get(key)
    if folded is None:
        folded = await _fold(st, [r.run_id for r in finished])
        if folded is not None:
            st.hydrations.put(key, folded)
    active_input = await _cancel.run_input(st, active.run_id) if active is not None else None
    saved, _rev = await st.transcripts.load(thread_id)
    if folded is not None:
        ui = copy.deepcopy(folded)
        if active_input is not None:
            ui += prompt_messages(active_input, first=not finished)
        if _covers(ui, list(saved or [])):
            return ui, active
    # The saved transcript, converted message by message (the old answer).
    msgs = active_input if active_input is not None else list(saved or [])
    return to_ui_messages(msgs), active
