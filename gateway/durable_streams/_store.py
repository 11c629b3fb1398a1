"""Durable Streams kept in JetStream: one subject per stream in the ``BATON_DS`` stream.

The adapter between the protocol and NATS. Each stream is the fold (``_model.apply``) of
its subject's records; a gateway caches the fold of every stream it serves and publishes
each write with ``Nats-Expected-Last-Subject-Sequence`` = the last record it folded, so a
write from a stale view (another gateway wrote since) is refused by JetStream, the view is
reloaded and the request re-decided: writes to one stream are linearised by JetStream
itself, whichever gateway takes them. Every gateway also listens (core NATS) on the
streams' subjects for other gateways' writes. Such a write names the sequence it follows
(its ``Nats-Expected-Last-Subject-Sequence``): when that is the view's last record or
later, the view lacks a record, so it is marked behind and its readers woken; its next use
catches it up from its last sequence (``_catchup.py``) instead of folding the whole stream
again. Deleting a stream writes a ``delete`` record and purges the subject down to it.

It runs over 600 lines: the cache, the per-path locks and the fold, write and read paths share one
state; what stands apart is in ``_catchup.py``, ``_folds.py``, ``_publish.py`` and ``_quota.py``.

This is separate from the runs' delivery log (``BATON_RUNS``): a client of this protocol can
never write a run's log (see ``_runs.py``).
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import hashlib
import logging
import time
import uuid
import zlib
from dataclasses import dataclass
from typing import Awaitable, Callable, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import api

from baton.log._api import (
    ERR_STREAM_NAME_IN_USE,
    ERR_WRONG_LAST_SEQUENCE,
    ERR_WRONG_LAST_SEQUENCE_IN_FLIGHT,
    last_on_subject,
)
from baton.log._consumer import OrderedConsumer
from baton.log._log import PROVISION_PATIENCE
from baton.retry import Deadline, retry
from gateway.durable_streams import _model as M
from gateway.durable_streams import _protocol as P
from gateway.durable_streams._folds import UNFENCED, FoldRaces
from gateway.durable_streams._model import Message, StreamState, Verdict
from gateway.durable_streams._catchup import (ACK_WAIT, CatchUps, Heard, ack_seq, ack_subject, expected_last,
                                              next_record)
from gateway.durable_streams._publish import Publisher
from gateway.durable_streams._quota import Ledger, QuotaLimits, tenant_of

log = logging.getLogger("gateway.durable_streams")

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class StoreConfig:
    """Where and how streams are kept.

    Attributes:
        stream: the JetStream stream's name.
        subject_prefix: subjects are ``<prefix>.<sha256 of the path>``.
        replicas: JetStream replicas of the stream.
        max_bytes: the stream's byte limit (-1: none); appends past it are refused, not old
            data dropped (discard ``new``): a stream never silently loses its beginning.
        cached_streams: most streams a gateway keeps folded in memory; the least recently
            used beyond it are dropped (and reloaded from JetStream when next read).
        usage_bucket: the KV bucket counting each tenant's streams and bytes (``_quota.py``).
        quota: the per-tenant limits.
        ack_wait: seconds a view's catch-up waits for another gateway's ack it will hear
            before it asks JetStream for the record (``_catchup.py``).
    """

    stream: str = "BATON_DS"
    subject_prefix: str = "baton.ds"
    replicas: int = 1
    max_bytes: int = -1
    cached_streams: int = 10_000
    usage_bucket: str = "baton-ds-usage"
    quota: QuotaLimits = QuotaLimits()
    ack_wait: float = ACK_WAIT


class Conflict(Exception):
    """JetStream refused a write because the stream changed under us: reload and retry."""


class StreamStore:
    """Durable Streams on JetStream, with one cached view per stream this gateway serves.

    Args:
        nc: a connected NATS client (the gateway gives the store its own, with ``no_echo``).
        cfg: the store's configuration.
        clock: wall-clock seconds (injected for expiry tests).
        close: awaited by :meth:`stop` (closes a connection the store was given to own).
    """

    def __init__(self, nc: NATS, cfg: StoreConfig | None = None, clock: Callable[[], float] = time.time,
                 close: Callable[[], Awaitable[None]] | None = None) -> None:
        self._nc = nc
        self._close = close
        self.cfg = cfg or StoreConfig()
        self._js = nc.jetstream()
        self._gw = uuid.uuid4().hex
        # Every gateway hears the others' acks (_catchup.py), under one prefix per stream.
        self._pub = Publisher(nc, shared=f"_DSACK.{self.cfg.stream}", own=self._gw, on_other=self._on_ack)
        self._clock = clock
        self._cache: collections.OrderedDict[str, StreamState] = collections.OrderedDict()
        self._key_to_path: dict[str, str] = {}
        self._races = FoldRaces()  # folds that another gateway's write raced
        self._heard = Heard()  # other gateways' records and acks heard, until matched
        self._catch_ups = CatchUps(nc, self.cfg.stream, self._heard, self.cfg.ack_wait)  # of views behind other gateways' writes
        self._locks: dict[str, asyncio.Lock] = {}
        self._lock_users: dict[str, int] = {}
        self._latest: dict[str, _LeaderReads] = {}
        self._sub: Subscription | None = None
        self._ledger = Ledger(self._js, self.cfg.usage_bucket, self.cfg.replicas, self.cfg.quota)

    async def start(self, patience: float = PROVISION_PATIENCE) -> None:
        """Create (or update) the JetStream stream and the usage bucket, and listen for other
        gateways' writes.

        Args:
            patience: seconds the stream and bucket are asked for again while JetStream does
                not answer (a cluster electing its leaders, a loaded machine), as the
                delivery log's provisioning waits (``provision_with_patience``).

        Raises:
            nats.errors.Error, nats.js.errors.Error: JetStream refused, or did not answer
                within ``patience``.
        """

        def note(exc: BaseException) -> None:
            log.warning("provisioning the Durable Streams stream failed (%r); trying again", exc)

        await retry(self._provision, deadline=Deadline.after(patience), max_pause=2.0, on_retry=note,
                    retry_on=(nats.errors.TimeoutError, nats.errors.NoRespondersError,
                              nats.js.errors.ServiceUnavailableError, nats.js.errors.ServerError))
        await self._pub.start()
        self._sub = await self._nc.subscribe(f"{self.cfg.subject_prefix}.*", cb=self._on_record)

    async def _provision(self) -> None:
        """The stream (created, or updated to the configuration) and the usage bucket; idempotent."""
        cfg = api.StreamConfig(
            name=self.cfg.stream,
            subjects=[f"{self.cfg.subject_prefix}.*"],
            storage=api.StorageType.FILE,
            retention=api.RetentionPolicy.LIMITS,
            discard=api.DiscardPolicy.NEW,
            max_bytes=self.cfg.max_bytes,
            num_replicas=self.cfg.replicas,
            allow_direct=True,
        )
        try:
            await self._js.add_stream(cfg)
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != ERR_STREAM_NAME_IN_USE:
                raise
            await self._js.update_stream(cfg)
        await self._ledger.start()

    async def stop(self) -> None:
        """Stop listening and wake every waiting reader."""
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
            self._sub = None
        await self._pub.stop()
        await self._ledger.stop()
        self._catch_ups.cancel()
        for st in self._cache.values():
            st.notify()
        self._cache.clear()
        if self._close is not None:
            await self._close()

    async def _on_record(self, msg: Msg) -> None:
        try:
            meta, _ = M.decode_record(msg.data)
        except ValueError:
            return
        if meta.get(M.GATEWAY) == self._gw:
            return
        key = msg.subject.rsplit(".", 1)[-1]
        prev = expected_last(msg)
        self._races.saw(key, prev)
        path = self._key_to_path.get(key)
        st = self._cache.get(path) if path is not None else None
        if path is not None and (st is None or prev is None):
            self._forget(path)
        elif st is not None and prev is not None and prev >= st.js_last:
            # The view lacks a record (this one, or one stored after prev that refused it);
            # below js_last, it has that record folded already.
            st.heard_prev = max(st.heard_prev, prev)
            writer = meta.get(M.GATEWAY)
            if isinstance(writer, str) and path is not None:
                self._heard.record(path, writer, prev, msg.data)  # folded with its ack
                self._fold_heard(path, st)
            st.notify()  # its readers look again, which catches the view up

    async def _on_ack(self, msg: Msg) -> None:
        """JetStream's ack of another gateway's write: fold the record it stored into the
        view whose last sequence is the record's ``prev`` (``_catchup.py``)."""
        named = ack_subject(msg.subject)
        if named is None:
            return
        writer, key, prev, crc = named
        path = self._key_to_path.get(key)
        st = self._cache.get(path) if path is not None else None
        if st is None or path is None or prev < st.js_last:
            return  # not cached, or folded already
        seq = ack_seq(msg.data, self.cfg.stream)
        if seq is None or seq <= prev:
            return  # refused (or no ack of a write fenced on prev: stored after it)
        self._heard.ack(path, writer, prev, crc, seq)
        self._fold_heard(path, st)

    def _fold_heard(self, path: str, st: StreamState) -> None:
        """Fold into ``st``, the cached view of ``path``, each record heard whose ack was
        heard, from its last sequence on, and wake its readers if any was (``st`` dropped if
        one deleted the stream or made it anew: folded again when next used)."""
        folded = False
        while (nxt := self._heard.stored_after(path, st.js_last)) is not None:
            seq, record = nxt
            meta, data = M.decode_record(record)
            if M.apply(st, seq, meta, data) is not st:
                self._forget(path)
                return
            folded = True
        if folded:
            st.notify()

    def reconnected(self) -> None:
        """The store's NATS connection is back after an outage: what other gateways wrote
        meanwhile was never heard here, so every view is dropped (its readers wake and fold
        it anew) and every fold in flight is done again."""
        self._races.lost_sight()
        if self._cache:
            log.info("NATS reconnected: %d Durable Streams views are folded anew", len(self._cache))
        for path in list(self._cache):
            self._forget(path)

    def _forget(self, path: str) -> None:
        """Drop a stream's view (its readers wake and reload it from JetStream)."""
        st = self._cache.pop(path, None)
        self._key_to_path.pop(_key(path), None)
        if st is not None:
            st.notify()

    def _remember(self, path: str, st: StreamState) -> None:
        self._cache[path] = st
        self._cache.move_to_end(path)
        self._key_to_path[_key(path)] = path
        while len(self._cache) > self.cfg.cached_streams:
            self._forget(next(iter(self._cache)))

    def subject(self, path: str) -> str:
        """The subject of a stream path."""
        return f"{self.cfg.subject_prefix}.{_key(path)}"

    # -- loading -------------------------------------------------------------------------

    async def _load(self, path: str) -> tuple[StreamState | None, int]:
        """Fold a stream's subject from JetStream: ``(state or None, last subject sequence)``."""
        subj = self.subject(path)
        last = await last_on_subject(self._nc, self.cfg.stream, subj)
        if last is None:
            return None, 0
        # last_on_subject parses headers only; the body is ours.
        meta, _ = M.decode_record(last.data)
        if meta.get(M.OP) == "delete":
            return None, last.seq
        st: StreamState | None = None
        async with OrderedConsumer(self._nc, self.cfg.stream, subj, 1, batch=1024) as c:
            while True:
                seq, _, _, body = await c.next_raw()
                m, d = M.decode_record(body)
                st = M.apply(st, seq, m, d)
                if seq >= last.seq:
                    break
        return st, last.seq

    async def _view(self, path: str) -> tuple[StreamState | None, int]:
        """The cached view (caught up first when it is behind), else a fresh fold (cached
        when the stream exists).

        A fold never replaces a view cached while it ran (a write's, or another fold's): that
        one hears what comes after it and this fold may lack it (a write of this gateway,
        never heard here); the fold is dropped and the cached view used. A fold raced by
        another gateway's write may lack it (_folds.py): cached behind the write's fence and
        caught up from there; folded again only when that cannot place the write (no fence,
        or no stream found). After a few tries, returned uncached and already "changed", so
        its reader reads again at once.
        """
        key = _key(path)
        st: StreamState | None = None
        last, raced, folds = 0, None, 0
        for _ in range(_VIEW_TURNS):
            cur = self._cache.get(path)
            if cur is not None:
                self._cache.move_to_end(path)
                if cur.heard_prev >= cur.js_last:
                    self._fold_heard(path, cur)  # what was heard may be folded already (_catchup.py)
                    if self._cache.get(path) is not cur:
                        continue  # dropped (deleted, made anew): look again
                if cur.heard_prev < cur.js_last:
                    return cur, cur.js_last
                if not await self._catch_ups.run(path, self.subject(path), cur, self._cache.get):
                    self._forget(path)
                    continue
                if self._cache.get(path) is cur:
                    return cur, cur.js_last
                continue  # replaced or dropped meanwhile: look again
            if folds == _FOLD_TRIES:
                break
            folds += 1
            token = self._races.begin(key)
            try:
                st, last = await self._load(path)
                if st is not None and st.forked_from:
                    await self._ancestors(st)  # (a write heard meanwhile races the fold too)
            finally:
                raced = self._races.end(key, token)
            if self._cache.get(path) is not None:
                continue  # a view was cached while this fold ran: that one
            if raced is None:
                if st is not None:
                    self._remember(path, st)
                return st, last
            if st is not None and raced != UNFENCED:
                st.heard_prev = max(st.heard_prev, raced)
                self._remember(path, st)  # caught up from the fence by the next turn
        cur = self._cache.get(path)
        if cur is not None:
            if cur.heard_prev >= cur.js_last:
                cur.notify_pending()  # behind: its readers look again at once
            return cur, cur.js_last
        if st is not None:
            st.notify_pending()
        return st, last

    async def _ancestors(self, st: StreamState) -> None:
        src = st.forked_from
        while src:
            s, _ = await self._view(src)
            if s is None:
                return
            src = s.forked_from

    async def get(self, path: str, *, touch: bool = False, held: bool = False) -> StreamState | None:
        """A stream's state, or ``None`` when it does not exist or has expired.

        An expired stream is deleted (soft-deleted while forks still read it). A soft-deleted
        stream is returned (``soft_deleted``) so the caller can answer 410. ``held``: the
        caller holds the path's lock (inside a write).
        """
        st, _ = await self._view(path)
        if st is None:
            return None
        if st.forked_from:
            # Its sources' views, which read() takes the inherited records from, may have
            # left the cache since it was folded (least recently used first).
            await self._ancestors(st)
            st, _ = await self._view(path)
            if st is None:
                return None
        now = self._clock()
        if not st.soft_deleted and st.expired(now):
            if held:
                await self._drop(path, st)
            else:
                await self._expire(path)
            st, _ = await self._view(path)
            if st is None or not st.soft_deleted:
                return None
        if touch:
            st.last_access = now
        return st

    async def _expire(self, path: str) -> None:
        async def op() -> None:
            st, _ = await self._view(path)
            if st is None or st.soft_deleted or not st.expired(self._clock()):
                return
            await self._drop(path, st)

        await self._retrying(path, op)

    # -- writing -------------------------------------------------------------------------

    async def _publish(self, path: str, st_last: int, meta: dict[str, object], data: bytes = b"") -> int:
        """Publish one record fenced on ``st_last``; its JetStream sequence once stored."""
        meta[M.GATEWAY] = self._gw
        record = M.encode_record(meta, data)
        try:
            # The reply subject tells the other gateways which record the ack is for.
            ack = await self._pub.publish(self.subject(path), record, st_last,
                                          tag=f"{_key(path)}.{st_last}.{zlib.crc32(record)}")
        except nats.js.errors.APIError as exc:
            if exc.err_code in (ERR_WRONG_LAST_SEQUENCE, ERR_WRONG_LAST_SEQUENCE_IN_FLIGHT):
                await self._behind(path, exc)  # caught up, or read again, and tried again
                raise Conflict(path) from exc
            raise
        self._races.wrote(_key(path), st_last)  # (a fold in flight, a reader's, may lack it)
        return int(ack["seq"])

    async def _behind(self, path: str, refusal: nats.js.errors.APIError) -> None:
        """JetStream refused a write fenced on the view's last sequence: the subject has
        records after it. Its text names the subject's last (``wrong last sequence: <seq>``),
        and the view is caught up to it record by record when next used, from the acks heard
        or by direct gets (``_catchup.py``), not folded again whole (a whole fold of a long
        stream that another gateway writes fast is raced by its writes again and again,
        ``_folds.py``); one that has folded it meanwhile (from an ack heard) is kept as it
        is, once its last record is found stored (else it is no fold of JetStream's records:
        a forged ack's). A refusal without that number (a record still in flight on a
        replicated stream) drops the view."""
        st = self._cache.get(path)
        text = refusal.description or ""
        last = text.rpartition(" ")[2]
        if (st is None or refusal.err_code != ERR_WRONG_LAST_SEQUENCE
                or not text.startswith("wrong last sequence") or not (last.isascii() and last.isdigit())):
            self._forget(path)
        elif int(last) > st.js_last:
            st.heard_prev = max(st.heard_prev, int(last) - 1)
        elif int(last) < st.js_last:
            seen = st.js_last
            try:
                rec = await next_record(self._nc, self.cfg.stream, self.subject(path), seen)
            except (nats.errors.Error, nats.js.errors.Error):
                rec = None  # not known to be stored: read again
            if rec is None or rec[0] != seen:
                self._forget(path)

    async def _write(self, path: str, st: StreamState | None, last: int, meta: dict[str, object],
                     data: bytes = b"") -> StreamState | None:
        """Publish one record fenced on ``last`` and fold it into the cached view."""
        seq = await self._publish(path, last, meta, data)
        if st is not None and st.js_last >= seq:
            return st  # a catch-up folded it from JetStream while the ack was on its way
        new = M.apply(st, seq, meta, data)
        cur = self._cache.get(path)
        if new is None:
            self._cache.pop(path, None)
        elif cur is not None and cur is not st:
            # Folded anew while the publish was out: it may lack this record, which is never
            # heard here (no_echo), or hold records ``new`` lacks: read again when next used.
            self._forget(path)
        elif cur is st:  # (None: a stream made by this write)
            self._remember(path, new)
        # else dropped while the publish was out (the connection came back, and what was
        # written meanwhile was never heard; evicted): folded anew when next used.
        if st is not None:
            st.notify()
        if new is not None and self._cache.get(path) is new:
            self._fold_heard(path, new)  # another gateway's write after this one, heard before this ack
        return new

    async def _unwritten(self, path: str, st: StreamState, refusal: Callable[[StreamState | None], R | None]
                         ) -> tuple[StreamState, R | None]:
        """``(view, refusal(view))``: what a request is answered without a write (returned,
        or a ``ProtocolError`` raised), or ``None`` when it is written, fenced on ``view``.

        A write is fenced, and an answer without one is not: a view that has not heard yet
        of another gateway's write would refuse a producer's retry of that very write as a
        gap. So a refusal is decided once more, on the view caught up with every record
        JetStream had when it was asked (one leader read of the subject's last record, on
        refusals only; the records after the view's come from the acks heard or by direct
        gets, ``_catchup.py``), and that answer stands: a write stored after the read is
        after the request.

        Raises:
            ProtocolError: what ``refusal`` raises on the view caught up (404 when the
                stream is gone).
            nats.errors.Error, nats.js.errors.Error: the leader read failed (the request is
                answered 503, as a write that failed).
        """
        try:
            if refusal(st) is None:
                return st, None
        except P.ProtocolError:
            pass  # decided again below
        await self._mark_behind_jetstream(path, st.js_last)
        view = await self.get(path, touch=True, held=True)
        refused = refusal(view)  # raises 404 when there is no view
        assert view is not None
        return view, refused

    async def _mark_behind_jetstream(self, path: str, seen: int) -> None:
        """Read the subject's last record (one leader read) and mark the cached view of
        ``path``, last seen at ``seen``, behind it, so its next use catches it up to every
        record JetStream had when asked; a view past what JetStream has (not a fold of its
        records: a forged ack's), or of a subject with nothing stored, is dropped (folded
        again when next used).

        Raises:
            nats.errors.Error, nats.js.errors.Error: the leader read failed.
        """
        last = await last_on_subject(self._nc, self.cfg.stream, self.subject(path))
        cur = self._cache.get(path)
        if last is None or seen > last.seq:
            self._forget(path)
        elif cur is not None and cur.js_last < last.seq:
            cur.heard_prev = max(cur.heard_prev, last.seq - 1)  # caught up to it by the get

    async def latest(self, path: str) -> StreamState | None:
        """:meth:`get` (``touch``), on the view caught up with every record JetStream had when
        asked: one leader read. For a read at an offset past the cached view, which another
        gateway's append, not heard here yet, may have answered: that reader must not be
        told a ``Stream-Next-Offset`` before the one it holds, as if the stream ended there.
        Requests for one stream at once share reads: each waits for a read begun after it
        came (at most two reads however many wait), so a flood of them costs no more.

        Raises:
            nats.errors.Error, nats.js.errors.Error: the leader read failed.
        """
        slot = self._latest.get(path)
        if slot is None:
            slot = self._latest[path] = _LeaderReads()
        arrived = slot.started  # reads begun before this request came
        slot.users += 1
        try:
            async with slot.lock:
                if slot.done <= arrived:  # no read begun after this request came is done
                    slot.started += 1
                    mine = slot.started
                    st = self._cache.get(path)
                    await self._mark_behind_jetstream(path, st.js_last if st is not None else 0)
                    slot.done = mine
        finally:
            slot.users -= 1
            if not slot.users:
                del self._latest[path]
        return await self.get(path, touch=True)

    async def _retrying(self, path: str, op: Callable[[], Awaitable[T]]) -> T:
        """Run ``op`` under the path's lock, again after a ``Conflict``: at least
        :data:`CONFLICT_TRIES` times in all, and more while :data:`CONFLICT_BUDGET` seconds
        have not passed since the first (another gateway writing the stream at full speed
        wins sequence after sequence: docs/design.md §6.4 "Consistency").

        One lock per path while it has users (no context-manager generator: this is on
        every append's path).

        Raises:
            Conflict: refused on every try (answered 503).
        """
        lock = self._locks.get(path)
        if lock is None:
            lock = self._locks[path] = asyncio.Lock()
        self._lock_users[path] = self._lock_users.get(path, 0) + 1
        tries, begun = 0, time.monotonic()
        try:
            while True:
                async with lock:
                    try:
                        return await op()
                    except Conflict:
                        tries += 1
                        if tries >= CONFLICT_TRIES and time.monotonic() - begun > CONFLICT_BUDGET:
                            log.warning("a write of %s refused %d times in %.1f s (another gateway writes it): 503",
                                        path, tries, time.monotonic() - begun)
                            raise
        finally:
            users = self._lock_users[path] - 1
            if users:
                self._lock_users[path] = users
            else:
                del self._lock_users[path]
                del self._locks[path]

    async def create(self, path: str, cfg: dict[str, object], initial: bytes) -> tuple[StreamState, bool]:
        """Create a stream, or confirm an identical one exists.

        Args:
            path: the stream path.
            cfg: ``contentType``, ``ttl``, ``expiresAt``, ``expiresTs``, ``closed``,
                ``forkedFrom``, ``forkOffset``, ``forkSubOffset`` as requested.
            initial: the request body (the first append), possibly empty.

        Returns:
            ``(state, created)``; ``created`` is false for an idempotent repeat.

        Raises:
            ProtocolError: 409 for a different configuration or a path still held by forks;
                404/400/409 for a bad fork source, offset or content type; 400 for bad JSON.
        """

        async def op() -> tuple[StreamState, bool]:
            st, last = await self._view(path)
            if st is not None and not st.soft_deleted and st.expired(self._clock()):
                await self._drop(path, st)
                st, last = await self._view(path)
            if st is not None:
                if st.soft_deleted:
                    raise P.ProtocolError(409, "stream was deleted but still has active forks")
                if not M.same_config(st, cfg):
                    raise P.ProtocolError(409, "Stream already exists with different configuration")
                return st, False
            return await self._create_new(path, last, dict(cfg), initial), True

        return await self._retrying(path, op)

    async def _create_new(self, path: str, last: int, cfg: dict[str, object], initial: bytes) -> StreamState:
        src_path = cfg.get("forkedFrom")
        prefix = b""
        if isinstance(src_path, str) and src_path:
            src = await self.get(src_path)
            if src is None:
                raise P.ProtocolError(404, "Source stream not found")
            if src.soft_deleted:
                raise P.ProtocolError(409, "source stream was deleted but still has active forks")
            ct = cfg.get("contentType")
            if isinstance(ct, str) and P.normalize_content_type(ct) != P.normalize_content_type(src.content_type):
                raise P.ProtocolError(409, "Content type mismatch with source stream")
            cfg["contentType"] = src.content_type if not ct else ct
            fork_offset = cfg.get("forkOffset") or src.offset
            assert isinstance(fork_offset, str)
            if fork_offset < P.ZERO_OFFSET or fork_offset > src.offset:
                raise P.ProtocolError(400, "Fork offset beyond source stream length")
            cfg["forkOffset"] = fork_offset
            sub = int(cfg.get("forkSubOffset") or 0)  # type: ignore[call-overload]
            if sub > 0:
                prefix = self._sub_offset_prefix(src, fork_offset, sub)
            if cfg.get("ttl") is None and cfg.get("expiresAt") is None:
                cfg["ttl"], cfg["expiresAt"], cfg["expiresTs"] = src.ttl, src.expires_at, src.expires_ts
        fragment = initial
        if initial and P.is_json(cfg.get("contentType")):  # type: ignore[arg-type]
            fragment = P.process_json_append(initial, initial=True)
        cfg["path"] = path
        cfg["created"] = self._clock()
        closed = bool(cfg.get("closed"))
        cfg["closed"] = False  # closed after the initial data, by a close record
        # Counted before it exists, uncounted only if its create record was not written.
        tenant, spent, written = tenant_of(path), 0, False
        await self._ledger.add_stream(tenant)
        try:
            await self._ledger.spend(tenant, len(prefix) + len(fragment))
            spent = len(prefix) + len(fragment)
            if isinstance(src_path, str) and src_path:
                await self._ref(src_path, +1)
            st = await self._write(path, None, last, {M.OP: "create", M.CONFIG: cfg})
            written = True
        finally:
            if not written:
                self._ledger.refund(tenant, spent)
                await self._ledger.remove_stream(tenant, 0)
        assert st is not None
        for data in (prefix, fragment):
            if data:
                st = await self._write(path, st, st.js_last, {M.OP: "append", M.OFFSET: P.next_offset(st.offset, len(data))}, data)
                assert st is not None
        if closed:
            st = await self._write(path, st, st.js_last, {M.OP: "close"})
            assert st is not None
        return st

    def _sub_offset_prefix(self, src: StreamState, fork_offset: str, sub: int) -> bytes:
        msgs = self.read(src, fork_offset)
        if not msgs:
            raise P.ProtocolError(400, "Invalid fork sub-offset: no data past the fork offset")
        first = msgs[0].data
        if P.is_json(src.content_type):
            values = P.json_values(first)
            if sub > len(values):
                raise P.ProtocolError(400, "Invalid fork sub-offset")
            return "".join(P._dump(v) + "," for v in values[:sub]).encode()
        if sub > len(first):
            raise P.ProtocolError(400, "Invalid fork sub-offset")
        return first[:sub]

    async def _ref(self, path: str, delta: int) -> None:
        async def op() -> None:
            st, _ = await self._view(path)
            if st is None:
                return
            await self._write(path, st, st.js_last, {M.OP: "ref" if delta > 0 else "unref"})
            if delta < 0 and st.refs == 0 and st.soft_deleted:
                await self._drop(path, st)

        await self._retrying(path, op)

    async def append(
        self, path: str, data: bytes, *, content_type: str | None, seq: str | None,
        producer: P.Producer | None, close: bool,
    ) -> tuple[StreamState, str, Verdict | None]:
        """Append (and optionally close), deciding producer and sequence rules on fresh state.

        Returns:
            ``(state, offset after the append, producer verdict or None)``; a verdict other
            than ``accepted`` means nothing was written.

        Raises:
            ProtocolError: 404 unknown stream; 409 closed (with ``Stream-Closed``), content-type
                mismatch or ``Stream-Seq`` regression; 400 bad JSON.
        """

        def refusal(st: StreamState | None) -> tuple[StreamState, str, Verdict] | None:
            """What the append is answered without a write on ``st`` (raised or returned),
            ``None`` when it is written."""
            if st is None:
                raise P.ProtocolError(404, "Stream not found")
            if st.soft_deleted:
                raise P.ProtocolError(410, "Stream is gone")
            if st.closed:
                if producer is not None and st.closed_by == (producer.id, producer.epoch, producer.seq):
                    return st, st.offset, Verdict("duplicate", last_seq=producer.seq)
                raise P.ProtocolError(409, "Stream is closed", {P.CLOSED: "true", P.NEXT_OFFSET: st.offset})
            if content_type and st.content_type and (
                P.normalize_content_type(content_type) != P.normalize_content_type(st.content_type)
            ):
                raise P.ProtocolError(409, "Content-type mismatch")
            if producer is not None:
                verdict = M.check_producer(st, producer)
                if verdict.status != "accepted":
                    return st, st.offset, verdict
            if seq is not None and st.last_seq is not None and seq <= st.last_seq:
                raise P.ProtocolError(409, "Sequence conflict")
            return None

        async def op() -> tuple[StreamState, str, Verdict | None]:
            st = await self.get(path, touch=True, held=True)
            if st is None:
                raise P.ProtocolError(404, "Stream not found")
            if st.soft_deleted:
                raise P.ProtocolError(410, "Stream is gone")
            st, refused = await self._unwritten(path, st, refusal)
            if refused is not None:
                return refused
            verdict = M.check_producer(st, producer) if producer is not None else None
            fragment = P.process_json_append(data) if P.is_json(st.content_type) else data
            off = P.next_offset(st.offset, len(fragment))
            meta: dict[str, object] = {M.OP: "append", M.OFFSET: off}
            if seq is not None:
                meta[M.SEQ] = seq
            if producer is not None:
                meta.update({M.PID: producer.id, M.PEPOCH: producer.epoch, M.PSEQ: producer.seq})
            if close:
                meta[M.CLOSE] = True
            tenant = tenant_of(path)
            # Fenced on the view the append was decided on: a record folded in while the
            # allowance is reserved makes JetStream refuse it, and it is decided again.
            last = st.js_last
            await self._ledger.spend(tenant, len(fragment))
            try:
                new = await self._write(path, st, last, meta, fragment)
            except BaseException:
                self._ledger.refund(tenant, len(fragment))
                raise
            assert new is not None
            return new, off, verdict

        return await self._retrying(path, op)

    async def close(self, path: str, producer: P.Producer | None) -> tuple[StreamState, Verdict | None]:
        """Close a stream without data (idempotent; with a producer, sequenced like an append).

        Raises:
            ProtocolError: 404 unknown stream; 409 closed by another producer.
        """

        def refusal(st: StreamState | None) -> tuple[StreamState, Verdict] | None:
            if st is None:
                raise P.ProtocolError(404, "Stream not found")
            if st.soft_deleted:
                raise P.ProtocolError(410, "Stream is gone")
            assert producer is not None
            if st.closed:
                if st.closed_by == (producer.id, producer.epoch, producer.seq):
                    return st, Verdict("duplicate", last_seq=producer.seq)
                raise P.ProtocolError(409, "Stream is closed", {P.CLOSED: "true", P.NEXT_OFFSET: st.offset})
            verdict = M.check_producer(st, producer)
            return (st, verdict) if verdict.status != "accepted" else None

        async def op() -> tuple[StreamState, Verdict | None]:
            st = await self.get(path, touch=True, held=True)
            if st is None:
                raise P.ProtocolError(404, "Stream not found")
            if st.soft_deleted:
                raise P.ProtocolError(410, "Stream is gone")
            if producer is None:
                if st.closed:
                    return st, None
                new = await self._write(path, st, st.js_last, {M.OP: "close"})
                assert new is not None
                return new, None
            st, refused = await self._unwritten(path, st, refusal)
            if refused is not None:
                return refused
            verdict = M.check_producer(st, producer)
            meta: dict[str, object] = {M.OP: "close", M.PID: producer.id, M.PEPOCH: producer.epoch, M.PSEQ: producer.seq}
            new = await self._write(path, st, st.js_last, meta)
            assert new is not None
            return new, verdict

        return await self._retrying(path, op)

    async def delete(self, path: str) -> None:
        """Delete a stream (soft-delete while forks still read it).

        Raises:
            ProtocolError: 404 unknown; 410 already soft-deleted.
        """

        async def op() -> None:
            st = await self.get(path, held=True)
            if st is None:
                raise P.ProtocolError(404, "Stream not found")
            if st.soft_deleted:
                raise P.ProtocolError(410, "Stream is gone")
            await self._drop(path, st)

        await self._retrying(path, op)

    async def _drop(self, path: str, st: StreamState) -> None:
        """Delete (caller holds the path's lock): soft while referenced, else purge and unref."""
        if st.refs > 0:
            await self._write(path, st, st.js_last, {M.OP: "softdelete"})
            return
        await self._write(path, st, st.js_last, {M.OP: "delete"})
        await self._ledger.remove_stream(tenant_of(path), sum(len(m.data) for m in st.messages))
        with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
            await self._js.purge_stream(self.cfg.stream, subject=self.subject(path), keep=1)
        if st.forked_from:
            src = st.forked_from
            # The source's own lock: always child before parent, so never a cycle.
            await self._ref(src, -1)

    # -- reading -------------------------------------------------------------------------

    def read(self, st: StreamState, offset: str | None) -> list[Message]:
        """Messages strictly after ``offset`` (``None``/``-1``: from the start), forks included."""
        after = None if offset in (None, "-1") else offset
        out: list[Message] = []
        if st.forked_from and st.fork_offset and (after is None or after < st.fork_offset):
            out += self._inherited(st.forked_from, after, st.fork_offset)
        out += M.after(st.messages, after)
        return out

    def _inherited(self, path: str, after: str | None, cap: str) -> list[Message]:
        src = self._cache.get(path)
        if src is None:
            return []
        out: list[Message] = []
        if src.forked_from and src.fork_offset and (after is None or after < src.fork_offset):
            out += self._inherited(src.forked_from, after, min(src.fork_offset, cap))
        out += [m for m in M.after(src.messages, after) if m.offset <= cap]
        return out

    async def wait(self, st: StreamState, timeout: float) -> bool:
        """Wait until ``st`` changes (or another gateway changed it); ``False`` on timeout."""
        ev = st.changed
        try:
            async with asyncio.timeout(timeout):
                await ev.wait()
        except TimeoutError:
            return False
        return True


class _LeaderReads:
    """The leader reads of one stream's last record for :meth:`StreamStore.latest`: how many
    were begun and which was the last done (their numbers), under one lock."""

    __slots__ = ("done", "lock", "started", "users")

    def __init__(self) -> None:
        self.started = self.done = self.users = 0
        self.lock = asyncio.Lock()


_FOLD_TRIES = 3  # folds of one stream while other gateways' writes race them
#: A write refused for a view behind JetStream is tried again at least this many times in
#: all, and more while CONFLICT_BUDGET seconds have not passed since its first try.
CONFLICT_TRIES = 6
CONFLICT_BUDGET = 2.0
_VIEW_TURNS = 8  # looks at the cache and folds, for one view


@functools.lru_cache(maxsize=4096)  # several calls per request for the same few paths
def _key(path: str) -> str:
    return hashlib.sha256(path.encode()).hexdigest()[:40]
