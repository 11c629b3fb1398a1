"""The claim-scoped writer of one run's delivery log (docs/design.md §4.1).

Every record is published with ``Nats-Expected-Last-Subject-Sequence`` set to the head
the writer knows (the sequence of its previous record, or the head it read before its
fence), so JetStream itself refuses a record from a writer whose successor has fenced the
log: there is no window in which a paused writer can land anything after the fence.

What a tail record means for this writer is decided in one place, :func:`baton.log.fence.judge`;
this module does the I/O around it.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Iterable, Mapping, Protocol

import nats.errors
from nats.aio.client import Client as NATS
from nats.js.client import JetStreamContext

from baton.errors import AppendConflict, LogAlreadyClosed, LogStorageFull, LogUnavailable, RunClaimLost
from baton.fingerprint import fingerprint
from baton.log import _headers as H
from baton.log._api import (
    ERR_WRONG_LAST_SEQUENCE,
    ERR_WRONG_LAST_SEQUENCE_IN_FLIGHT,
    STORAGE_FULL_CODES,
    RawRecord,
    last_on_subject,
)
from baton.log._config import LogConfig
from baton.log._headers import StoredRecord
from baton.log._replies import Replies
from baton.log import _snapshots
from baton.log.snapshot import Snapshot, SnapshotState
from baton.log.fence import Op, Verdict, describe, judge
from baton.runs import CLOSE_STATUSES

log = logging.getLogger(__name__)

# Longest error text a close record carries; headers are not a place for stack traces.
_MAX_ERROR_CHARS = 2000
#: Longest pause between two tries of one publish (s): a new stream leader is found
#: within this of its election.
_MAX_PAUSE = 0.2
#: A chunk's stored JSON, built once: ``json.dumps`` with options builds an encoder per call.
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
#: Headers a publish adds to its record's own, so not part of what the record is.
_PUBLISH_HEADERS = (H.MSG_ID, H.EXPECTED_LAST_SUBJECT_SEQ)


class _CompareFailed(Exception):
    """The log head was not what the writer expected (JetStream error 10071)."""

    def __init__(self, tail: RawRecord | None) -> None:
        self.tail = tail


def _header_safe(text: str) -> str:
    # A CR/LF in a header value would end the header block (header injection).
    return " ".join(text.splitlines())[:_MAX_ERROR_CHARS]


def _parsed(tail: RawRecord | None) -> StoredRecord | None:
    return None if tail is None else H.parse_record(tail.seq, tail.headers)


class WriteObserver(Protocol):
    """Told what a writer's records met (a host's metrics, sandbox_host/metrics.py).
    Called on the writer's task; must not block."""

    def appended(self, seconds: float) -> None:
        """A record was stored ``seconds`` after its first publish (retries included)."""

    def fenced(self, run_id: str) -> None:
        """This writer's fence record was stored."""

    def latched(self, run_id: str) -> None:
        """A write was refused: a higher epoch fenced the log."""

    def refused_storage(self, run_id: str) -> None:
        """A write was refused: JetStream cannot store."""


class LogWriter:
    """Appends one run's records under one claim (run id, epoch).

    Not safe for use by two tasks at once without its own lock, which it has: calls are
    serialised so the compare chain stays exact. One writer per (run, epoch): message ids
    ``<run_id>/<epoch>/<n>`` count this writer's records, and JetStream drops a second
    writer's colliding ids as duplicates within its de-duplication window.

    A publish is retried within a budget of ``max_attempts * publish_timeout`` seconds,
    each try waiting at most ``publish_timeout`` for its acknowledgement and pausing at most
    :data:`_MAX_PAUSE` between tries. The pause is short because the common gap is a stream
    leader election (R3): until a new leader serves, nats-server answers "no responders" at
    once, and the first try after the election should follow it closely (docs/deploy.md).
    Each publish waits for its ack through ``replies`` (the log's one reply subscription,
    which :meth:`DeliveryLog.writer` passes), else through ``nc.request``.

    Attributes:
        run_id: the run.
        epoch: the claim's epoch.
    """

    def __init__(
        self,
        nc: NATS,
        js: JetStreamContext,
        cfg: LogConfig,
        run_id: str,
        epoch: int,
        *,
        publish_timeout: float = 2.0,
        max_attempts: int = 5,
        observer: WriteObserver | None = None,
        replies: Replies | None = None,
    ) -> None:
        if epoch < 1:
            raise ValueError("epoch must be >= 1")
        self.run_id = run_id
        self.epoch = epoch
        self._nc = nc
        # Publishes wait for their ack through the log's shared reply subscription
        # (baton.log._replies), else through nc.request.
        self._request = replies.request if replies is not None else nc.request
        self._js = js
        self._cfg = cfg
        self._subject = cfg.subject(run_id)
        self._timeout = publish_timeout
        self._max_attempts = max_attempts
        self._head: int | None = None
        self._fenced_over: int | None = None
        self._n = 0
        # The record whose publish went unacknowledged: (expected head, payload, headers as
        # published, its number). A retry of the same record at the same
        # head reuses the number, so JetStream's de-duplication and the head check both
        # recognise it if an earlier attempt did land.
        self._unacked: tuple[int, bytes, dict[str, str], int] | None = None
        self._lost: RunClaimLost | None = None
        self._closed = False
        self._lock = asyncio.Lock()
        self._observer = observer
        # Snapshots (baton.log.snapshot): primed from the stored log at the first append or
        # close; ``_snap_seq`` is the last part of the latest stored snapshot (0: none).
        self._snap: SnapshotState | None = None
        self._snap_seq = 0
        self._fence_seq: int | None = None
        self._stored_chunks: list[tuple[int, bytes]] | None = None  # take_stored_chunks'

    # --- state ------------------------------------------------------------------------

    @property
    def head(self) -> int | None:
        """Sequence of this writer's last record (``None`` before :meth:`fence`)."""
        return self._head

    @property
    def fenced_over(self) -> int | None:
        """Sequence of the record this writer's fence was appended right after (``0``: the
        log was empty), ``None`` before :meth:`fence` landed. The fence compared the head
        against it, so it is exactly the last record stored before the fence."""
        return self._fenced_over

    def take_stored_chunks(self, chunks: list[tuple[int, bytes]]) -> None:
        """Hand over the chunks stored before this writer's fence, as its takeover read them
        (:meth:`DeliveryLog.stored_before_fence`): every chunk record up to :attr:`fenced_over`,
        ``(sequence, body)`` in order, none missing. The snapshot prime folds these instead of
        reading them again while only the fence followed them. Ignored before the fence,
        after the prime, and with snapshots off."""
        if self._fenced_over and self._snap is None and self._cfg.snapshot_policy.enabled:
            self._stored_chunks = chunks

    @property
    def latched(self) -> bool:
        """True once the writer saw a higher epoch: it never appends again."""
        return self._lost is not None

    @property
    def closed(self) -> bool:
        """True once this writer's close record landed."""
        return self._closed

    def _check_live(self) -> None:
        if self._lost is not None:
            raise RunClaimLost(self.run_id, self.epoch, self._lost.observed)

    def _latch(self, tail: StoredRecord | None) -> RunClaimLost:
        assert tail is not None  # Verdict.LOST names a record
        if self._observer is not None:
            self._observer.latched(self.run_id)
        self._lost = RunClaimLost(self.run_id, self.epoch, describe(tail))
        return self._lost

    def _already_closed(self, tail: StoredRecord | None) -> LogAlreadyClosed:
        assert tail is not None  # Verdict.CLOSED names a record
        return LogAlreadyClosed(self.run_id, tail.status or "", tail.epoch, tail.offset)

    # --- adapter ----------------------------------------------------------------------

    async def _tail(self) -> RawRecord | None:
        try:
            return await last_on_subject(self._nc, self._cfg.stream, self._subject, timeout=self._timeout)
        except (nats.errors.Error, asyncio.TimeoutError) as exc:
            raise LogUnavailable(self.run_id, f"reading the log head failed: {type(exc).__name__}") from exc

    async def _publish(self, payload: bytes, headers: dict[str, str], expected: int) -> int:
        """Publish one record with compare on ``expected``; return its sequence.

        A timed-out publish is retried with the same message id after checking the head:
        nats-server checks the compare before de-duplication (docs/design.md §4.1), so a retry
        of a publish that did land is refused with 10071, and the head tells us it landed.
        The same holds across calls: when this raised ``LogUnavailable`` and the caller
        publishes the same record at the same head again, it goes out with the same id.

        Raises:
            _CompareFailed: the head is not ``expected`` and is not this record.
            LogStorageFull: JetStream refused for lack of storage (10023/10047), or answered
                reads but acknowledged none of ``max_attempts`` publishes (a full disk).
            LogUnavailable: JetStream did not answer after ``max_attempts`` tries.
        """
        unacked = self._unacked
        if unacked is not None and unacked[0] == expected and unacked[1] == payload and {
            k: v for k, v in unacked[2].items() if k not in _PUBLISH_HEADERS
        } == headers:
            n = unacked[3]
        else:
            self._n += 1
            n = self._n
        msg_id = f"{self.run_id}/{self.epoch}/{n}"
        headers[H.MSG_ID] = msg_id
        headers[H.EXPECTED_LAST_SUBJECT_SEQ] = str(expected)
        # Kept, not copied (the common case never compares): nothing changes ``headers`` after this.
        self._unacked = (expected, payload, headers, n)
        seq = await self._publish_attempts(payload, headers, msg_id, expected)
        self._unacked = None
        return seq

    async def _publish_attempts(self, payload: bytes, headers: dict[str, str], msg_id: str, expected: int) -> int:
        # Plain floats, not a Deadline: this runs once per record and the first try's timeout
        # is the whole ``publish_timeout`` (the budget is ``max_attempts`` of them).
        began = time.monotonic()
        deadline_at = began + self._timeout * self._max_attempts
        attempt = 0
        reads_answered = False
        while True:
            attempt += 1
            undecided = False
            try:
                # A plain request instead of ``js.publish``: same wire exchange, without
                # building a PubAck per record (the append path is CPU-bound in Python).
                timeout = (self._timeout if attempt == 1
                           else max(min(self._timeout, deadline_at - time.monotonic()), 0.05))
                reply = await self._request(self._subject, payload, timeout=timeout, headers=headers)
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError,
                    nats.errors.ConnectionClosedError, asyncio.TimeoutError) as exc:
                err_exc: BaseException = exc
            else:
                resp = json.loads(reply.data)
                err = resp.get("error")
                if err is None:
                    if attempt > 1:  # a leader change or an outage: how long this append waited
                        log.info("append to %s stored after %d tries, %.2fs", self._subject, attempt,
                                 time.monotonic() - began)
                    if self._observer is not None:
                        self._observer.appended(time.monotonic() - began)
                    return int(resp["seq"])
                code = err.get("err_code")
                if code in STORAGE_FULL_CODES:
                    # max_file_store reached: refused before storing, clears by itself
                    # once space is freed (retention, deletes).
                    if self._observer is not None:
                        self._observer.refused_storage(self.run_id)
                    raise LogStorageFull(self.run_id, f"publish refused: {err.get('description', '')} ({code})", code)
                if code not in (ERR_WRONG_LAST_SEQUENCE, ERR_WRONG_LAST_SEQUENCE_IN_FLIGHT):
                    raise LogUnavailable(self.run_id, f"publish refused: {err.get('description', '')}")
                tail = await self._tail()
                if tail is not None and tail.headers.get(H.MSG_ID) == msg_id:
                    return tail.seq  # an earlier attempt of this very record landed
                if code == ERR_WRONG_LAST_SEQUENCE_IN_FLIGHT and (tail.seq if tail else 0) == expected:
                    # Not decided: another record for this subject (an unanswered try of this
                    # one, or a rival's fence) is in flight at the leader. Ask again once it
                    # settled: this record then lands, is known as landed, or meets the rival.
                    err_exc = LogUnavailable(self.run_id, "publish refused while a record was in flight")
                    undecided = True
                else:
                    self._unacked = None  # refused, not unacknowledged: never the same record again
                    raise _CompareFailed(tail)
            if undecided:
                pass  # the head was just read
            elif isinstance(err_exc, nats.errors.NoRespondersError):
                # Nobody took it: the stream has no leader now (an R3 stream electing one
                # answers so at once), so this try stored nothing, and asking for the head
                # would wait out its timeout (JetStream's API does not answer either). Try
                # again after the short pause: the first try after the election lands.
                tail = None
            else:
                # No answer: did an earlier attempt land? Then it is not sent again.
                try:
                    tail = await self._tail()
                    reads_answered = True
                except LogUnavailable:
                    tail = None
                    reads_answered = False
            if tail is not None and tail.headers.get(H.MSG_ID) == msg_id:
                return tail.seq
            pause = min(0.05 * 2**attempt, _MAX_PAUSE)
            if deadline_at - time.monotonic() <= pause:
                if reads_answered and not undecided:
                    # Reads answer, stores do not: what nats-server does after a write hit
                    # ENOSPC (the stream stores again only after a restart with free space),
                    # or a stream leader election that outlasts the budget.
                    if self._observer is not None:
                        self._observer.refused_storage(self.run_id)
                    raise LogStorageFull(
                        self.run_id, f"JetStream answers reads but acknowledged none of {attempt} publishes"
                    ) from err_exc
                raise LogUnavailable(self.run_id, f"publish not acknowledged after {attempt} attempts") from err_exc
            await asyncio.sleep(pause)

    # --- operations -------------------------------------------------------------------

    async def fence(self) -> int:
        """Append this claim's ``fence`` record with compare-and-set on the head it read.

        Returns:
            The fence record's sequence (offset).

        Raises:
            RunClaimLost: the log holds a record of a higher epoch (the writer latches).
            LogAlreadyClosed: the log ends with a ``close`` of this or a lower epoch.
            LogUnavailable: JetStream did not answer.
        """
        async with self._lock:
            self._check_live()
            while True:
                tail = _parsed(await self._tail())
                verdict = judge(tail, self.epoch, Op.FENCE)
                if verdict is Verdict.LOST:
                    raise self._latch(tail)
                if verdict is Verdict.CLOSED:
                    raise self._already_closed(tail)
                headers = {H.KIND: "fence", H.EPOCH: str(self.epoch)}
                over = tail.offset if tail else 0
                try:
                    self._head = await self._publish(b"", headers, over)
                    self._fenced_over = over
                    self._fence_seq = self._head
                    if self._observer is not None:
                        self._observer.fenced(self.run_id)
                    return self._head
                except _CompareFailed:
                    continue  # the head moved between read and publish: read it again

    async def append(self, chunks: Iterable[Mapping[str, Any]], origin: H.Origin = "journal") -> list[str]:
        """Append chunks, each with compare-and-set on the previous record.

        Args:
            chunks: AG-UI chunks (camelCase dicts), stored in this order.
            origin: ``journal`` (reproducible by replay) or ``host``.

        Returns:
            One offset (decimal stream sequence) per chunk.

        Raises:
            RunClaimLost: a higher epoch's record is at the head; the writer latches and
                nothing of this batch after the refused chunk landed.
            AppendConflict: the head moved, but not to a higher epoch; ``landed`` names the
                offsets of the batch's prefix that was stored.
            LogUnavailable: JetStream did not answer; ``landed`` names the offsets of the
                batch's prefix that was stored. Appending the rest at once is safe: the
                unacknowledged record goes out again with its message id.
            LogStorageFull: (a ``LogUnavailable``) JetStream cannot store; the same holds.
            RuntimeError: when called before :meth:`fence` or after :meth:`close`.
        """
        if origin not in H.ORIGINS:
            raise ValueError(f"origin must be journal or host, got {origin!r}")
        async with self._lock:
            self._check_live()
            if self._head is None:
                raise RuntimeError("append before fence")
            if self._closed:
                raise RuntimeError("append after close")
            # A successor's first append learns the snapshot state of what was stored before
            # it (reads of the stored log) only after its chunks landed: a reader's first
            # chunk after a takeover does not wait for those reads.
            if self._snap is None and self._cfg.snapshot_policy.enabled and self._fenced_over == 0:
                await self._prime_snapshots()  # this writer began the log: no reads
            priming = self._snap is None and self._cfg.snapshot_policy.enabled
            before = self._head
            landed: list[tuple[int, Mapping[str, Any], int]] = []
            offsets: list[str] = []
            epoch = str(self.epoch)
            for chunk in chunks:
                payload = _ENCODE(chunk).encode("utf-8")
                headers = {H.KIND: "chunk", H.EPOCH: epoch, H.ORIGIN: origin, H.FINGERPRINT: fingerprint(chunk)}
                expected = self._head
                try:
                    self._head = await self._publish(payload, headers, expected)
                except LogUnavailable as exc:
                    exc.landed = tuple(offsets)  # a retry must not send these again
                    raise
                except _CompareFailed as conflict:
                    tail = _parsed(conflict.tail)
                    if judge(tail, self.epoch, Op.APPEND) is Verdict.LOST:
                        raise self._latch(tail) from None
                    raise AppendConflict(
                        self.run_id, expected, tail.offset if tail else 0, landed=tuple(offsets)
                    ) from None
                offsets.append(str(self._head))
                if priming:
                    landed.append((self._head, chunk, len(payload)))
                elif self._snap is not None and self._snap.feed(self._head, chunk, len(payload)):
                    await self._store_snapshot(self._snap.take())
            if priming:
                await self._prime_then_feed(before, landed)
            return offsets

    async def resync(self) -> int:
        """Adopt the current log head after an :class:`AppendConflict`.

        Returns:
            The head sequence now used as the compare base.

        Raises:
            RunClaimLost: the head is a record of a higher epoch (the writer latches).
            LogAlreadyClosed: the head is a ``close`` record.
        """
        async with self._lock:
            self._check_live()
            tail = _parsed(await self._tail())
            if tail is None:
                raise RuntimeError("resync on an empty log: fence first")
            # Adopting the head is judged as fencing on it would be.
            verdict = judge(tail, self.epoch, Op.FENCE)
            if verdict is Verdict.LOST:
                raise self._latch(tail)
            if verdict is Verdict.CLOSED:
                raise self._already_closed(tail)
            self._head = tail.offset
            self._snap = None  # records this writer did not feed may be stored: prime again
            return tail.offset

    async def close(
        self,
        status: H.CloseStatus,
        error: str | Mapping[str, Any] | None = None,
        *,
        error_code: str | None = None,
        finished_at: float | None = None,
    ) -> bool:
        """Append the ``close`` record, fenced by the log head only (docs/design.md §4.1).

        A writer whose claim lapsed but has no successor still closes, so tailers never
        wait forever; a writer never closes over a successor's fence or close.

        Args:
            status: ``completed`` | ``failed`` | ``aborted`` | ``interrupted``.
            error: the error message, or a mapping with ``message`` and ``code``.
            error_code: the error code when ``error`` is a plain message.
            finished_at: when the run finished (Unix seconds), the ``finished_at`` its record
                gets, so a reader of the closed log can tell it before the record does.

        Returns:
            True when the close record landed (or this writer had already closed); False
            when a higher epoch's record is at the head (the writer latches).

        Raises:
            LogUnavailable: JetStream did not answer.
        """
        if status not in CLOSE_STATUSES:
            raise ValueError(f"close status must be one of {sorted(CLOSE_STATUSES)}, got {status!r}")
        message: str | None
        if isinstance(error, Mapping):
            message = str(error.get("message") or "") or None
            error_code = error_code or (str(error.get("code")) if error.get("code") else None)
        else:
            message = error
        async with self._lock:
            if self._lost is not None:
                return False
            if self._closed:
                return True
            headers = {H.KIND: "close", H.EPOCH: str(self.epoch), H.STATUS: status}
            if message:
                headers[H.ERROR] = _header_safe(message)
            if error_code:
                headers[H.ERROR_CODE] = _header_safe(error_code)
            if finished_at is not None:
                headers[H.FINISHED_AT] = repr(float(finished_at))
            if self._head is not None and self._cfg.snapshot_policy.enabled:
                await self._final_snapshot()
            expected = self._head
            while True:
                if expected is None:
                    tail = _parsed(await self._tail())
                    verdict = judge(tail, self.epoch, Op.CLOSE)
                    if verdict is Verdict.LOST:
                        self._latch(tail)
                        return False
                    if verdict is Verdict.CLOSED:
                        # Already closed by this claim (an earlier attempt) or a
                        # predecessor: the log is final, nothing to add.
                        self._closed = True
                        return True
                    expected = tail.offset if tail else 0
                try:
                    self._head = await self._publish(b"", dict(headers), expected)
                    self._closed = True
                    return True
                except _CompareFailed:
                    expected = None  # re-read the head and decide again

    # --- snapshots (caller holds the lock) ----------------------------------------------

    async def _prime_then_feed(self, before: int, landed: list[tuple[int, Mapping[str, Any], int]]) -> None:
        """Prime the snapshot state over the log up to ``before`` (the head before a batch),
        then feed it the batch's ``landed`` chunks ``(sequence, chunk, bytes)``.

        A prime that fails leaves the state unprimed: the next append primes again, over a
        head that includes this batch (read back from the log), so no chunk is fed twice or
        skipped. The batch stays appended either way.
        """
        try:
            await self._prime_snapshots(over=before)
        except LogUnavailable as exc:
            log.warning("run %s: snapshot state not primed (%s); the next append tries again", self.run_id, exc)
            self._snap = None
            return
        for seq, chunk, size in landed:
            if self._snap is not None and self._snap.feed(seq, chunk, size):
                await self._store_snapshot(self._snap.take())

    async def _prime_snapshots(self, over: int | None = None) -> None:
        """Learn the snapshot state of the stored log: the latest stored snapshot, then the
        chunks after it up to ``over`` (default: the head, this writer's fence or what a
        resync adopted). A due snapshot its predecessor did not store (it stopped first) is
        stored now: the same bytes it would have stored.

        Raises:
            LogUnavailable: JetStream did not answer.
        """
        policy = self._cfg.snapshot_policy
        if self._fenced_over == 0:
            # This writer's fence began the log: nothing stored before it, no I/O (the common
            # start of a run).
            self._snap = SnapshotState(policy)
            return
        found = await _snapshots.latest(self._nc, self._cfg, self.run_id, timeout=self._timeout)
        state = SnapshotState(policy) if found is None else SnapshotState.restore(policy, found[0])
        self._snap_seq = 0 if found is None else found[1]
        due: Snapshot | None = None
        over = (self._head or 0) if over is None else over
        stored, self._stored_chunks = self._stored_chunks, None
        if over > state.offset:
            if stored is not None and over == self._fence_seq:  # the fence's compare: none between
                between = [(seq, body) for seq, body in stored if seq > state.offset]
            else:
                between = await _snapshots.chunks_between(self._nc, self._cfg, self.run_id, state.offset, over,
                                                          timeout=self._timeout)
            for seq, body in between:
                if state.feed(seq, json.loads(body), len(body)):
                    due = state.take()
        self._snap = state
        if due is not None:
            await self._store_snapshot(due)

    async def _final_snapshot(self) -> None:
        """Before the close record: a snapshot of every chunk, when any came after the last."""
        try:
            if self._snap is None:
                await self._prime_snapshots()
        except LogUnavailable as exc:
            log.warning("no final snapshot for run %s: %s", self.run_id, exc)
            return
        if self._snap is not None and self._snap.pending:
            await self._store_snapshot(self._snap.take())

    async def _store_snapshot(self, snap: Snapshot) -> None:
        """Store a due snapshot, fenced on the log head. Never fails the write that made it
        due: a snapshot not stored leaves readers the previous one (the rule's next due point
        is the same either way, so a successor still writes the same bytes)."""
        assert self._head is not None
        try:
            self._snap_seq = await _snapshots.store(
                self._nc, self._cfg, self.run_id, self.epoch, snap, head=self._head, prev=self._snap_seq,
                part_bytes=self._cfg.snapshot_part_bytes, timeout=self._timeout)
        except _snapshots.SnapshotFenced:
            try:
                tail = _parsed(await self._tail())
            except LogUnavailable:
                return
            if judge(tail, self.epoch, Op.APPEND) is Verdict.LOST:
                self._latch(tail)  # the next write raises RunClaimLost
        except LogUnavailable as exc:
            log.warning("snapshot of run %s at %d not stored: %s", self.run_id, snap.offset, exc)
