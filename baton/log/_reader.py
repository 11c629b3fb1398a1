"""Reading a run's delivery log from an offset: catch up, then tail until the close record."""
from __future__ import annotations

import asyncio
import json
import re
from typing import Any, AsyncGenerator, AsyncIterator, Awaitable, Callable, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS

from baton.aio import drop_task
from baton.errors import InvalidOffset, LogUnavailable, OffsetExpired
from baton.log import _headers as H
from baton.log._api import RawRecord, first_on_subject, last_on_subject
from baton.log._compact import begins_compacted, is_compacted
from baton.log._config import LogConfig
from baton.log._consumer import OrderedConsumer
from baton.log._snapshots import latest_final

_DECIMAL = re.compile(r"[0-9]{1,20}")

Item = tuple[str, dict[str, Any]]


def parse_offset(after: str) -> str | int:
    """Validate a client offset: ``-1``, ``now``, or a decimal stream sequence.

    Returns:
        ``"-1"``, ``"now"`` or the sequence as an int.

    Raises:
        InvalidOffset: anything else.
    """
    if after in ("-1", "now"):
        return after
    if isinstance(after, str) and _DECIMAL.fullmatch(after):
        return int(after)
    raise InvalidOffset(str(after))


A = TypeVar("A")
B = TypeVar("B")


async def _both(a: Awaitable[A], b: Awaitable[B]) -> tuple[A, B]:
    """Await two reads side by side; both end before this returns, and the first failure is
    raised (neither is left running, nor its error unread)."""
    ra, rb = await asyncio.gather(a, b, return_exceptions=True)
    for r in (ra, rb):
        if isinstance(r, BaseException):
            raise r
    return ra, rb  # type: ignore[return-value]


def _is_origin(headers: dict[str, str] | None) -> bool:
    """Whether a record is its run's first: published on an empty subject (expected head 0)."""
    return (headers or {}).get(H.EXPECTED_LAST_SUBJECT_SEQ) == "0"


class LogReader(AsyncIterator[Item]):
    """Async iterator of ``(offset, chunk)`` strictly after an offset.

    Yields chunk records only (fence and close records are skipped); ends after the
    ``close`` record when ``stop_at_close`` (then :attr:`close_record` and
    :attr:`close_status` tell how the run ended). Use ``async with`` (or call
    :meth:`aclose`) so the consumer is removed at once when you stop early.

    :meth:`open` checks the offset eagerly (``OffsetExpired``) so an HTTP edge can answer
    with a status before it starts streaming; iteration calls it when needed.
    """

    def __init__(
        self,
        nc: NATS,
        cfg: LogConfig,
        run_id: str,
        after: str,
        *,
        stop_at_close: bool = True,
        idle_heartbeat: float = 1.0,
        pending_msgs: int = 256,
    ) -> None:
        self.run_id = run_id
        self.after = after
        self._parsed = parse_offset(after)
        self._nc = nc
        self._cfg = cfg
        self._subject = cfg.subject(run_id)
        self._stop_at_close = stop_at_close
        self._hb = idle_heartbeat
        self._pending_msgs = pending_msgs
        self._start_seq: int | None = None
        self._ended = False
        self._gen: AsyncGenerator[tuple[str, Any], None] | None = None
        self.close_record: H.StoredRecord | None = None
        self.consumer_resets = 0
        self._last_offset: str | None = None
        # Stop after the record at this stream sequence, whatever its kind (a catch-up read
        # up to a known tail that may be a fence record); ``None``: tail on.
        self.until: int | None = None
        #: The log's last record as :meth:`open` found it (``None``: an empty log, or not
        #: opened yet).
        self.tail: H.StoredRecord | None = None
        #: Yield each chunk as its stored JSON bytes (what the writer encoded: compact,
        #: UTF-8, no ASCII escaping), not decoded; set before the first iteration.
        self.raw = False
        #: Called with the stream sequence of every record read that is not yielded (a fence
        #: or the close), so a reader that serves positions (the gateway's shared tail) knows
        #: how far the log was read, whatever the last record's kind.
        self.on_marker: Callable[[int], None] | None = None
        # The consumer :meth:`prepare` began creating (its first pull sent once made); the
        # first iteration takes it, :meth:`aclose` removes it when none did.
        self._preparing: asyncio.Task[OrderedConsumer | None] | None = None

    @property
    def close_status(self) -> str | None:
        """The close record's status once the read ended on it, else ``None``."""
        return self.close_record.status if self.close_record else None

    @property
    def last_offset(self) -> str | None:
        """Offset of the last chunk yielded (``None`` before the first)."""
        return self._last_offset

    async def open(self) -> None:
        """Resolve the start position; idempotent.

        Raises:
            OffsetExpired: the offset is older than the run's earliest stored record.
            LogUnavailable: JetStream did not answer.
        """
        if self._start_seq is not None or self._ended:
            return
        stream = self._cfg.stream
        tail: RawRecord | None = None
        try:
            n = self._parsed if isinstance(self._parsed, int) else 0
            if n < 1:
                tail = await last_on_subject(self._nc, stream, self._subject)
                start = tail.seq + 1 if tail is not None and self._parsed == "now" else 1
            else:
                start = n + 1
                # The tail and the run's first record, side by side: neither depends on the
                # other, and a resume waits for one round trip, not two.
                tail, first = await _both(last_on_subject(self._nc, stream, self._subject),
                                          first_on_subject(self._nc, stream, self._subject))
                # Offsets are stream-wide sequences: an offset before the run's first
                # record is a gap only when records of *this run* are gone. The run's
                # first record is the only one appended on an empty subject (expected
                # head 0); while it is kept, nothing of the run was lost and the offset
                # reads from the start. An empty log lost nothing either (the run has
                # not written yet); a run whose whole log expired is the gateway's to
                # tell by its terminal record (docs/design.md §6).
                if first is not None and first.seq > n:
                    if not _is_origin(first.headers) and not await self._covered(first, n):
                        raise OffsetExpired(self.run_id, self.after, str(first.seq))
                    start = first.seq
        except (nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError) as exc:
            raise LogUnavailable(self.run_id, f"reading the log failed: {type(exc).__name__}") from exc
        self.tail = H.parse_record(tail.seq, tail.headers) if tail is not None else None
        if self._stop_at_close and tail is not None and tail.headers.get(H.KIND) == "close" and tail.seq < start:
            # The log closed at or before the offset: nothing more will ever come.
            self.close_record = H.parse_record(tail.seq, tail.headers)
            self._ended = True
            return
        self._start_seq = start

    def prepare(self) -> None:
        """Begin creating the read's consumer (and sending its first pull) in the background,
        after :meth:`open` and before the first iteration, which then takes it: a caller with
        other work before it iterates (a lookup, an HTTP response head) overlaps it with that.

        Reads nothing it would not read anyway: the consumer starts where :meth:`open` said.
        Idempotent; nothing for a read that ended at its open. :meth:`aclose` removes the
        consumer when no iteration took it.
        """
        if self._preparing is None and self._start_seq is not None and not self._ended and self._gen is None:
            self._preparing = asyncio.get_running_loop().create_task(self._prepare(self._start_seq),
                                                                     name=f"log-read-prepare:{self.run_id}")

    def _consumer(self, start_seq: int) -> OrderedConsumer:
        return OrderedConsumer(self._nc, self._cfg.stream, self._subject, start_seq,
                               idle_heartbeat=self._hb, batch=self._pending_msgs)

    async def _prepare(self, start_seq: int) -> OrderedConsumer | None:
        consumer = self._consumer(start_seq)
        try:
            await consumer.__aenter__()
        except BaseException:
            await consumer.stop()
            raise
        return consumer

    async def _take_prepared(self) -> OrderedConsumer | None:
        """The consumer :meth:`prepare` made (``None``: none was begun)."""
        task, self._preparing = self._preparing, None
        return await task if task is not None else None

    async def _drop_prepared(self) -> None:
        task, self._preparing = self._preparing, None
        if task is not None:
            await drop_task(task, lambda consumer: consumer.stop())

    async def _covered(self, first: Any, n: int) -> bool:
        """Whether nothing of the run after offset ``n`` is gone although its first stored
        record comes later: its log was compacted (baton/log/_compact.py) to a final snapshot
        covering up to at least ``n``, and only its close is left."""
        if not is_compacted(first):
            return False
        final = await latest_final(self._nc, self._cfg, self.run_id)
        return final is not None and int(final.headers.get(H.SNAP_OFFSET, "0") or 0) <= n

    async def _iterate(self) -> AsyncGenerator[tuple[str, Any], None]:
        await self.open()
        if self._ended:
            return
        assert self._start_seq is not None
        if self.until is not None and self.until < self._start_seq:
            await self._drop_prepared()
            return
        consumer = await self._take_prepared() or self._consumer(self._start_seq)
        # The stream sequence of the last record this read saw: a later record whose
        # predecessor on the subject (its expected-last-sequence header) is newer than that
        # means records between were removed under this read (a compaction purged them): a
        # gap, never a silent jump to the end. Where a read starts is open()'s to check.
        seen: int | None = None
        async with consumer:
            try:
                raw, until, on_marker = self.raw, self.until, self.on_marker
                while True:
                    seq, _, headers, data = await consumer.next_raw()
                    prev = headers.get(H.EXPECTED_LAST_SUBJECT_SEQ)
                    if seen is not None and prev is not None and prev.isdigit() and int(prev) > seen:
                        raise OffsetExpired(self.run_id, self._last_offset or self.after, str(seq))
                    if seen is None and self._parsed == "-1" and begins_compacted(headers):
                        # A read from the start that meets a compacted log (its first record
                        # a close not published on an empty subject): the purge came between
                        # the caller's "is it compacted" check and this read. A gap, never
                        # a silent jump to the close. (A log trimmed by a per-subject limit
                        # still reads from what is kept.)
                        raise OffsetExpired(self.run_id, self.after, str(seq))
                    seen = seq
                    kind = headers.get(H.KIND, "chunk")
                    if kind == "chunk":
                        offset = str(seq)
                        self._last_offset = offset
                        yield offset, (data if raw else json.loads(data))
                    else:
                        if kind == "close":
                            self.close_record = H.parse_record(seq, headers)
                        if on_marker is not None:
                            on_marker(seq)
                        if kind == "close" and self._stop_at_close:
                            return
                    if until is not None and seq >= until:
                        return
            finally:
                self.consumer_resets = consumer.resets

    def __aiter__(self) -> "LogReader":
        return self

    async def __anext__(self) -> Item:
        if self._gen is None:
            self._gen = self._iterate()
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        """Stop reading and remove the consumer."""
        try:
            if self._gen is not None:
                await self._gen.aclose()
        finally:
            await self._drop_prepared()  # prepared, never iterated

    async def __aenter__(self) -> "LogReader":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
