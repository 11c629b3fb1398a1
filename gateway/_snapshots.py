"""The snapshots a gateway serves joins from (docs/design.md §4.6): read once, shared by readers.

A join from a snapshot looks up the run's latest complete snapshot (one read of the last
record on ``<run>.~snap``) and serves its events. The events' JSON bytes are kept in a
small cache keyed by the snapshot's last record, so a hundred readers of one long run hold
one copy, not a hundred, and the decoded messages are dropped at once. The frames are
written in slices (:data:`SLICE` bytes), so a reader whose client stopped reading holds at
most a slice and the socket's buffer of the snapshot, however long the run: what a reader
costs the gateway does not grow with the run.

A join may ask for only the newest ``N`` messages (``messages=N``, :meth:`ServedSnapshot.window`):
the ``MESSAGES_SNAPSHOT`` line is cut by the message ends its head records (never parsed),
and a ``CUSTOM snapshot.window`` event before it says how many older messages were left out
and the cursor that pages them. Of the kept chunks (``CUSTOM``, ``SUBAGENT_*``…) the window
serves those that came with its messages, and of the older ones the state they leave
(gateway/_kept.py), so its size follows the messages asked for, not the run's length (:meth:`ServedSnapshot.page`, ``GET /api/runs/{id}/messages``).
Messages are only ever appended to a run's transcript and every one but the last is final
once a later message exists, so a cursor's older messages are the same in every later
snapshot of the run: a page is read from the latest one.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
from dataclasses import dataclass
from typing import Any, Iterator

import nats.errors
import nats.js.errors

from baton.errors import LogUnavailable
from baton.log import _headers as H
from baton.log._api import first_on_subject, record_at
from baton.log._compact import is_compacted
from baton.log._snapshots import body_of, latest_final, part_at, part_seqs
from baton.errors import InvalidArgument
from baton.runs import SNAPSHOT_WINDOW, STREAM_COMPACTED
from baton.log.snapshot import MESSAGES_HEAD, MESSAGES_TAIL, head_and_lines, messages_line, parse_head
from gateway import _grpc_wire
from gateway._kept import KeptIndex, fold, index_of, served_indices
from gateway._paging import check_cursor, cursor_of
from gateway._sse import Framing, dumps

log = logging.getLogger("gateway.snapshots")

#: Largest piece of a snapshot frame written at once (bytes).
SLICE = 64 * 1024
#: Bytes of snapshot events a gateway keeps for the next reader.
CACHE_BYTES = 64 << 20
#: Windows of the newest messages a gateway keeps (each about as large as the messages asked for).
WINDOWS = 16


@dataclass(frozen=True)
class ServedSnapshot:
    """A snapshot as readers get it.

    Attributes:
        offset: the stream sequence of the last chunk it covers (the resume id of its last event).
        events: each event's JSON bytes, in order.
        input_count: how many of its messages are the run's input (the first ones).
        msg_line: the index in ``events`` of the ``MESSAGES_SNAPSHOT`` line (-1: none).
        msg_ends: where each message ends in that line (byte index, exclusive; ``None``:
            unknown, the snapshot is then only served whole).
    """

    offset: int
    events: tuple[bytes, ...]
    input_count: int = 0
    msg_line: int = -1
    msg_ends: tuple[int, ...] | None = None
    record: int = 0  #: the stream sequence of its record's last part (its cursors name it)
    kept: KeptIndex | None = None  #: where its kept chunks are and what they are (``None``: unknown)

    def compacted(self) -> "ServedSnapshot":
        """The same, after a ``CUSTOM stream.compacted {snapshotOffset}`` event (no id): what a
        join from the start of a compacted log gets (docs/api.md)."""
        marker = dumps({"type": "CUSTOM", "name": STREAM_COMPACTED, "value": {"snapshotOffset": str(self.offset)}})
        kept = dataclasses.replace(self.kept, line=self.kept.line + 1) if self.kept is not None else None
        return dataclasses.replace(self, events=(marker, *self.events),
                                   msg_line=self.msg_line + 1 if self.msg_line >= 0 else -1, kept=kept)

    @property
    def total(self) -> int:
        """How many messages its ``MESSAGES_SNAPSHOT`` holds (0 when they are not indexed)."""
        return len(self.msg_ends or ())

    def messages(self, lo: int, hi: int) -> list[bytes]:
        """The JSON bytes of messages ``lo`` up to ``hi`` (exclusive), sliced, never parsed."""
        ends, line = self.msg_ends or (), self.events[self.msg_line] if self.msg_line >= 0 else b""
        out = []
        for i in range(max(lo, 0), min(hi, len(ends))):
            start = len(MESSAGES_HEAD) if i == 0 else ends[i - 1] + 1  # past the comma
            out.append(line[start:ends[i]])
        return out

    def _id_at(self, position: int) -> str:
        msg = json.loads(self.messages(position, position + 1)[0])
        return str(msg.get("id", "")) if isinstance(msg, dict) else ""

    def _cursor(self, position: int) -> str:
        return snapshot_cursor(position, self._id_at(position), self.record) if position > 0 else ""

    def window(self, newest: int) -> "ServedSnapshot":
        """The same with only the newest ``newest`` messages in its ``MESSAGES_SNAPSHOT``, after a
        ``CUSTOM snapshot.window`` event (no id): ``{messagesOmitted, cursor, totalMessages,
        inputMessages, snapshotOffset}``; ``cursor`` (``null`` when nothing was left out) pages
        the older ones (:meth:`page`). A snapshot whose messages are not indexed is served
        whole, with ``messagesOmitted`` 0: never a silent gap."""
        total = self.total
        first = max(0, total - newest) if self.msg_ends is not None else 0
        if self.msg_line < 0:
            event = window_event(first, self._cursor(first), total, self.input_count, self.offset)
            return dataclasses.replace(self, events=(event, *self.events))
        after, omitted = fold(list(self.events[self.msg_line + 1:]), self.kept, self.msg_line + 1, first)
        event = window_event(first, self._cursor(first), total, self.input_count, self.offset, omitted)
        events = list(self.events[:self.msg_line + 1]) + after
        if first:
            events[self.msg_line] = MESSAGES_HEAD + b",".join(self.messages(first, total)) + MESSAGES_TAIL
        events.insert(self.msg_line, event)
        # The window has no index of its own: it is served, never paged or cut again.
        return ServedSnapshot(self.offset, tuple(events), self.input_count, record=self.record)

    def page(self, limit: int, before: str | None) -> tuple[list[bytes], int, str]:
        """A page of its messages, newest first (as gateway._paging.window): ``(each message's
        JSON bytes, the page's first position, the cursor of the next older page or "")``.

        Args:
            limit: messages at most (0: every one before the cursor).
            before: a cursor of :meth:`window` or of an earlier page (``None``: the newest page).

        Raises:
            InvalidArgument: ``before`` is not a cursor of this run's messages (field ``before``).
        """
        end = self.total
        parsed = parse_snapshot_cursor(before)
        if parsed is not None:
            position, mid, _ = parsed
            if not 0 < position < end or self._id_at(position) != mid:
                raise InvalidArgument("before", "is not a cursor of this run's messages")
            end = position
        start = max(0, end - limit) if limit else 0
        return self.messages(start, end), start, self._cursor(start)

    @property
    def size(self) -> int:
        return sum(len(e) for e in self.events)

    def frames(self, framing: Framing) -> Iterator[bytes]:
        """The events framed as chunks, in pieces of at most about :data:`SLICE` bytes; only
        the last event carries the resume id (a client cut inside the snapshot gets it whole
        again, one resumed after it gets the chunks after ``offset``)."""
        last = len(self.events) - 1
        for i, payload in enumerate(self.events):
            oid = str(self.offset).encode() if i == last else None
            if framing == "grpc":  # one message each: a gRPC message is never sent in pieces
                yield _grpc_wire.chunk_frame(oid or b"", payload)
                continue
            if framing == "ndjson":
                head, tail = (b'{"id":"%b","chunk":' % oid if oid else b'{"chunk":'), b"}\n"
            else:
                head, tail = (b"id: %b\ndata: " % oid if oid else b"data: "), b"\n\n"
            if len(payload) <= SLICE:
                yield head + payload + tail
                continue
            yield head
            for at in range(0, len(payload), SLICE):
                yield payload[at:at + SLICE]
            yield tail


class SnapshotCache:
    """The latest snapshots served, by run and snapshot record (least recently used dropped).

    Args:
        max_bytes: bytes of event JSON kept in all.
    """

    def __init__(self, max_bytes: int = CACHE_BYTES) -> None:
        self._max = max_bytes
        self._kept: collections.OrderedDict[tuple[str, int], ServedSnapshot] = collections.OrderedDict()
        self._windows: collections.OrderedDict[tuple[str, int, int], ServedSnapshot] = collections.OrderedDict()
        self._reading: dict[tuple[str, int, int], asyncio.Lock] = {}
        self._bytes = 0

    async def newest(self, delivery_log: Any, run_id: str, newest: int) -> ServedSnapshot | None:
        """The run's latest complete snapshot with only its newest ``newest`` messages (after
        its ``snapshot.window`` event), or ``None`` when it has none: from the cache when it
        holds the snapshot, else reading only the parts the window needs (:func:`read_window`).

        Raises:
            LogUnavailable: JetStream did not answer.
        """
        final = await latest_final(delivery_log.nc, delivery_log.cfg, run_id)
        if final is None:
            return None
        hit = self._kept.get((run_id, final.seq))
        if hit is None:
            key = (run_id, final.seq, newest)
            # Readers of one run joining at once share one read and one window.
            async with self._reading.setdefault(key, asyncio.Lock()):
                cut = self._windows.get(key)
                if cut is None:
                    try:
                        cut = await read_window(delivery_log, run_id, final, newest)
                    except (ValueError, KeyError, IndexError) as exc:
                        log.warning("snapshot of run %s at %d: its newest messages are unreadable (%s): read whole",
                                    run_id, final.seq, exc)
                    if cut is not None:
                        self._windows[key] = cut
                        while len(self._windows) > WINDOWS:
                            self._windows.popitem(last=False)
            self._reading.pop(key, None)
            if cut is not None:
                self._windows.move_to_end(key)
                return cut
        whole = await self.latest(delivery_log, run_id)
        return None if whole is None else whole.window(newest)

    async def at(self, delivery_log: Any, run_id: str, record: int) -> ServedSnapshot | None:
        """The run's snapshot whose last part is at stream sequence ``record`` (a cursor's), or
        ``None`` when it is gone (retention, compaction) or is not one of this run's.

        Raises:
            LogUnavailable: JetStream did not answer.
        """
        hit = self._kept.get((run_id, record))
        if hit is not None:
            self._kept.move_to_end((run_id, record))
            return hit
        nc, cfg = delivery_log.nc, delivery_log.cfg
        try:
            final = await record_at(nc, cfg.stream, record)
        except (nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError) as exc:
            raise LogUnavailable(run_id, f"reading the snapshot failed: {type(exc).__name__}") from exc
        if final is None or not final.headers.get(H.MSG_ID, "").startswith(f"{run_id}/snap/"):
            return None
        i, _, n = final.headers.get(H.SNAP_PART, "").partition("/")
        body = await body_of(nc, cfg, run_id, final) if n and i == n else None
        if body is None:
            return None
        try:
            served = served_of(body, final.seq)
        except ValueError:
            return None
        self._keep((run_id, record), served)
        return served

    def _keep(self, key: tuple[str, int], served: ServedSnapshot) -> None:
        if served.size <= self._max and key not in self._kept:
            self._kept[key] = served
            self._bytes += served.size
            while self._bytes > self._max:
                _, old = self._kept.popitem(last=False)
                self._bytes -= old.size

    async def latest(self, delivery_log: Any, run_id: str) -> ServedSnapshot | None:
        """The run's latest complete snapshot, or ``None`` when it has none (or it is unreadable).

        Raises:
            LogUnavailable: JetStream did not answer.
        """
        final = await latest_final(delivery_log.nc, delivery_log.cfg, run_id)
        if final is None:
            return None
        key = (run_id, final.seq)
        hit = self._kept.get(key)
        if hit is not None:
            self._kept.move_to_end(key)
            return hit
        body = await body_of(delivery_log.nc, delivery_log.cfg, run_id, final)
        if body is None:
            return None
        try:
            served = served_of(body, final.seq)  # served as stored: only the head is parsed
        except ValueError as exc:
            log.warning("snapshot of run %s at %d is unreadable (%s): joined from the start", run_id, final.seq, exc)
            return None
        self._keep(key, served)
        return served


def window_event(first: int, cursor: str, total: int, input_count: int, offset: int, events_omitted: int = 0) -> bytes:
    """``CUSTOM snapshot.window``: what a join from the newest messages left out (docs/api.md):
    ``events_omitted`` kept chunks older than the window whose state a later one carries
    (gateway/_kept.py)."""
    return dumps({"type": "CUSTOM", "name": SNAPSHOT_WINDOW, "value": {
        "messagesOmitted": first, "cursor": cursor or None, "totalMessages": total,
        "inputMessages": input_count, "snapshotOffset": str(offset), "eventsOmitted": events_omitted}})


async def read_window(delivery_log: Any, run_id: str, final: Any, newest: int) -> ServedSnapshot | None:
    """The newest ``newest`` messages of the snapshot whose last part is ``final``, reading only
    its first part(s) (the head: where each message and kept chunk is), the parts from the
    window's first message to the kept chunks, the parts of the kept chunks the window serves
    (gateway/_kept.py) and those after them, never the whole record
    (:meth:`ServedSnapshot.window`'s events).

    Returns ``None`` when the record does not say where its parts are (the caller reads it
    whole), or a part is gone.

    Raises:
        LogUnavailable: JetStream did not answer.
    """
    nc, cfg = delivery_log.nc, delivery_log.cfg
    seqs = part_seqs(final)
    if seqs is None or len(seqs) < 2:
        return None
    got: dict[int, bytes] = {len(seqs) - 1: final.data}

    async def fetch(wanted: set[int]) -> bool:
        need = sorted(i for i in wanted if i not in got)
        # Asked for at once: one round trip's wait, not one per part.
        res = await asyncio.gather(*(part_at(nc, cfg, run_id, seqs[i], final) for i in need), return_exceptions=True)
        for r in res:  # every read ended (none left running); the first failure is the answer
            if isinstance(r, BaseException):
                raise r
        for i, r in zip(need, res):
            if not isinstance(r, bytes):
                return False
            got[i] = r
        return True

    if not await fetch({0}):
        return None
    size = len(got[0])  # every part but the last holds exactly this many bytes (baton.log.snapshot.split)
    end = size * (len(seqs) - 1) + len(final.data)  # the body's length
    buf = got[0]
    while b"\n" not in buf and len(buf) < end:  # a head larger than a part: the parts after it
        if not await fetch({len(buf) // size}):
            return None
        buf += got[len(buf) // size]
    head_raw, sep, _ = buf.partition(b"\n")
    if not sep:
        return None
    try:
        head = parse_head(head_raw)
    except ValueError:
        return None
    ends = head.get("msgEnds")
    if not isinstance(ends, list):
        return None
    total = len(ends)
    first = max(0, total - newest)
    # Only the ends this window uses are read, so only they are checked (a long run's head
    # holds tens of thousands: a Python step each was most of a cold window's time).
    if not all(type(ends[i]) is int for i in (first - 1, first, total - 1) if 0 <= i < total):
        return None
    before: list[bytes] = []  # the events before MESSAGES_SNAPSHOT (RUN_STARTED)
    events_at = at = len(head_raw) + 1
    while not buf.startswith(MESSAGES_HEAD, at):
        nl = buf.find(b"\n", at)
        if nl < 0:
            return None
        before.append(buf[at:nl])
        at = nl + 1
    start = at + (ends[first - 1] + 1 if first else len(MESSAGES_HEAD))  # body offset of the window
    stop = at + (ends[-1] if ends else len(MESSAGES_HEAD))  # body offset past the last message
    rest_at = stop + len(MESSAGES_TAIL) + 1  # the lines after MESSAGES_SNAPSHOT
    index = index_of(head)
    located = index is not None and index.start >= 0 and index.line == len(before) + 1
    # Byte ranges to read: the window's messages to the kept chunks (the state between), the
    # kept chunks served, and the lines after them (the end); without an index, all of it.
    # Only the served chunks' spans are built: of the older ones, few are served.
    starts = index.starts() if located and index and index.lens else []
    kept_lo = events_at + starts[0] if starts else 0  # the first kept chunk's start
    kept_hi = events_at + starts[-1] - 1 if starts else 0  # the last one's end
    serve: list[tuple[int, int]] = []
    omitted = 0
    if starts and kept_hi <= end and kept_lo >= rest_at:
        assert index is not None
        picked = served_indices(index, first)
        serve = [(events_at + starts[i], events_at + starts[i] + index.lens[i]) for i in picked]
        omitted = len(index.lens) - len(picked)
        ranges = [(start, kept_lo), *serve, (kept_hi + 1, end)]
    else:
        starts, ranges = [], [(start, end)]
    if not await fetch({i for lo, hi in ranges if hi > lo for i in range(lo // size, (hi - 1) // size + 1)}):
        return None

    def cut(lo: int, hi: int) -> bytes:
        return b"".join(got[i][max(lo - i * size, 0):hi - i * size] for i in range(lo // size, (hi - 1) // size + 1)) \
            if hi > lo else b""

    msgs = cut(start, stop)
    cursor = ""
    if first:
        one = json.loads(cut(start, at + ends[first]))
        cursor = snapshot_cursor(first, str(one.get("id", "")) if isinstance(one, dict) else "", final.seq)
    if starts:
        between = cut(rest_at, kept_lo - 1)
        last = cut(kept_hi + 1, end)
        rest = [*(between.split(b"\n") if between else []), *(cut(lo, hi) for lo, hi in serve),
                *(last.split(b"\n") if last else [])]
    else:
        after = cut(rest_at, end)
        rest, omitted = fold(after.split(b"\n") if after else [], index, len(before) + 1, first)
    offset, input_count = int(head["offset"]), int(head.get("inputCount", 0))
    events = [*before, window_event(first, cursor, total, input_count, offset, omitted),
              MESSAGES_HEAD + msgs + MESSAGES_TAIL, *rest]
    return ServedSnapshot(offset, tuple(events), input_count, record=final.seq)


def snapshot_cursor(position: int, message_id: str, record: int) -> str:
    """The cursor of the page whose oldest message is at ``position`` of the snapshot whose last
    part is at stream sequence ``record``: a page is read from the snapshot its cursor came
    from (a later one may hold a tool result inserted before that position)."""
    return cursor_of(position, f"{record}:{message_id}")


def parse_snapshot_cursor(before: str | None) -> tuple[int, str, int] | None:
    """``(position, message id, record)`` of a :func:`snapshot_cursor`, ``None`` for none.

    Raises:
        InvalidArgument: not a cursor this API made (field ``before``).
    """
    parsed = check_cursor(before)
    if parsed is None:
        return None
    record, sep, mid = parsed[1].partition(":")
    if not sep or not record.isdigit():
        raise InvalidArgument("before", "is not a cursor this API returned")
    return parsed[0], mid, int(record)


def served_of(body: bytes, record: int = 0) -> ServedSnapshot:
    """A snapshot record's body as readers get it (baton.log.snapshot.encode's format): its
    head parsed, its event lines as they are. A head without message ends (a snapshot written
    before they were recorded) gets them from one parse of its ``MESSAGES_SNAPSHOT`` line.

    Raises:
        ValueError: not a snapshot body of a known version.
    """
    head, lines = head_and_lines(body)
    at = next((i for i, ln in enumerate(lines) if ln.startswith(MESSAGES_HEAD) and ln.endswith(MESSAGES_TAIL)), -1)
    ends = head.get("msgEnds")
    if at >= 0 and not (isinstance(ends, list) and (not ends or ends[-1] + len(MESSAGES_TAIL) == len(lines[at]))):
        again, found = messages_line(list(json.loads(lines[at]).get("messages") or []))
        ends = found if again == lines[at] else None  # another writer's bytes: served whole only
    return ServedSnapshot(int(head["offset"]), tuple(lines), int(head.get("inputCount", 0)), at,
                          tuple(ends) if at >= 0 and ends is not None else None, record, index_of(head))


async def log_compacted(delivery_log: Any, run_id: str) -> bool:
    """Whether the run's log was compacted to its final snapshot (one read of its first record).

    Raises:
        LogUnavailable: JetStream did not answer.
    """
    try:
        first = await first_on_subject(delivery_log.nc, delivery_log.cfg.stream, delivery_log.cfg.subject(run_id))
    except (nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError) as exc:
        raise LogUnavailable(run_id, f"reading the log failed: {type(exc).__name__}") from exc
    return is_compacted(first)
