"""Retrying within a budget: one :class:`Deadline` across every attempt (CONVENTIONS, Concurrency).

A deadline is a budget across retries, not a timeout per attempt: the caller makes one
:class:`Deadline` and passes it down, so each etcd/NATS/gRPC call inside an attempt gets
``deadline.left()`` (or ``deadline.cap(limit)``) as its timeout and the whole operation
ends when the budget does, however many attempts it took.

Two shapes, one pause rule (exponential, capped, never past the deadline, cut short by a
``stop`` event):

* :func:`retry` calls an operation until it returns, retrying on the exceptions named,
  and re-raises the last one when the budget is spent or ``stop`` is set::

      d = Deadline.after(timeout)
      rec = await retry(lambda: store.get_run(run_id, timeout=d.left()), deadline=d,
                        retry_on=(StoreUnavailable,))

* :class:`Attempts` is the same schedule as an async iterator, for loops whose failure is
  not an exception, or that must do something between attempts (rotate a replica, reset
  the pause after progress)::

      async for _ in Attempts(d, first_pause=0.05, max_pause=0.5):
          if await try_hosts():
              return "attached"
      return "no-host"

``Deadline.never()`` is for loops that retry until their owner cancels them or sets
``stop`` (a watch that re-subscribes, a consumer that recreates itself).

No pause starts unless an attempt can follow it within the budget, and no attempt starts
after the deadline. Cancellation is never swallowed: a cancelled pause raises
``CancelledError``.
"""
from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, TypeVar

T = TypeVar("T")

Clock = Callable[[], float]


@dataclass(frozen=True)
class Deadline:
    """A point on the monotonic clock by which an operation (all its attempts) must end.

    Attributes:
        at: the deadline, in seconds of ``clock`` (``math.inf`` for :meth:`never`).
        clock: the clock (``time.monotonic``; injected in tests).
    """

    at: float
    clock: Clock = field(default=time.monotonic, compare=False, repr=False)

    @classmethod
    def after(cls, seconds: float, *, clock: Clock = time.monotonic) -> "Deadline":
        """The deadline ``seconds`` from now."""
        return cls(clock() + seconds, clock)

    @classmethod
    def never(cls, *, clock: Clock = time.monotonic) -> "Deadline":
        """No budget: retry until cancelled or stopped."""
        return cls(math.inf, clock)

    def left(self) -> float:
        """Seconds left (``0.0`` once expired, ``inf`` for :meth:`never`)."""
        return max(0.0, self.at - self.clock())

    def cap(self, seconds: float) -> float:
        """``seconds``, or what is left of the budget when that is less (a per-call timeout
        that never outlives the operation)."""
        return min(seconds, self.left())

    @property
    def expired(self) -> bool:
        """Whether the budget is spent."""
        return self.left() <= 0.0


class Attempts:
    """Attempt numbers 1, 2, 3... with a pause before every attempt after the first.

    The first attempt always happens (even on an expired deadline). Pauses start at
    ``first_pause`` seconds and double up to ``max_pause``; the iteration ends instead of
    pausing when the pause would not end before the deadline, or when ``stop`` is set
    (before or during the pause).

    Args:
        deadline: the budget of all the attempts.
        first_pause: seconds before the second attempt.
        max_pause: the longest pause, in seconds.
        stop: when set, no further attempt starts (a pause in progress ends at once).
    """

    def __init__(self, deadline: Deadline, *, first_pause: float = 0.05, max_pause: float = 1.0,
                 stop: asyncio.Event | None = None) -> None:
        if first_pause < 0 or max_pause < first_pause:
            raise ValueError("need 0 <= first_pause <= max_pause")
        self.deadline = deadline
        self.number = 0  #: attempts started so far
        self._first = first_pause
        self._max = max_pause
        self._pause = first_pause
        self._stop = stop

    def reset(self) -> None:
        """Start the pauses from ``first_pause`` again (after an attempt made progress)."""
        self._pause = self._first

    def next_pause(self) -> float | None:
        """The pause before the next attempt, or ``None`` when no attempt may follow.

        Advances the schedule; does not sleep.
        """
        if self._stop is not None and self._stop.is_set():
            return None
        pause = self._pause
        if pause >= self.deadline.left():
            return None
        self._pause = min(pause * 2, self._max)
        return pause

    async def sleep(self, pause: float) -> bool:
        """Pause for ``pause`` seconds; ``False`` when ``stop`` was set meanwhile.

        Raises:
            asyncio.CancelledError: the caller was cancelled during the pause.
        """
        if self._stop is None:
            await asyncio.sleep(pause)
            return True
        try:
            async with asyncio.timeout(pause):
                await self._stop.wait()
        except TimeoutError:
            return True
        return False

    def __aiter__(self) -> "Attempts":
        return self

    async def __anext__(self) -> int:
        if self.number:
            pause = self.next_pause()
            if pause is None or not await self.sleep(pause):
                raise StopAsyncIteration
        self.number += 1
        return self.number


async def retry(op: Callable[[], Awaitable[T]], *, deadline: Deadline,
                retry_on: tuple[type[BaseException], ...], first_pause: float = 0.05,
                max_pause: float = 1.0, stop: asyncio.Event | None = None,
                on_retry: Callable[[BaseException], None] | None = None) -> T:
    """Await ``op()`` until it returns, retrying on ``retry_on`` within ``deadline``.

    ``op`` should pass the deadline down (``timeout=deadline.left()``) so an attempt never
    outlives the budget. See :class:`Attempts` for the pause rule.

    Args:
        op: the operation; called once per attempt.
        deadline: the budget of all attempts.
        retry_on: exception types that mean "try again"; anything else propagates at once.
            Never include ``asyncio.CancelledError``.
        first_pause: seconds before the second attempt.
        max_pause: the longest pause, in seconds.
        stop: when set, no further attempt starts.
        on_retry: called with each failure that will be retried, before its pause (to log).

    Returns:
        What ``op`` returned.

    Raises:
        BaseException: the last ``retry_on`` failure, once the budget is spent or ``stop``
            is set; any other exception of ``op`` at once.
    """
    tries = Attempts(deadline, first_pause=first_pause, max_pause=max_pause, stop=stop)
    while True:
        tries.number += 1
        try:
            return await op()
        except retry_on as exc:
            failure = exc
        pause = tries.next_pause()
        if pause is None:
            raise failure
        if on_retry is not None:
            on_retry(failure)
        if not await tries.sleep(pause):
            raise failure
