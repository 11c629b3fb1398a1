"""NATS requests whose replies share one subscription: a JetStream publish waits for its ack.

A publish to a JetStream subject is a request: the server answers on the reply subject once
the message is stored. nats-py's ``request`` does this too, but per call it draws a NUID
plus random bytes for the reply token, adds a done callback, and waits with
``asyncio.wait_for`` (a second future and one more event-loop turn before the caller runs).
On the append path, which is CPU-bound in Python, that was about a third of the log writer's
CPU per record (bench/results/README.md, "Log appends and reads against raw nats-py").

Here one wildcard subscription (``<inbox>.*``, made at the first request) takes the replies
of every request on the connection; each request waits on its own future under one timer
(``loop.call_at``), and its token is a counter. nats-py resubscribes the subscription after a
reconnect; a reply lost in a disconnect is a timeout, as with ``nc.request``.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

__all__ = ["Replies"]

_STATUS = "Status"
_NO_RESPONDERS = "503"


def _expire(fut: asyncio.Future[Msg]) -> None:
    if not fut.done():
        fut.set_exception(nats.errors.TimeoutError())


class Replies:
    """Requests on ``nc`` with their replies taken by one subscription of its own.

    Args:
        nc: a connected NATS client (not closed here).
    """

    def __init__(self, nc: NATS) -> None:
        self._nc = nc
        self._prefix: str | None = None
        self._sub: Subscription | None = None
        self._starting = asyncio.Lock()
        self._waiting: dict[str, asyncio.Future[Msg]] = {}
        self._ids = itertools.count()

    async def start(self) -> None:
        """Subscribe now (else the first request does)."""
        await self._subscribe()

    async def _subscribe(self) -> str:
        async with self._starting:
            if self._prefix is None:
                prefix = self._nc.new_inbox() + "."
                self._sub = await self._nc.subscribe(prefix + "*", cb=self._on_reply)
                self._prefix = prefix
            return self._prefix

    async def _on_reply(self, msg: Msg) -> None:
        assert self._prefix is not None
        fut = self._waiting.pop(msg.subject[len(self._prefix):], None)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    async def request(self, subject: str, payload: bytes, *, timeout: float,
                      headers: dict[str, str] | None = None) -> Msg:
        """Publish ``payload`` to ``subject`` and return the first reply.

        Args:
            subject: a valid subject (not checked here).
            payload: the message body.
            timeout: seconds to wait for the reply.
            headers: message headers, or ``None``.

        Raises:
            nats.errors.NoRespondersError: nobody subscribes to ``subject`` (the server's
                503 status reply; for JetStream: no stream, or no leader, takes it).
            nats.errors.TimeoutError: no reply within ``timeout`` (or :meth:`close` came first).
            nats.errors.ConnectionClosedError: the connection is closed.
            nats.errors.MaxPayloadError: the message is larger than the server takes.
        """
        prefix = self._prefix or await self._subscribe()
        loop = asyncio.get_running_loop()
        token = str(next(self._ids))
        fut: asyncio.Future[Msg] = loop.create_future()
        self._waiting[token] = fut
        try:
            await self._nc.publish(subject, payload, reply=prefix + token, headers=headers)
            timer = loop.call_at(loop.time() + timeout, _expire, fut)
            try:
                msg = await fut
            finally:
                timer.cancel()
        finally:
            self._waiting.pop(token, None)
        if msg.headers and msg.headers.get(_STATUS) == _NO_RESPONDERS:
            raise nats.errors.NoRespondersError
        return msg

    async def close(self) -> None:
        """Unsubscribe, and fail every request still waiting (``nats.errors.TimeoutError``)."""
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
            self._sub = None
            self._prefix = None
        for fut in self._waiting.values():
            _expire(fut)
