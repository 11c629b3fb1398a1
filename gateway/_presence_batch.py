"""Presence calls of one gateway joined into batches: while a call for a run is under way, the
readers that join (or leave) the run meanwhile wait and go together in the next one.

A reader alone makes its call at once: there is no timer, only the call already under way to
wait for (the rule of a log's group commit). 1,000 readers joining one run at once make a few
coordinator calls of up to :data:`~baton.runs.MAX_READERS_PER_CALL` readers each, where each
reader made its own before, and the chunks those readers wait for no longer compete with
1,000 calls for the gateway's loop, the coordinator and etcd. Each reader is still a key of
its own under the gateway session (docs/design.md §3.3), so the reaper and takeover rules
that count readers see exactly what they saw before.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Coroutine, Generic, Hashable, TypeVar

from baton.runs import MAX_READERS_PER_CALL

K = TypeVar("K", bound=Hashable)

#: Starts a task the caller owns (cancelled and awaited at its shutdown); ``None`` when it
#: no longer starts any (``GatewayState.spawn``).
Spawn = Callable[[Coroutine[object, object, None], str], "asyncio.Task[None] | None"]


class BatcherClosed(RuntimeError):
    """The batcher's owner is shutting down: no call was made for the item."""


@dataclass(slots=True)
class _Queue:
    waiting: list[tuple[str, asyncio.Future[None]]] = field(default_factory=list)
    sending: list[tuple[str, asyncio.Future[None]]] = field(default_factory=list)
    busy: bool = False


def _retrieved(fut: asyncio.Future[None]) -> None:
    # A caller that stopped waiting never looks at its call's outcome: not an unseen error.
    if not fut.cancelled():
        fut.exception()


class Batcher(Generic[K]):
    """Joins the items submitted for one key while that key's call is under way.

    Args:
        send: ``send(key, items)`` makes one call for 1 to ``max_batch`` distinct items (in
            submission order) and raises when it failed.
        spawn: starts the task that makes a key's calls (one at a time per key).
        max_batch: the most items one call carries.
        name: names the task (``<name>-calls``) and the :class:`BatcherClosed` message.
    """

    def __init__(self, send: Callable[[K, list[str]], Awaitable[None]], spawn: Spawn, *, max_batch: int,
                 name: str) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._send, self._spawn, self._max, self._name = send, spawn, max_batch, name
        self._queues: dict[K, _Queue] = {}
        #: Calls made so far, and items they carried (for tests and the bench).
        self.calls = 0
        self.items = 0

    def enqueue(self, key: K, item: str) -> asyncio.Future[None]:
        """Queue ``item`` for ``key``'s next call and return that call's outcome.

        The future is done when the call that carried ``item`` ended: its result, or the
        exception it raised; cancelled when the owner cancelled the calls (its shutdown)
        before that call ended. Waiting for it (``asyncio.shield`` it, as :meth:`submit`
        does) orders what a caller does next after the call, whether or not the caller
        waited for the outcome: a reader's removal never overtakes its registration.

        Raises:
            BatcherClosed: the owner is shutting down: nothing was queued.
        """
        q = self._queues.get(key)
        if q is None:
            q = self._queues[key] = _Queue()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_retrieved)
        q.waiting.append((item, fut))
        if not q.busy:
            task = self._spawn(self._drain(key, q), f"{self._name}-calls")
            if task is None:
                q.waiting.pop()
                fut.cancel()
                if not q.waiting:
                    del self._queues[key]
                raise BatcherClosed(f"{self._name}: shutting down")
            q.busy = True
            # A callback, not a ``finally``: it runs also for a task cancelled before it began.
            task.add_done_callback(lambda _t: self._ended(key, q))
        return fut

    async def submit(self, key: K, item: str) -> None:
        """Return once a call that carried ``item`` for ``key`` succeeded (:meth:`enqueue`).

        A caller cancelled while it waits does not take its item out: the call is made anyway
        (the presence calls are idempotent, and a reader that gave up still removes its key).

        Raises:
            BatcherClosed: the owner is shutting down and no call was made.
            asyncio.CancelledError: the owner cancelled the calls (its shutdown).
            Exception: whatever the call that carried ``item`` raised.
        """
        await asyncio.shield(self.enqueue(key, item))

    async def _drain(self, key: K, q: _Queue) -> None:
        while q.waiting:
            q.sending, q.waiting = q.waiting[:self._max], q.waiting[self._max:]
            items = list(dict.fromkeys(item for item, _ in q.sending))
            self.calls += 1
            self.items += len(items)
            try:
                await self._send(key, items)
            except Exception as exc:  # noqa: BLE001 -- handed to each caller the call carried, which raises it
                for _, fut in q.sending:
                    if not fut.done():
                        fut.set_exception(exc)
            else:
                for _, fut in q.sending:
                    if not fut.done():
                        fut.set_result(None)
            q.sending = []
        # Nothing waits: done, with no await since the check (an item queued from now on
        # starts a new task; this one's done callback comes later and must not touch it).
        q.busy = False
        if self._queues.get(key) is q:
            del self._queues[key]

    def _ended(self, key: K, q: _Queue) -> None:
        if not q.busy:
            return  # the calls ended as they should (:meth:`_drain`)
        # Cancelled (the owner's shutdown), maybe before it began: nobody is left to make the calls.
        for _, fut in q.sending + q.waiting:
            if not fut.done():
                fut.cancel()
        q.sending, q.waiting, q.busy = [], [], False
        if self._queues.get(key) is q:
            del self._queues[key]


#: Seconds a presence call may take before the readers it carried go on without it.
PRESENCE_TIMEOUT = 3.0


class PresenceCalls:
    """A gateway's presence calls to the coordinator, batched per run (:class:`Batcher`).

    Args:
        coordinator: ``baton.coordinator_client.CoordinatorClient``.
        spawn: ``GatewayState.spawn``.
    """

    def __init__(self, coordinator: Any, spawn: Spawn) -> None:
        self._coordinator = coordinator
        self.registers: Batcher[tuple[str, int]] = Batcher(self._register, spawn, max_batch=MAX_READERS_PER_CALL,
                                                            name="register-readers")
        self.unregisters: Batcher[str] = Batcher(self._unregister, spawn, max_batch=MAX_READERS_PER_CALL,
                                                 name="unregister-readers")

    def register(self, run_id: str, session_id: int, reader_id: str) -> asyncio.Future[None]:
        """Queue ``reader_id``'s registration under the session; returns the outcome of the
        call that carries it (:meth:`Batcher.enqueue`): done with ``None``, or with
        ``SessionLost``, ``StoreUnavailable`` (a ``BatonError``) or ``TimeoutError`` (that
        call took more than :data:`PRESENCE_TIMEOUT`).

        Raises:
            BatcherClosed: the gateway is shutting down.
        """
        return self.registers.enqueue((run_id, session_id), reader_id)

    async def unregister(self, run_id: str, reader_id: str) -> None:
        """Remove ``reader_id``, with the run's other readers leaving meanwhile.

        Raises:
            BatonError, TimeoutError: as the outcome of :meth:`register`.
            BatcherClosed: the gateway is shutting down.
        """
        await self.unregisters.submit(run_id, reader_id)

    async def _register(self, key: tuple[str, int], reader_ids: list[str]) -> None:
        async with asyncio.timeout(PRESENCE_TIMEOUT):
            await self._coordinator.register_readers(key[0], key[1], reader_ids, timeout=PRESENCE_TIMEOUT)

    async def _unregister(self, run_id: str, reader_ids: list[str]) -> None:
        async with asyncio.timeout(PRESENCE_TIMEOUT):
            await self._coordinator.unregister_readers(run_id, reader_ids, timeout=PRESENCE_TIMEOUT)
