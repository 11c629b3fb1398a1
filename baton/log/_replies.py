"""NATS requests whose replies share one subscription: a JetStream publish waits for its ack.

A publish to a JetStream subject is a request: the server answers on the reply subject once
the message is stored. nats-py's ``request`` does this too, but per call it draws a NUID
plus random bytes for the reply token, adds a done callback, and waits with
``asyncio.wait_for`` (a second future and one more event-loop turn before the caller runs).
On the append path, which is CPU-bound in Python, that was about a third of the log writer's
CPU per record (bench/results/README.md, "Log appends and reads against raw nats-py").

Here one wildcard subscription (``<inbox>.*``, made at the first request) takes the replies
of every request on the connection; each request waits on its own future, and its token is
a counter. Overdue requests are failed by one sweeper task, which runs while requests wait
(every :data:`TICK` seconds) and ends when none does: a timer per request (``loop.call_at``)
cost about 5 µs more per publish on uvloop, the services' loop, where each timer is a libuv
handle. nats-py resubscribes the subscription after a reconnect; a reply lost in a
disconnect is a timeout, as with ``nc.request``.

Replies may also be shared on purpose (``shared=``): each requester then takes its replies
under ``<shared>.<its id>.`` with one subscription to ``<shared>.>``, and hands the others'
replies to ``on_other``. A Durable Streams gateway learns so from JetStream's ack of another
gateway's write where it was stored, with no message of its own
(gateway/durable_streams/_catchup.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from typing import Awaitable, Callable

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from baton.aio import cancel_and_join

__all__ = ["Replies"]

_STATUS = "Status"
_NO_RESPONDERS = "503"
#: Seconds between two looks for overdue requests: a request gives up between its timeout
#: and its timeout plus this.
TICK = 0.05


def _expire(fut: asyncio.Future[Msg]) -> None:
    if not fut.done():
        fut.set_exception(nats.errors.TimeoutError())


class Replies:
    """Requests on ``nc`` with their replies taken by one subscription of its own.

    :meth:`of` gives a connection's shared instance (one subscription per connection, as
    nats-py's own request uses); a component that owns its connection may make its own.

    Args:
        nc: a connected NATS client (not closed here).
        shared: a subject prefix whose replies every requester sharing it hears (``None``:
            this requester's own inbox).
        own: this requester's token under ``shared`` (one subject token, unique among them).
        on_other: called with every reply under ``shared`` to another requester.

    Raises:
        ValueError: ``shared`` without a one-token ``own`` (no ``.``, ``*`` or ``>``) or
            without ``on_other``.
    """

    @classmethod
    def of(cls, nc: NATS) -> "Replies":
        """The instance shared by every user of ``nc`` (kept on the client, so it goes with
        it)."""
        replies: Replies | None = getattr(nc, "_baton_replies", None)
        if replies is None:
            replies = cls(nc)
            setattr(nc, "_baton_replies", replies)
        return replies

    def __init__(self, nc: NATS, *, shared: str | None = None, own: str = "",
                 on_other: Callable[[Msg], Awaitable[None]] | None = None) -> None:
        if shared is not None and (not own or "." in own or "*" in own or ">" in own or on_other is None):
            raise ValueError("a shared reply prefix needs this requester's own token and on_other")
        self._nc = nc
        self._shared = shared
        self._own = own
        self._on_other = on_other
        self._prefix: str | None = None
        self._sub: Subscription | None = None
        self._starting = asyncio.Lock()
        self._waiting: dict[str, asyncio.Future[Msg]] = {}
        self._ids = itertools.count()
        # (deadline, token) of every request since the sweeper started, answered or not:
        # cleared when the sweeper ends (nothing waits then).
        self._deadlines: list[tuple[float, str]] = []
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False

    async def start(self) -> None:
        """Subscribe now (else the first request does)."""
        await self._subscribe()

    async def _subscribe(self) -> str:
        async with self._starting:
            if self._closed:
                raise nats.errors.ConnectionClosedError
            if self._prefix is None:
                if self._shared is None:
                    prefix = self._nc.new_inbox() + "."
                    self._sub = await self._nc.subscribe(prefix + "*", cb=self._on_reply)
                else:
                    prefix = f"{self._shared}.{self._own}."
                    self._sub = await self._nc.subscribe(f"{self._shared}.>", cb=self._on_reply)
                self._prefix = prefix
            return self._prefix

    async def _on_reply(self, msg: Msg) -> None:
        prefix = self._prefix
        assert prefix is not None
        if not msg.subject.startswith(prefix):
            if self._on_other is not None:
                await self._on_other(msg)
            return
        fut = self._waiting.pop(msg.subject[len(prefix):], None)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    async def request(self, subject: str, payload: bytes, *, timeout: float,
                      headers: dict[str, str] | None = None, tag: str = "") -> Msg:
        """Publish ``payload`` to ``subject`` and return the first reply.

        Args:
            subject: a valid subject (not checked here).
            payload: the message body.
            timeout: seconds to wait for the reply.
            headers: message headers, or ``None``.
            tag: subject tokens put before the request's counter in its reply subject
                (``<tag>.<n>``), for those sharing the replies to read.

        Raises:
            nats.errors.NoRespondersError: nobody subscribes to ``subject`` (the server's
                503 status reply; for JetStream: no stream, or no leader, takes it).
            nats.errors.TimeoutError: no reply within ``timeout`` (or :meth:`close` came first).
            nats.errors.ConnectionClosedError: the connection is closed, or :meth:`close`
                was called.
            nats.errors.MaxPayloadError: the message is larger than the server takes.
            ValueError: a ``tag`` without a shared reply prefix.
        """
        if tag and self._shared is None:
            raise ValueError("a reply tag needs a shared reply prefix")
        prefix = self._prefix or await self._subscribe()
        loop = asyncio.get_running_loop()
        token = f"{tag}.{next(self._ids)}" if tag else str(next(self._ids))
        fut: asyncio.Future[Msg] = loop.create_future()
        self._waiting[token] = fut
        try:
            await self._nc.publish(subject, payload, reply=prefix + token, headers=headers)
            deadlines = self._deadlines
            heapq.heappush(deadlines, (loop.time() + timeout, token))
            if len(deadlines) > 2 * len(self._waiting) + 1024:
                # Answered requests' entries wait for their deadline to be dropped: while
                # requests keep coming, drop them now and then (rate × timeout otherwise).
                deadlines[:] = [d for d in deadlines if d[1] in self._waiting]
                heapq.heapify(deadlines)
            if self._sweeper is None:
                self._sweeper = loop.create_task(self._sweep(), name="nats-reply-timeouts")
            msg = await fut
        finally:
            self._waiting.pop(token, None)
        if msg.headers and msg.headers.get(_STATUS) == _NO_RESPONDERS:
            raise nats.errors.NoRespondersError
        return msg

    async def _sweep(self) -> None:
        """Fail the requests whose deadline passed, while any waits."""
        loop = asyncio.get_running_loop()
        deadlines, waiting = self._deadlines, self._waiting
        try:
            while waiting:
                await asyncio.sleep(TICK)
                now = loop.time()
                while deadlines and deadlines[0][0] <= now:
                    fut = waiting.get(heapq.heappop(deadlines)[1])
                    if fut is not None:
                        _expire(fut)
        finally:
            if self._sweeper is asyncio.current_task():  # else close() took it away
                deadlines.clear()
                self._sweeper = None

    async def close(self) -> None:
        """Unsubscribe, and fail every request still waiting (``nats.errors.TimeoutError``);
        a request after this raises ``nats.errors.ConnectionClosedError``."""
        self._closed = True
        sweeper, self._sweeper = self._sweeper, None
        if self._sub is not None:
            sub, self._sub = self._sub, None
            self._prefix = None
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        if sweeper is not None:
            await cancel_and_join(sweeper)
        self._deadlines.clear()
        # After the sweeper ended: a request made while it was being stopped found it still
        # there and would wait with nobody to time it out.
        for fut in list(self._waiting.values()):
            _expire(fut)
