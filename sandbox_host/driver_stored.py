"""The takeover read of a :class:`~sandbox_host.driver.RunDriver`: what its run's log stored.

A successor (``attach``, ``finalize``) reads the headers the log held before its own fence
and the run input (``run.accepted``) among them, before it aligns its replay; a driver
whose fence met a closed log reads the close record to end as the log did. The methods
belong to the driver (a mixin: they read and set its state), kept here so
``driver.py`` stays about supervising and streaming.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from baton.errors import LogAlreadyClosed
from baton.runs import RUN_ACCEPTED
from sandbox_host import machine as M
from sandbox_host.driver_state import DriverState

if TYPE_CHECKING:
    pass

__all__ = ["StoredReads"]


class StoredReads(DriverState):
    """The driver's reads of its run's stored log (mixed into ``RunDriver``)."""

    async def _stored_close(self, closed: LogAlreadyClosed) -> M.StoredClose:
        stored = await self.deps.log.stored_headers(self.run_id)
        rec = next((r for r in reversed(stored) if r.kind == "close"), None)
        return M.StoredClose(closed.status or "completed", getattr(rec, "error", None), getattr(rec, "error_code", None))

    async def _stored_before_fence(self) -> tuple[list[Any], dict[int, bytes]]:
        """What the log held before this claim's fence (headers), and the bodies of its
        host-origin chunks when they came along (the run input among them)."""
        over = self.writer.fenced_over
        if over is None:  # not this writer's fence (cannot happen after the body's fence)
            return await self.deps.log.stored_headers(self.run_id, before=self.fence_seq), {}
        return await self.deps.stored_before_fence(self.run_id, over)

    async def _load_input_messages(self, stored: list[Any], bodies: dict[int, bytes] | None = None) -> None:
        first_host = next((r for r in stored if r.kind == "chunk" and r.origin == "host"), None)
        found = False
        if first_host is not None:
            raw = (bodies or {}).get(first_host.offset)
            if raw is not None:
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = None
            else:
                body = await self.deps.read_chunk(self.run_id, first_host.offset)
            if isinstance(body, dict) and body.get("name") == RUN_ACCEPTED:
                self.builder.feed(body)  # run.accepted: sets the input messages
                value = body.get("value")
                if isinstance(value, dict) and isinstance(value.get("messages"), list):
                    self.input_messages = list(value["messages"])
                    found = True
        # The StartRun's claim writes run.accepted right after its fence: a log with an
        # earlier claim's records but no run.accepted is a start that failed half-way. An
        # empty log is a record no StartRun wrote (seeded by a tool or the reaper with its
        # agent options only): it still runs, without input messages. (The epoch says
        # nothing here: a reaper's or a refused claim also takes one.)
        self._input_missing = not found and any(r.epoch < self.epoch for r in stored)
        # Marked loaded only now: a body cancelled inside the read above (a cancel seen via
        # WatchRun while a successor is still loading) must let the final writes load the
        # inputs again, else the saved transcript loses the user's messages.
        self._inputs_loaded = True
