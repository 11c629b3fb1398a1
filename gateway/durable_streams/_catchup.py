"""Catching a cached stream view up with other gateways' writes, record by record.

Another gateway's write is heard (core NATS) with the sequence it was fenced on, ``prev``
(its ``Nats-Expected-Last-Subject-Sequence``). JetStream stores it only if the subject's
last record is then ``prev``; so once a view has folded a record past ``prev``, that write
is folded already or was refused, and a view whose last sequence is ``prev`` or less lacks
a record that is stored or about to be: this write, or the one stored before it that
refused it. Such a view (``heard_prev >= js_last``) is caught up before it is served, with
direct gets of the subject's next records after its last sequence, in stream order (one
request per record behind), instead of folding the whole stream again. A write is heard of
before JetStream has stored it (the server hands it to subscribers and to the stream's
store side by side), so a record not there yet is waited for briefly; one that never comes
(refused for space, with nothing stored after ``prev``) gives up the view, which is then
folded anew.

Most catch-ups need no get. JetStream acks a write on the reply subject its writer gave,
``_DSACK.<stream>.<writer>.<key>.<prev>.<crc32 of the record>.<n>``, and every gateway of the
stream subscribes to ``_DSACK.<stream>.>`` (``baton.log._replies``, shared): each hears the
others' acks, with the stored sequence, at no cost to the writer. The record itself was heard
already (:class:`Heard` keeps it), and a view whose last sequence is that ``prev`` folds it
at the ack's sequence. The fence makes that exact: JetStream stored the record only because
the subject's last record was ``prev``, so it is the record after the view's last, and the
CRC ties the ack to the bytes heard. A catch-up of a view whose next record came from a
gateway that acks this way waits for that ack briefly (:data:`ACK_WAIT`) before it asks
JetStream; an ack lost, or a writer whose acks go to its own inbox (an older gateway), costs
that wait or nothing, then the gets as before.
"""
from __future__ import annotations

import asyncio
import functools
import collections
import contextlib
import json
import zlib
from typing import Awaitable, Callable

import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from gateway.durable_streams import _model as M
from gateway.durable_streams._model import StreamState

EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"
WAIT = 0.5  # seconds a catch-up waits for a record heard of to be stored
ACK_WAIT = 0.05  # seconds a catch-up waits for the writer's ack to be heard before a get

Fetch = Callable[[int], Awaitable["tuple[int, bytes] | None"]]


def expected_last(msg: Msg) -> int | None:
    """The sequence another gateway's write was fenced on (``None``: it did not say)."""
    raw = (msg.headers or {}).get(EXPECTED_LAST)
    return int(raw) if raw is not None and _decimal(raw) else None


def _decimal(text: str) -> bool:
    """ASCII digits only (``str.isdigit`` takes ``²``, which ``int`` refuses)."""
    return text.isascii() and text.isdigit()


async def next_record(nc: NATS, stream: str, subject: str, start: int) -> tuple[int, bytes] | None:
    """The first stored record of ``subject`` at or after sequence ``start``, by direct get:
    ``(stream sequence, body)``, or ``None`` when there is none.

    Raises:
        nats.js.errors.APIError: JetStream answered with an error other than "no message".
        nats.errors.TimeoutError: no answer within 5 seconds.
    """
    req = json.dumps({"seq": start, "next_by_subj": subject}).encode()
    msg = await nc.request(f"$JS.API.DIRECT.GET.{stream}", req, timeout=5.0)
    headers = msg.headers or {}
    status = headers.get("Status")
    if status is not None and not msg.data:
        if status == "404":
            return None
        raise nats.js.errors.APIError(code=int(status) if status.isdigit() else None,
                                      description=headers.get("Description", ""))
    return int(headers["Nats-Sequence"]), msg.data


def ack_subject(subject: str) -> tuple[str, str, int, int] | None:
    """``(writer, stream key, prev, crc32 of the record)`` from the reply subject of another
    gateway's write (``_DSACK.<stream>.<writer>.<key>.<prev>.<crc>.<n>``), or ``None``."""
    parts = subject.split(".")
    if len(parts) != 7 or not (_decimal(parts[4]) and _decimal(parts[5])):
        return None
    return parts[2], parts[3], int(parts[4]), int(parts[5])


def ack_seq(body: bytes, stream: str) -> int | None:
    """The stored sequence in JetStream's ack of a write to ``stream``, or ``None`` when it
    refused it (or the body is not such an ack)."""
    try:
        ack = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(ack, dict) or "error" in ack or ack.get("stream") != stream:
        return None
    seq = ack.get("seq")
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


class Heard:
    """Other gateways' records and JetStream's acks of them, as heard, matched by
    ``(stream path, prev)``, writer and CRC-32 in whichever order they come (the record and
    its ack come on two subscriptions, each with its own task).

    Bounded: the oldest go first past ``max_entries`` records and acks or ``max_bytes`` of
    records (a record whose ack never comes, because JetStream refused it or the ack was
    lost, is never asked for; one gone too early costs its view a get). Records over
    ``max_record`` bytes are not kept.
    """

    def __init__(self, max_entries: int = 4096, max_bytes: int = 16 << 20, max_record: int = 256 << 10,
                 max_writers: int = 1024) -> None:
        # (path, prev) -> [{writer: record}, (writer, crc, seq) of the ack or None]
        self._kept: collections.OrderedDict[tuple[str, int], _Slot] = collections.OrderedDict()
        self._entries = 0
        self._bytes = 0
        self._writers: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._max = (max_entries, max_bytes, max_record, max_writers)

    def record(self, path: str, writer: str, prev: int, record: bytes) -> None:
        """``record`` was heard from ``writer``, fenced on ``prev``."""
        if len(record) > self._max[2]:
            return
        slot = self._slot(path, prev)
        old = slot.records.pop(writer, None)
        if old is not None:  # a retry fenced on the same sequence: the later one counts
            self._entries -= 1
            self._bytes -= len(old)
        slot.records[writer] = record
        self._entries += 1
        self._bytes += len(record)
        self._bound()

    def ack(self, path: str, writer: str, prev: int, crc: int, seq: int) -> None:
        """JetStream stored ``writer``'s record fenced on ``prev``, of CRC-32 ``crc``, at ``seq``."""
        self._writers[writer] = None
        self._writers.move_to_end(writer)
        if len(self._writers) > self._max[3]:
            self._writers.popitem(last=False)
        slot = self._slot(path, prev)
        if slot.ack is None:
            self._entries += 1
        slot.ack = (writer, crc, seq)
        self._bound()

    def stored_after(self, path: str, prev: int) -> tuple[int, bytes] | None:
        """``(seq, record)``: the record stored after ``prev``, once both it and its ack were
        heard (then both are forgotten, with every other record fenced on ``prev``: only one
        is stored after it); else ``None``."""
        slot = self._kept.get((path, prev))
        if slot is None or slot.ack is None:
            return None
        writer, crc, seq = slot.ack
        record = slot.records.get(writer)
        if record is None or zlib.crc32(record) != crc:
            return None
        self._drop((path, prev))
        return seq, record

    def due(self, path: str, prev: int) -> bool:
        """Whether a record fenced on ``prev`` was heard from a writer whose acks are heard,
        and no ack for ``prev`` yet (it then comes, unless lost)."""
        slot = self._kept.get((path, prev))
        return slot is not None and slot.ack is None and any(w in self._writers for w in slot.records)

    def _slot(self, path: str, prev: int) -> "_Slot":
        slot = self._kept.get((path, prev))
        if slot is None:
            slot = self._kept[(path, prev)] = _Slot()
        return slot

    def _drop(self, key: tuple[str, int]) -> None:
        slot = self._kept.pop(key)
        self._entries -= len(slot.records) + (slot.ack is not None)
        self._bytes -= sum(len(r) for r in slot.records.values())

    def _bound(self) -> None:
        max_entries, max_bytes, _, _ = self._max
        while self._entries > max_entries or self._bytes > max_bytes:
            self._drop(next(iter(self._kept)))


class _Slot:
    __slots__ = ("records", "ack")

    def __init__(self) -> None:
        self.records: dict[str, bytes] = {}
        self.ack: tuple[str, int, int] | None = None


async def catch_up(st: StreamState, fetch: Fetch, current: Callable[[], bool], wait: float = WAIT,
                   ack_due: Callable[[int], bool] | None = None, ack_wait: float = ACK_WAIT) -> bool:
    """Fold into ``st`` the records after ``st.js_last`` until it is past every write heard of.

    Records at or below ``st.js_last`` when they arrive (this gateway's own write, folded
    while the get was out) are skipped; the view's readers are woken if anything was folded.

    Args:
        st: the cached view (changed in place).
        fetch: the first record at or after a sequence (:func:`next_record` bound to the
            stream's subject).
        current: whether ``st`` is still the cached view (else the catch-up stops).
        wait: seconds to wait for a record heard of to be stored.
        ack_due: whether the record after a sequence will be named by an ack heard (its
            fold then comes from that ack, and this waits for it first).
        ack_wait: seconds to wait for such an ack before asking JetStream.

    Returns:
        Whether ``st`` is caught up; ``False``: drop it (the records did not come, or the
        stream was deleted, maybe created anew).
    """
    loop = asyncio.get_running_loop()
    deadline: float | None = None  # for a record heard of to be stored: from the first get that missed it
    ack_deadline = loop.time() + ack_wait
    pause = 0.0005
    changed = False
    try:
        while st.heard_prev >= st.js_last:
            if ack_due is not None and ack_due(st.js_last) and loop.time() < ack_deadline:
                ev = st.changed  # set by the ack's fold
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(ack_deadline):
                        await ev.wait()
                if not current():
                    return False
                continue
            rec = await fetch(st.js_last + 1)
            if not current():
                return False
            if rec is None:
                if deadline is None:
                    deadline = loop.time() + wait
                elif loop.time() >= deadline:
                    return False
                await asyncio.sleep(pause)  # stored within moments (or what refused it is)
                pause = min(pause * 2, 0.02)
                continue
            seq, body = rec
            if seq <= st.js_last:
                continue
            meta, data = M.decode_record(body)
            if M.apply(st, seq, meta, data) is not st:
                return False
            changed = True
        return True
    finally:
        if changed:
            st.notify()


class CatchUps:
    """The catch-ups in flight, one per stream path whoever asks for it.

    Args:
        nc: the store's NATS connection.
        stream: the JetStream stream holding the streams' subjects.
        heard: the records heard, whose acks a catch-up waits for first.
        ack_wait: seconds a catch-up waits for an ack due (:func:`catch_up`).
    """

    def __init__(self, nc: NATS, stream: str, heard: Heard, ack_wait: float = ACK_WAIT) -> None:
        self._nc = nc
        self._stream = stream
        self._heard = heard
        self._ack_wait = ack_wait
        # path -> (the view being caught up, its catch-up); one a later view replaced runs
        # on (and stops: it is no longer the cached one), kept in _running for cancel().
        self._tasks: dict[str, tuple[StreamState, asyncio.Task[bool]]] = {}
        self._running: set[asyncio.Task[bool]] = set()

    async def run(self, path: str, subject: str, st: StreamState,
                  cached: Callable[[str], StreamState | None]) -> bool:
        """Catch ``st``, the cached view of ``path`` (``cached(path)``), up (:func:`catch_up`),
        or wait for the catch-up of it already running (of this view: one of a view dropped
        since is not waited for); whether it is caught up (``False``: drop it if still
        cached). The catch-up runs on if the caller is cancelled."""
        slot = self._tasks.get(path)
        if slot is not None and slot[0] is st:
            task = slot[1]
        else:
            fetch = functools.partial(next_record, self._nc, self._stream, subject)
            task = asyncio.create_task(
                catch_up(st, fetch, lambda: cached(path) is st,
                         ack_due=functools.partial(self._heard.due, path), ack_wait=self._ack_wait),
                name="ds-catch-up")
            self._tasks[path] = (st, task)
            self._running.add(task)
            task.add_done_callback(functools.partial(self._done, path))
        ok = await asyncio.shield(task)
        return ok or cached(path) is not st

    def _done(self, path: str, task: asyncio.Task[bool]) -> None:
        self._running.discard(task)
        slot = self._tasks.get(path)
        if slot is not None and slot[1] is task:
            del self._tasks[path]
        if not task.cancelled():
            task.exception()  # retrieved: its waiters got it already

    def cancel(self) -> None:
        """Cancel every catch-up (the store stops)."""
        for task in list(self._running):
            task.cancel()
