"""Per-tenant limits of Durable Streams: how many streams a tenant holds and how many bytes
their messages take, counted in one JetStream KV bucket that every gateway shares.

One key per tenant (``t<sha256 of the tenant>``) holds ``{"streams": n, "bytes": b}``;
every change is a compare-and-set on the key's revision, so gateways never lose each
other's counts. The count errs on the safe side: a stream is counted before its create
record is written (and uncounted again only when that write did not happen), uncounted
after its delete record is written.

Bytes are reserved in chunks: a gateway takes up to :data:`CHUNK` bytes of a tenant's
allowance at a time (one compare-and-set) and spends it on appends locally, so an append
costs no extra round trip. A tenant is refused once the bucket's count plus the request
would pass the limit: with several gateways a tenant may be refused while another gateway
still holds unspent allowance of it (at most one chunk per gateway). A gateway returns what
it holds when it stops; a killed one's unspent allowance stays counted (at most a chunk per
tenant it served), never the other way round.

Without API keys every stream belongs to the one tenant ``""``: the limits are then global.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue

from gateway.durable_streams import _protocol as P

log = logging.getLogger("gateway.durable_streams")

#: Bytes of a tenant's allowance a gateway reserves at once (less when the limit is near).
CHUNK = 1 << 20


@dataclass(frozen=True)
class QuotaLimits:
    """Per-tenant limits (``BATON_DS_MAX_STREAMS_PER_TENANT``, ``BATON_DS_MAX_BYTES_PER_TENANT``).

    Attributes:
        streams: streams one tenant may hold at once (soft-deleted ones still held by forks
            count); 0 = no limit.
        bytes: bytes of message data one tenant's streams may hold (what appends stored,
            JSON as stored); 0 = no limit.
    """

    streams: int = 10_000
    bytes: int = 10 << 30


class QuotaExceeded(P.ProtocolError):
    """A create or append refused by a tenant limit: ``507``, nothing written.

    The plain-text reason starts with ``DS_STREAM_LIMIT`` or ``DS_BYTES_LIMIT``.
    """

    def __init__(self, what: str, limit: int) -> None:
        self.what = what
        self.limit = limit
        code, unit = ("DS_STREAM_LIMIT", "streams") if what == "streams" else ("DS_BYTES_LIMIT", "bytes")
        super().__init__(507, f"{code}: this tenant's limit of {limit} {unit} is reached")


def tenant_of(path: str) -> str:
    """The tenant of a store path: ``@<quoted tenant>/...`` → the quoted tenant; ``/...`` → ``""``."""
    return path[1:path.index("/")] if path.startswith("@") else ""


def _key(tenant: str) -> str:
    return "t" + hashlib.sha256(tenant.encode()).hexdigest()[:40]


class Ledger:
    """The tenants' counts in the KV bucket ``bucket``.

    Args:
        js: the store's JetStream context.
        bucket: the KV bucket's name (created when missing).
        replicas: its JetStream replicas.
        limits: the limits to enforce.
    """

    def __init__(self, js: JetStreamContext, bucket: str, replicas: int, limits: QuotaLimits) -> None:
        self._js = js
        self._bucket = bucket
        self._replicas = replicas
        self.limits = limits
        self._kv: KeyValue | None = None
        self._seen: dict[str, tuple[int, int, int]] = {}  # key -> (streams, bytes, revision) last read
        self._allowance: dict[str, int] = {}  # tenant -> reserved bytes not spent yet

    async def start(self) -> None:
        """Bind (or create) the bucket."""
        try:
            self._kv = await self._js.key_value(self._bucket)
        except nats.js.errors.BucketNotFoundError:
            self._kv = await self._js.create_key_value(api.KeyValueConfig(
                bucket=self._bucket, history=1, storage=api.StorageType.FILE, replicas=self._replicas))

    async def stop(self) -> None:
        """Return the unspent allowances (best effort: what is not returned stays counted)."""
        held, self._allowance = self._allowance, {}
        for tenant, n in held.items():
            if n:
                with contextlib.suppress(nats.errors.Error, nats.js.errors.Error, TimeoutError):
                    await self._change(tenant, 0, -n)

    async def _read(self, key: str) -> tuple[int, int, int]:
        assert self._kv is not None
        try:
            entry = await self._kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return 0, 0, 0
        v = json.loads(entry.value or b"{}")
        return int(v.get("streams", 0)), int(v.get("bytes", 0)), int(entry.revision or 0)

    async def _change(self, tenant: str, streams: int, nbytes: int, *, need: int = 0) -> int:
        """Add ``streams`` and ``nbytes`` (either may be negative) to a tenant's counts by
        compare-and-set; returns the bytes added (``nbytes`` up to the room left, never less
        than ``need``).

        Raises:
            QuotaExceeded: a positive ``streams`` past the stream limit, or not even ``need``
                bytes of room.
        """
        assert self._kv is not None
        key = _key(tenant)
        seen = self._seen.get(key)
        for _ in range(20):
            have_s, have_b, rev = seen if seen is not None else await self._read(key)
            if streams > 0 and self.limits.streams and have_s + streams > self.limits.streams:
                raise QuotaExceeded("streams", self.limits.streams)
            add = nbytes
            if nbytes > 0 and self.limits.bytes:
                room = self.limits.bytes - have_b
                if room < need:
                    raise QuotaExceeded("bytes", self.limits.bytes)
                add = min(nbytes, room)
            new = (max(0, have_s + streams), max(0, have_b + add))
            try:
                new_rev = await self._kv.update(key, json.dumps({"streams": new[0], "bytes": new[1]}).encode(), last=rev)
            except nats.js.errors.KeyWrongLastSequenceError:
                seen = None  # another gateway (or request) changed it: read again
                continue
            self._seen[key] = (*new, new_rev)
            return add
        raise TimeoutError(f"the usage of tenant {tenant!r} kept changing under 20 updates")

    async def add_stream(self, tenant: str) -> None:
        """Count one more stream of ``tenant``.

        Raises:
            QuotaExceeded: the tenant holds its limit already.
        """
        await self._change(tenant, 1, 0)

    async def remove_stream(self, tenant: str, nbytes: int) -> None:
        """Count one stream less, and ``nbytes`` of data (a deleted stream's, or 0 for a
        create that did not happen). Never raises: shielded from cancellation and bounded
        (5 s); when NATS cannot be told, the stream stays counted (logged)."""
        try:
            async with asyncio.timeout(5):
                await asyncio.shield(self._change(tenant, -1, -nbytes))
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
            log.warning("tenant %r: a stream stays counted (%s bytes): %r", tenant, nbytes, exc)

    async def spend(self, tenant: str, nbytes: int) -> None:
        """Take ``nbytes`` of the tenant's allowance (reserving another chunk when short).

        Raises:
            QuotaExceeded: the tenant's limit leaves no room for ``nbytes``.
        """
        if nbytes <= 0:
            return
        while (have := self._allowance.get(tenant, 0)) < nbytes:
            need = nbytes - have
            got = await self._change(tenant, 0, max(need, CHUNK), need=need)
            # Read again after the await: a concurrent spend may have changed it meanwhile.
            self._allowance[tenant] = self._allowance.get(tenant, 0) + got
        self._allowance[tenant] = have - nbytes

    def refund(self, tenant: str, nbytes: int) -> None:
        """Give back ``nbytes`` spent on a write that did not happen (kept for the next)."""
        if nbytes > 0:
            self._allowance[tenant] = self._allowance.get(tenant, 0) + nbytes
