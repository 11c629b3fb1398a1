"""Task helpers of the run driver: cancellation that is never swallowed, never hangs."""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Protocol, TypeVar

from baton.aio import cancel_and_join
from baton.retry import Deadline, retry

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


T = TypeVar("T")


class _SessionLike(Protocol):
    lost: asyncio.Event


async def retry_unavailable(
    op: Callable[[], Awaitable[T]],
    *,
    deadline: float | None,
    session: _SessionLike,
    what: str,
    errors: tuple[type[BaseException], ...],
) -> T:
    """Run one idempotent operation, retrying it while it fails with ``errors``.

    Args:
        op: the operation (called again for each attempt).
        deadline: ``time.monotonic()`` after which no attempt starts (a budget across
            retries); ``None``: retry as long as the session lives.
        session: this host's session; once it is lost the claim is gone and retrying is
            pointless (a successor decides), so the last error is raised.
        what: names the operation in the log.
        errors: the transient errors (e.g. ``StoreUnavailable``, ``LogUnavailable``).

    Raises:
        The last of ``errors`` when the budget is spent or the session is lost; anything
        else ``op`` raises, at once.
    """
    def retrying(exc: BaseException) -> None:
        reraise_if_cancelling()
        log.warning("%s unavailable, retrying: %s", what, exc)

    budget = Deadline.never() if deadline is None else Deadline(deadline)
    return await retry(op, deadline=budget, retry_on=errors, first_pause=0.05, max_pause=0.5,
                       stop=session.lost, on_retry=retrying)
