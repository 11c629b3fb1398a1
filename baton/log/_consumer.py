"""An ordered, ephemeral pull consumer on one subject that never loses or repeats a record.

The algorithm is JetStream's "ordered consumer" (as in nats.go's ``OrderedConsumer``): an
ephemeral, memory-stored, ``AckNone`` pull consumer filtered on one subject. We keep one
pull request of at most ``batch`` records outstanding, so memory per reader is bounded by
``batch`` messages whatever the producer does (push consumers with flow control overran
small client buffers in practice). Every delivery carries its stream and consumer
sequence in the reply subject; a consumer-sequence gap, a ``409`` (consumer deleted), or
silence for three idle-heartbeat intervals (server restart; a watchdog looks once an
interval) makes it recreate the consumer from the last delivered stream sequence + 1: no
gap, no duplicate.

nats-py's own ordered consumer recreates in fire-and-forget tasks that give up on the
first error (e.g. while the server restarts), so this one is ours.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass
from typing import cast

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import api
from nats.js.manager import JetStreamManager

from baton.retry import Deadline, retry

log = logging.getLogger(__name__)

_STATUS = "Status"
#: JetStream's advisory subject (then ``.<stream>``) when a stream's new leader is elected.
_LEADER_ELECTED = "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED"
_DESCRIPTION = "Description"


#: Put in a subscription's queue by the watchdog: nothing was heard for three heartbeats.
_SILENCE = cast(Msg, object())


def pending_queue(sub: Subscription) -> asyncio.Queue[Msg]:
    """The queue nats-py's read loop puts a callback-less subscription's messages in.

    A private attribute of nats-py (``Subscription._pending_queue``): its public ways of
    taking from it (``next_msg``, ``messages``) start a task per message.
    tests/log/test_consumer.py fails when nats-py renames it or stops filling it.

    Raises:
        RuntimeError: this nats-py has no such queue.
    """
    queue = getattr(sub, "_pending_queue", None)
    if not isinstance(queue, asyncio.Queue):
        raise RuntimeError("nats-py changed: a subscription has no _pending_queue")
    return queue


#: JetStream's error code for a create past the stream's ``max_consumers``.
ERR_MAX_CONSUMERS = 10026
_full_warned: dict[str, float] = {}  # stream -> when its full consumers were last logged


def _warn_full(stream: str) -> None:
    """Log, at most every 10 s per stream, that reads wait for a consumer: they retry until
    another read ends, and without this only their latency would tell."""
    now = time.monotonic()
    if now - _full_warned.get(stream, -10.0) >= 10.0:
        _full_warned[stream] = now
        log.warning("stream %s has as many consumers as it takes (max_consumers; BATON_LOG_MAX_CONSUMERS): "
                    "reads wait until others end", stream)


@dataclass(frozen=True)
class Delivered:
    """One delivered record: stream sequence, records still pending after it, headers, body."""

    seq: int
    pending: int
    headers: dict[str, str]
    data: bytes


def _ack_meta(reply: str) -> tuple[int, int, int] | None:
    """(stream seq, consumer seq, pending) from a ``$JS.ACK`` reply subject, v1 or v2 form."""
    tokens = reply.split(".")
    if len(tokens) < 9 or tokens[0] != "$JS" or tokens[1] != "ACK":
        return None
    if len(tokens) == 9:
        return int(tokens[5]), int(tokens[6]), int(tokens[8])
    return int(tokens[7]), int(tokens[8]), int(tokens[10])


class OrderedConsumer:
    """Delivers one subject's records in stream order from ``start_seq``, exactly once.

    Use as ``async with OrderedConsumer(...) as c: rec = await c.next()``. ``next`` blocks
    until a record arrives; it survives server restarts and consumer deletion by
    recreating the consumer (retrying with back-off until cancelled).

    Args:
        nc: a connected NATS client.
        stream: the stream name.
        subject: the one subject to read.
        start_seq: the first stream sequence wanted.
        headers_only: deliver headers without bodies (``Nats-Msg-Size`` tells the size).
        idle_heartbeat: seconds between server heartbeats while a pull waits; three
            missed ones mean the server or the consumer is gone.
        batch: records per pull request (the per-reader memory bound).
        request_timeout: seconds for JetStream API calls.
    """

    def __init__(
        self,
        nc: NATS,
        stream: str,
        subject: str,
        start_seq: int,
        *,
        headers_only: bool = False,
        idle_heartbeat: float = 1.0,
        batch: int = 256,
        request_timeout: float = 5.0,
    ) -> None:
        self._nc = nc
        self._jsm = JetStreamManager(nc, timeout=request_timeout)
        self._stream = stream
        self._subject = subject
        self._next_seq = max(start_seq, 1)
        self._headers_only = headers_only
        self._hb = idle_heartbeat
        self._batch = batch
        self._timeout = request_timeout
        self._sub: Subscription | None = None
        # The current subscription's own queue, which nats-py's read loop fills: at most one
        # pull batch (plus a few status messages) is ever in it. A dropped subscription's
        # leftovers go with its queue.
        self._queue: asyncio.Queue[Msg] | None = None
        # The silence watchdog (see _watch): one timer per heartbeat interval, not one
        # timeout per message.
        self._watchdog: asyncio.TimerHandle | None = None
        self._heard = 0  # the subscription's deliveries at the last tick
        self._quiet = 0  # ticks in a row without a delivery
        self._consumer: str | None = None
        self._cseq = 0
        self._credit = 0  # records the outstanding pull request may still bring
        self.resets = 0  # how many times the consumer was recreated (for tests and metrics)

    @property
    def buffered(self) -> int:
        """Records delivered to this client and not yet taken (at most one pull batch)."""
        return self._queue.qsize() if self._queue is not None else 0

    async def __aenter__(self) -> "OrderedConsumer":
        if self._sub is None:  # not created yet (LogReader.prepare may have created it)
            await self._create()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Unsubscribe and delete the consumer (best effort; it also expires on its own)."""
        await self._drop()

    async def _drop(self) -> None:
        sub, self._sub = self._sub, None
        consumer, self._consumer = self._consumer, None
        self._credit = 0
        self._queue = None
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        if consumer is not None and not self._nc.is_closed and self._nc.is_connected:
            with contextlib.suppress(nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError):
                await self._jsm.delete_consumer(self._stream, consumer)

    async def _create(self) -> None:
        """(Re)create the consumer from ``_next_seq``, retrying until it exists.

        No budget: a reader waits out a NATS restart (nats-py reconnects on its own) until
        its owner cancels it.

        A create sent while the stream has no leader (an R3 stream electing one after its
        leader died) is never answered: it would wait out its whole ``request_timeout``
        (5 s) after the election. So while retrying, the stream's leader-elected advisory is
        watched, and when it comes the create in flight is dropped and another sent at once
        (measured: readers waited 1.6 s past the appends for the timed-out create).
        A create is not answered either while JetStream has no *meta* leader (it places the
        consumer), and that election ends on its own timer, before or after the stream's,
        with no advisory a client account sees: so each try waits 0.5 s at first, then
        twice as long as the last (up to ``request_timeout``: a slow server is not flooded),
        and a stream advisory starts over at 0.5 s (measured: readers 5 s past the appends,
        after a create sent at the stream's election went unanswered).
        """
        if self._sub is None:  # the first create: nothing to wait out
            await retry(self._create_once, deadline=Deadline.never(),
                        retry_on=(nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError),
                        first_pause=0.05, max_pause=1.0)
            return
        elected = asyncio.Event()

        async def on_elected(_msg: Msg) -> None:
            elected.set()

        watch: Subscription | None = None
        with contextlib.suppress(nats.errors.Error):
            watch = await self._nc.subscribe(f"{_LEADER_ELECTED}.{self._stream}", cb=on_elected)
        pause = 0.05
        patience = min(0.5, self._timeout)
        try:
            while True:
                elected.clear()
                attempt = asyncio.ensure_future(self._create_once(patience))
                waiter = asyncio.ensure_future(elected.wait())
                try:
                    await asyncio.wait({attempt, waiter}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                    if not attempt.done():  # a new leader, or our own cancel
                        attempt.cancel()
                if not attempt.done():
                    # The create in flight went to nobody: let it end, send another now.
                    await asyncio.wait({attempt})
                    if not attempt.cancelled():
                        attempt.exception()
                    log.debug("stream %s elected a leader; creating its consumer again", self._stream)
                    patience = min(0.5, self._timeout)
                    continue
                try:
                    attempt.result()
                    return
                except (nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError) as exc:
                    log.debug("creating consumer on %s failed (%s); retrying", self._stream, type(exc).__name__)
                    if isinstance(exc, (nats.errors.TimeoutError, asyncio.TimeoutError)):
                        patience = min(patience * 2, self._timeout)
                        continue  # unanswered: waited already
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await elected.wait()
                pause = min(pause * 2, 1.0)
        finally:
            if watch is not None:
                with contextlib.suppress(nats.errors.Error):
                    await watch.unsubscribe()

    async def _create_once(self, timeout: float | None = None) -> None:
        await self._drop()
        # Room for one full batch plus status messages (and the watchdog's mark): the client
        # never drops. No callback: nats-py would run it on a task of its own, one more task
        # switch per record before the reader has it; the reader takes records from the
        # subscription's queue itself (_receive).
        sub = self._sub = await self._nc.subscribe(
            self._nc.new_inbox(), pending_msgs_limit=self._batch + 64, pending_bytes_limit=0,
        )
        self._queue = pending_queue(sub)
        # nats-py gives a callback-less subscription a message iterator that refers back to
        # it (a reference cycle, with its queue, until a full collection); it is never used here.
        sub._message_iterator = None
        cfg = api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self._next_seq,
            filter_subject=self._subject,
            ack_policy=api.AckPolicy.NONE,
            headers_only=self._headers_only or None,
            mem_storage=True,
            num_replicas=1,
            inactive_threshold=max(30.0, self._hb * 10),
        )
        try:
            info = await self._jsm.add_consumer(self._stream, config=cfg, timeout=timeout or self._timeout)
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code == ERR_MAX_CONSUMERS:
                _warn_full(self._stream)
            raise
        self._consumer = info.name
        self._cseq = 0
        await self._pull()
        # Watched from the first pull on: heartbeats only come once the consumer exists and a
        # pull waits, so a create slower than three intervals must not read as silence (it
        # would reset the new consumer, and a loaded server's next create likewise).
        self._heard, self._quiet = sub.delivered, 0
        self._watchdog = asyncio.get_running_loop().call_later(self._hb, self._watch, sub)

    async def _pull(self) -> None:
        assert self._sub is not None and self._consumer is not None
        req = {
            "batch": self._batch,
            "expires": int(max(self._hb * 30, 5.0) * 1e9),
            "idle_heartbeat": int(self._hb * 1e9),
        }
        await self._nc.publish(
            f"$JS.API.CONSUMER.MSG.NEXT.{self._stream}.{self._consumer}",
            json.dumps(req).encode(),
            reply=self._sub.subject,
        )
        self._credit = self._batch

    def _watch(self, sub: Subscription) -> None:
        """Once per heartbeat interval: after three intervals without a delivery (no record,
        no heartbeat) while nothing waits to be taken, wake the reader with the silence mark.

        A pull is outstanding whenever the queue is empty (next_raw asks again as soon as
        the last credited record is taken), and the server sends a heartbeat every interval
        while one waits: three missed ones mean the server or the consumer is gone.
        """
        if sub is not self._sub or self._queue is None:
            return  # dropped (its timer was cancelled; a tick already due may still run)
        heard = sub.delivered
        if heard != self._heard:
            self._heard, self._quiet = heard, 0
        else:
            self._quiet += 1
            if self._quiet >= 3 and self._queue.empty():
                self._quiet = 0
                self._queue.put_nowait(_SILENCE)
        self._watchdog = asyncio.get_running_loop().call_later(self._hb, self._watch, sub)

    async def _receive(self) -> Msg:
        """The next delivery from the subscription's queue.

        Raises:
            TimeoutError: the watchdog heard nothing for three heartbeat intervals.
        """
        queue = self._queue
        assert queue is not None
        msg = await queue.get()
        queue.task_done()  # as nats-py's own readers do (a drain waits for it)
        if msg is _SILENCE:
            raise TimeoutError
        return msg

    async def _reset(self, why: str) -> None:
        log.debug("resetting ordered consumer on %s at %d: %s", self._stream, self._next_seq, why)
        self.resets += 1
        began = time.monotonic()
        await self._create()
        took = time.monotonic() - began
        if took > 0.5:  # a server restart or a leader change: how long the reader waited for it
            log.info("ordered consumer on %s recreated at %d after %.2fs (%s)", self._stream, self._next_seq,
                     took, why)

    async def next(self) -> Delivered:
        """The next record of the subject (blocks until there is one)."""
        seq, pending, headers, data = await self.next_raw()
        return Delivered(seq=seq, pending=pending, headers=headers, data=data)

    async def next_raw(self) -> tuple[int, int, dict[str, str], bytes]:
        """Like :meth:`next`, as a plain ``(seq, pending, headers, data)`` tuple (faster)."""
        while True:
            if self._sub is None:
                await self._create()
            assert self._sub is not None
            try:
                msg = await self._receive()
            except asyncio.TimeoutError:
                await self._reset("no heartbeat")
                continue
            headers = msg.headers or {}
            status = headers.get(_STATUS)
            if status is not None and not msg.data:
                if status == "100":
                    continue  # idle heartbeat: the pull is alive
                if status == "408" or (status == "409" and "Batch" in headers.get(_DESCRIPTION, "")):
                    await self._pull()  # the request expired or completed: ask again
                    continue
                # 409 Consumer Deleted, 404/503 and friends: start over where we are.
                await self._reset(f"status {status} {headers.get(_DESCRIPTION, '')}")
                continue
            meta = _ack_meta(msg.reply or "")
            if meta is None:
                continue  # not a JetStream delivery; ignore
            sseq, cseq, pending = meta
            if cseq != self._cseq + 1:
                await self._reset(f"consumer seq gap {self._cseq} -> {cseq}")
                continue
            self._cseq = cseq
            self._credit -= 1
            if self._credit <= 0:
                await self._pull()
            if sseq < self._next_seq:
                continue  # cannot happen with by-start-sequence, but never deliver twice
            self._next_seq = sseq + 1
            return sseq, pending, headers, msg.data
