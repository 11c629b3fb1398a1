"""Asyncio primitives every baton service uses, with the semantics spelled out once.

Which primitives, and why (Python 3.11):

- **Deadlines**: ``async with asyncio.timeout(seconds)``, never ``asyncio.wait_for``. On
  3.11 ``wait_for`` returns the awaited result and swallows a cancellation that lands in
  the same loop turn as the result (CPython gh-86296): the cancelled task goes on, and the
  owner waiting for it hangs. ``asyncio.timeout`` raises ``TimeoutError`` and never eats
  a cancel that did not come from its own deadline.
- **Structured sets of tasks**: ``asyncio.TaskGroup`` when the tasks share the caller's
  lifetime. Tasks that outlive the call that starts them (a shielded cleanup that must
  finish after its caller was cancelled) belong to a :class:`TaskOwner`, which the
  component drains on shutdown. Nothing drops the result of ``create_task``.
- **Stopping tasks**: :func:`cancel_and_join` cancels and waits, cancelling again while a
  task swallowed the cancel (some client libraries turn a cancel into their own error).
- **Blocking calls** (file reads of unknown size, ``/proc`` scans, blocking SDKs):
  ``asyncio.to_thread``. A single ``stat`` or a read of a few bytes stays inline.

anyio is installed (Starlette uses it); service code sticks to the asyncio spellings above
so one style reads everywhere.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Coroutine, Iterable, TypeVar

log = logging.getLogger("baton.aio")

T = TypeVar("T")


async def cancel_and_join(tasks: "asyncio.Task[Any] | Iterable[asyncio.Task[Any]]", *,
                          patience: float | None = None, every: float = 1.0) -> bool:
    """Cancel ``tasks`` and wait until each has ended, re-cancelling any that ignored it.

    Never raises what the tasks raised (their owner reads results itself, if it cares).

    Args:
        tasks: one task or several.
        patience: seconds after which to give up on tasks that still run (logged, left
            running); ``None`` waits for as long as it takes — use it where an owner must
            not go on while a task it owns still runs (the run driver).
        every: seconds between repeated cancels of a task that ignored one.

    Returns:
        ``True`` when every task has ended; ``False`` only when ``patience`` ran out.

    Raises:
        asyncio.CancelledError: the caller was cancelled while waiting (the tasks have
            been cancelled, but may not have ended yet).
    """
    pending = {tasks} if isinstance(tasks, asyncio.Task) else set(tasks)
    pending = {t for t in pending if not t.done()}
    loop = asyncio.get_running_loop()
    deadline = None if patience is None else loop.time() + patience
    first = True
    while pending:
        if not first:
            for t in pending:
                log.warning("task %s ignored a cancel; cancelling it again", t.get_name())
        first = False
        for t in pending:
            t.cancel()
        wait = every if deadline is None else max(0.0, min(every, deadline - loop.time()))
        _, pending = await asyncio.wait(pending, timeout=wait)
        if pending and deadline is not None and loop.time() >= deadline:
            for t in pending:
                log.error("task %s ignores cancellation; leaving it", t.get_name())
            return False
    return True


class TaskOwner:
    """Owner of background tasks that outlive the call that started them.

    Each task is kept until it ends; a failure is logged with its traceback (so no
    "exception was never retrieved"). :meth:`aclose` cancels and joins what still runs.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> "asyncio.Task[T]":
        """Start ``coro`` as a task owned here.

        Raises:
            RuntimeError: the owner was closed (the coroutine is closed, not run).
        """
        if self._closed:
            coro.close()
            raise RuntimeError(f"task owner {self.name} is closed")
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._reap)
        return task

    def _reap(self, task: "asyncio.Task[Any]") -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: background task %s failed", self.name, task.get_name(), exc_info=task.exception())

    async def join(self, timeout: float | None = None) -> bool:
        """Wait for the owned tasks to end by themselves (up to ``timeout`` seconds).

        Returns:
            ``True`` when none is left running.
        """
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
        return not self._tasks

    async def aclose(self, patience: float | None = 10.0) -> None:
        """Refuse new tasks, cancel the running ones and wait for them (idempotent)."""
        self._closed = True
        await cancel_and_join(set(self._tasks), patience=patience)


async def drop_task(task: "asyncio.Task[T | None]", close: Callable[[T], Awaitable[Any]]) -> None:
    """Drop a task that makes a resource: cancel it and wait for it (:func:`cancel_and_join`);
    a resource it made anyway (it finished before the cancel landed) is closed with ``close``.
    Never raises what the task raised."""
    await cancel_and_join(task)
    if not task.cancelled() and task.exception() is None:
        made = task.result()
        if made is not None:
            await close(made)


async def watch_loop_lag(name: str, *, every: float = 0.25, warn_after: float = 1.0) -> None:
    """Log every time this event loop ran a wake-up ``warn_after`` seconds or more late; runs
    until cancelled (its owner is the service's composition root).

    A late loop delays everything on it, the session keep-alive first (a host whose loop
    stalls for a TTL loses its session and its runs). The log says which of the two usual
    causes it was: the process's CPU time over the late interval close to its length means
    code on the loop kept it busy (a blocking call, a long callback); little CPU time means
    the process was not scheduled (a starved machine) or blocked outside Python's CPU.

    Args:
        name: the service named in the log line.
        every: seconds between wake-ups.
        warn_after: lateness (seconds) that is logged.
    """
    loop = asyncio.get_running_loop()
    while True:
        t0, cpu0 = loop.time(), time.process_time()
        await asyncio.sleep(every)
        late = loop.time() - t0 - every
        if late >= warn_after:
            cpu = time.process_time() - cpu0
            log.warning("%s: event loop %.2f s late (process CPU %.2f s of the %.2f s: %s)", name, late, cpu,
                        late + every, "busy on the loop" if cpu >= 0.7 * (late + every) else "not scheduled")
