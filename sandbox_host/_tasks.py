"""Task helpers of the run driver: cancellation that is never swallowed, never hangs."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("baton.sandbox_host.driver")


def reraise_if_cancelling() -> None:
    """Re-raise a cancellation that a client library turned into its own error.

    nats-py converts a ``CancelledError`` that hits a pending request into a timeout
    error in places; caught as a domain error, it would leave the task running although it
    was cancelled. Never swallow cancellation (CONVENTIONS.md).
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError()


async def cancel_and_wait(tasks: set["asyncio.Task[Any]"]) -> None:
    """Cancel ``tasks`` and wait until every one has ended.

    The cancel is repeated every second for a task that swallowed it (see
    :func:`reraise_if_cancelling`), so the owner never hangs and never drops a task.
    """
    pending = {t for t in tasks if not t.done()}
    while pending:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=1.0)
        for t in pending:
            log.warning("task %s ignored a cancel; cancelling it again", t.get_name())
