"""Task helpers of the run driver: cancellation that is never swallowed, never hangs."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from baton.aio import cancel_and_join

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
    """Cancel ``tasks`` and wait until every one has ended, however long it takes.

    Kept for the run driver's callers; it is :func:`baton.aio.cancel_and_join` without
    patience (the cancel is repeated every second for a task that swallowed it, see
    :func:`reraise_if_cancelling`), so the owner never drops a task.
    """
    await cancel_and_join(tasks)
