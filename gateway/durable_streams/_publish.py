"""JetStream publishes with acknowledgement, leaner than ``nc.request``.

A publish to a JetStream subject is a request: the server answers on the reply subject once
the message is stored. nats-py's ``request`` waits with ``asyncio.wait_for`` plus a done
callback, each a turn of the event loop, and draws random bytes per call; on a Durable
Streams append that was a visible share of the Python work. Here one reply subscription
serves every publish of the connection, each waiting on its own future, and one sweeper
task fails the futures whose ack is overdue (a timer per publish, as ``asyncio.timeout``
arms, was another visible share).

Not taken, on purpose: writing the publish to nats-py's transport from the publishing task
and taking acks out of its read loop (a hook on a private method) saved about 15% of the
gateway's CPU per append in the bench (ds5's A/B, 7 rounds: 0.380 -> 0.322 ms) and still left
it below the in-memory reference; it would tie this module to nats-py's internals. What
is published and what counts as stored: an append is answered only once JetStream's ack
arrived.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from baton.aio import cancel_and_join

_STATUS = "Status"
_NO_RESPONDERS = "503"
_DECODER = json.JSONDecoder()
_EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"


class Publisher:
    """Publishes on ``nc`` and waits for JetStream's ack.

    Args:
        nc: a connected NATS client.
        timeout: seconds to wait for an ack (then ``nats.errors.TimeoutError``); a publish
            gives up between ``timeout`` and ``1.2 * timeout`` after it was sent (the
            sweeper looks every ``timeout / 5``).
    """

    def __init__(self, nc: NATS, timeout: float = 5.0) -> None:
        self._nc = nc
        self._timeout = timeout
        self._prefix = ""
        self._waiting: dict[str, asyncio.Future[Msg]] = {}
        # (deadline, token) in publish order: with one timeout, deadlines only grow.
        self._deadlines: collections.deque[tuple[float, str]] = collections.deque()
        self._ids = itertools.count()
        self._sub: Subscription | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        """Subscribe to this publisher's replies (``<new inbox>.*``) and start the sweeper."""
        self._loop = asyncio.get_running_loop()
        self._prefix = self._nc.new_inbox() + "."
        self._sub = await self._nc.subscribe(self._prefix + "*", cb=self._on_reply)
        self._sweeper = asyncio.create_task(self._sweep(), name="ds-publish-timeouts")

    async def stop(self) -> None:
        """Unsubscribe and fail every publish still waiting (``nats.errors.TimeoutError``)."""
        if self._sweeper is not None:
            await cancel_and_join(self._sweeper)
            self._sweeper = None
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
            self._sub = None
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(nats.errors.TimeoutError())
        self._deadlines.clear()

    async def _sweep(self) -> None:
        assert self._loop is not None
        while True:
            await asyncio.sleep(self._timeout / 5)
            now = self._loop.time()
            while self._deadlines and self._deadlines[0][0] <= now:
                fut = self._waiting.get(self._deadlines.popleft()[1])
                if fut is not None and not fut.done():
                    fut.set_exception(nats.errors.TimeoutError())

    async def _on_reply(self, msg: Msg) -> None:
        fut = self._waiting.pop(msg.subject[len(self._prefix):], None)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    async def publish(self, subject: str, payload: bytes, expected_last_subject_seq: int) -> dict[str, Any]:
        """Publish, fenced on the subject's last sequence, and return JetStream's ack
        (``{"stream", "seq", ...}``) once stored.

        Args:
            subject: a valid subject (not checked here).
            payload: the message body.
            expected_last_subject_seq: sent as ``Nats-Expected-Last-Subject-Sequence``
                (0: the subject has no message yet).

        Raises:
            nats.js.errors.APIError: JetStream refused the message (``err_code`` says why:
                10071 when the subject's last sequence is not the expected one).
            nats.js.errors.NoStreamResponseError: no stream takes ``subject``.
            nats.errors.MaxPayloadError: the message is larger than the server takes.
            nats.errors.TimeoutError: no ack within the timeout (or the publisher stopped).
        """
        loop = self._loop
        assert loop is not None, "Publisher.start() first"
        token = str(next(self._ids))
        fut: asyncio.Future[Msg] = loop.create_future()
        self._waiting[token] = fut
        self._deadlines.append((loop.time() + self._timeout, token))
        try:
            # nats-py refuses a payload over the server's max_payload (MaxPayloadError).
            await self._nc.publish(subject, payload, reply=self._prefix + token,
                                   headers={_EXPECTED_LAST: str(expected_last_subject_seq)})
            msg = await fut
        finally:
            self._waiting.pop(token, None)
        if msg.headers and msg.headers.get(_STATUS) == _NO_RESPONDERS:
            raise nats.js.errors.NoStreamResponseError
        ack: dict[str, Any] = _DECODER.decode(msg.data.decode())
        err = ack.get("error")
        if err is not None:
            nats.js.errors.APIError.from_error(err)  # raises the error's class
        return ack
