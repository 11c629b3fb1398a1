"""JetStream publishes with acknowledgement, leaner than ``nc.request`` (issue 16).

A publish to a JetStream subject is a request: the server answers on the reply subject once
the message is stored. nats-py's ``request`` waits with ``asyncio.wait_for`` plus a done
callback, each a turn of the event loop, and draws random bytes per call; on a Durable
Streams append that was a visible share of the Python work. Here one reply subscription
serves every publish of the connection, each waiting on its own future, and one sweeper
task fails the futures whose ack is overdue (a timer per publish, as ``asyncio.timeout``
arms, was another visible share).

Two more event-loop turns per append are cut on the connection the publisher is given to
own (the store's, used for nothing else hot), through nats-py internals, each checked for
at start and skipped (the public path kept) when absent:
- a publish is written to the socket by the publishing task itself when nothing else waits
  in nats-py's outgoing buffer and the client is connected, instead of being queued for
  nats-py's flusher task (a queue, a future and a task wake-up per publish): the first of a
  loop turn at once, the turn's others together by one callback at the turn's end (16
  concurrent appends: two writes, not sixteen); otherwise it goes through ``nc.publish``
  (buffered across a reconnect, as before);
- an ack (a reply without headers on this publisher's subscription) is handed to its
  future from nats-py's read loop, instead of through the subscription's queue and task
  (a ``Msg``, a queue hop and a task wake-up per ack). Replies with headers (a status, such
  as 503 no responders) still go through the subscription.
What is published and what counts as stored are unchanged: an append is answered only
once JetStream's ack arrived.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import itertools
import json
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

_STATUS = "Status"
_NO_RESPONDERS = "503"
_DECODER = json.JSONDecoder()
_EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"
_HDR_EXPECTED_LAST = b"NATS/1.0\r\n%s: " % _EXPECTED_LAST.encode()

# nats-py's parser calls Client._process_msg(sid, subject, reply, data, headers): the hook
# is installed only over a method of exactly that shape.
_PROCESS_MSG_PARAMS = ("sid", "subject", "reply", "data", "headers")


def _params(fn: Any) -> tuple[str, ...] | None:
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


# What a waiting publish gets: the ack's body and its headers (None: none).
_Reply = tuple[bytes, "dict[str, str] | None"]


class Publisher:
    """Publishes on ``nc`` and waits for JetStream's ack.

    Args:
        nc: a connected NATS client; with ``direct``, one this publisher's owner owns
            (its read loop and outgoing path are shortcut, see the module docstring).
        timeout: seconds to wait for an ack (then ``nats.errors.TimeoutError``); a publish
            gives up between ``timeout`` and ``1.2 * timeout`` after it was sent (the
            sweeper looks every ``timeout / 5``).
        direct: take the shortcuts where nats-py has the internals they need.
    """

    def __init__(self, nc: NATS, timeout: float = 5.0, *, direct: bool = False) -> None:
        self._nc = nc
        self._timeout = timeout
        self._direct = direct
        self._prefix = ""
        self._bprefix = b""
        self._waiting: dict[bytes, asyncio.Future[_Reply]] = {}
        # (deadline, token) in publish order: with one timeout, deadlines only grow.
        self._deadlines: collections.deque[tuple[float, bytes]] = collections.deque()
        self._ids = itertools.count()
        self._sub: Subscription | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._write_direct = False
        self._batching = False
        self._out: list[bytes] = []
        self._out_tokens: list[bytes] = []
        self._restore: Any = None

    async def start(self) -> None:
        """Subscribe to this publisher's replies (``<new inbox>.*``) and start the sweeper."""
        self._loop = asyncio.get_running_loop()
        self._prefix = self._nc.new_inbox() + "."
        self._bprefix = self._prefix.encode()
        self._sub = await self._nc.subscribe(self._prefix + "*", cb=self._on_reply)
        self._sweeper = asyncio.create_task(self._sweep(), name="ds-publish-timeouts")
        if self._direct:
            nc: Any = self._nc
            self._write_direct = all(hasattr(nc, a) for a in ("_transport", "_pending_data_size", "_status"))
            sid = getattr(self._sub, "_id", None)
            if isinstance(sid, int) and _params(getattr(nc, "_process_msg", None)) == _PROCESS_MSG_PARAMS:
                self._restore = nc.__dict__.get("_process_msg")
                nc._process_msg = self._read_hook(nc._process_msg, sid)

    def _read_hook(self, process_msg: Any, sid: int) -> Any:
        """nats-py's ``_process_msg`` with this subscription's header-less replies taken first."""
        waiting, n, stats = self._waiting, len(self._bprefix), self._nc.stats

        async def process(sid_: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
            if sid_ != sid or headers:
                await process_msg(sid_, subject, reply, data, headers)
                return
            stats["in_msgs"] += 1
            stats["in_bytes"] += len(data)
            fut = waiting.pop(subject[n:], None)
            if fut is not None and not fut.done():
                fut.set_result((data, None))

        return process

    async def stop(self) -> None:
        """Unsubscribe and fail every publish still waiting (``nats.errors.TimeoutError``)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
            self._sub = None
        nc: Any = self._nc
        if "_process_msg" in nc.__dict__:
            if self._restore is None:
                del nc._process_msg
            else:
                nc._process_msg = self._restore
        self._write_direct = False
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

    def _write(self) -> None:
        """Write the publishes queued behind a turn's first in one go (as nats-py's flusher
        batches), and let the next publish go out at once again."""
        self._batching = False
        out, tokens = self._out, self._out_tokens
        if not out:
            return
        self._out, self._out_tokens = [], []
        raw: Any = self._nc
        if self._write_direct and raw._status == NATS.CONNECTED:
            raw._transport.writelines(out)
            return
        for token in tokens:  # lost the connection since: unsent, so the request may be retried
            fut = self._waiting.get(token)
            if fut is not None and not fut.done():
                fut.set_exception(nats.errors.ConnectionReconnectingError())

    async def _on_reply(self, msg: Msg) -> None:
        fut = self._waiting.pop(msg.subject[len(self._prefix):].encode(), None)
        if fut is not None and not fut.done():
            fut.set_result((msg.data, msg.headers))

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
        nc = self._nc
        if len(payload) > nc.max_payload:
            raise nats.errors.MaxPayloadError
        n = next(self._ids)
        token = str(n).encode()
        fut: asyncio.Future[_Reply] = loop.create_future()
        self._waiting[token] = fut
        self._deadlines.append((loop.time() + self._timeout, token))
        try:
            raw: Any = nc
            if self._write_direct and raw._pending_data_size == 0 and raw._status == NATS.CONNECTED:
                hdr = b"%s%d\r\n\r\n" % (_HDR_EXPECTED_LAST, expected_last_subject_seq)
                cmd = b"HPUB %s %s%s %d %d\r\n%s%s\r\n" % (
                    subject.encode(), self._bprefix, token, len(hdr), len(hdr) + len(payload), hdr, payload)
                if self._batching:
                    self._out.append(cmd)
                    self._out_tokens.append(token)
                else:
                    # The first publish of this loop turn goes out now (one append at a time
                    # waits for nothing); the turn's others are written together at its end.
                    raw._transport.write(cmd)
                    self._batching = True
                    loop.call_soon(self._write)
                stats = nc.stats
                stats["out_msgs"] += 1
                stats["out_bytes"] += len(payload)
            else:
                await nc.publish(subject, payload, reply=self._prefix + str(n),
                                 headers={_EXPECTED_LAST: str(expected_last_subject_seq)})
            data, status = await fut
        finally:
            self._waiting.pop(token, None)
        if status and status.get(_STATUS) == _NO_RESPONDERS:
            raise nats.js.errors.NoStreamResponseError
        ack: dict[str, Any] = _DECODER.decode(data.decode())
        err = ack.get("error")
        if err is not None:
            nats.js.errors.APIError.from_error(err)  # raises the error's class
        return ack
