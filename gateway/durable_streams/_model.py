"""A Durable Stream's state as a pure fold of its records in JetStream.

Every change to a stream is one record on its subject (``op``: ``create``, ``append``,
``close``, ``softdelete``, ``delete``, ``ref``, ``unref``); :func:`apply` folds a record into
the state. The store applies the very record it just published to its cache, and a gateway
that (re)loads a stream folds the subject from its start, so every gateway's view is the
log's, never a second source of truth.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from gateway.durable_streams import _protocol as P

# Keys of a record's metadata (a JSON object before the data: see encode_record).
OP = "op"
CONFIG = "config"
OFFSET = "offset"
SEQ = "seq"
PID = "pid"
PEPOCH = "epoch"
PSEQ = "pseq"
CLOSE = "close"
GATEWAY = "gw"


@dataclass
class ProducerState:
    """An idempotent producer's last accepted ``(epoch, seq)``."""

    epoch: int
    last_seq: int


@dataclass(frozen=True)
class Message:
    """One stored message: the offset after it and its bytes (a JSON fragment in JSON mode)."""

    offset: str
    data: bytes


@dataclass
class StreamState:
    """One stream as the gateway serves it.

    ``js_last`` is the JetStream sequence of the subject's last record: every write is
    published with it as the expected last subject sequence, so two gateways (or a stale
    cache) can never interleave writes.
    """

    path: str
    content_type: str | None
    ttl: int | None = None
    expires_at: str | None = None
    expires_ts: float | None = None
    created: float = 0.0
    last_access: float = 0.0
    closed: bool = False
    closed_by: tuple[str, int, int] | None = None
    producers: dict[str, ProducerState] = field(default_factory=dict)
    last_seq: str | None = None
    messages: list[Message] = field(default_factory=list)
    offset: str = P.ZERO_OFFSET
    forked_from: str | None = None
    fork_offset: str | None = None
    fork_sub_offset: int = 0
    refs: int = 0
    soft_deleted: bool = False
    js_last: int = 0
    # The highest expected-last sequence of another gateway's write heard of (its record
    # follows that sequence): while it is >= ``js_last`` the view lacks a record that is
    # stored or about to be, and is caught up before it is served (``_store.py``).
    heard_prev: int = 0
    # Made when a reader first waits, not on every append: most appends have none.
    _changed: asyncio.Event | None = field(default=None, repr=False, compare=False)

    @property
    def changed(self) -> asyncio.Event:
        """Set at the next change (:meth:`notify`); a reader waits on it."""
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def notify_pending(self) -> None:
        """Mark this (uncached, possibly stale) view changed already: a reader that waits on
        it reads again at once."""
        self._changed = asyncio.Event()
        self._changed.set()

    def notify(self) -> None:
        """Wake every reader waiting for a change."""
        ev, self._changed = self._changed, None
        if ev is not None:
            ev.set()

    def expired(self, now: float) -> bool:
        """Whether the TTL (sliding, from the last access) or the absolute expiry has passed."""
        if self.expires_ts is not None and now >= self.expires_ts:
            return True
        return self.ttl is not None and now >= self.last_access + self.ttl

    def config(self) -> dict[str, Any]:
        """The create-time configuration (what an idempotent PUT must match)."""
        return {
            "path": self.path,
            "contentType": self.content_type,
            "ttl": self.ttl,
            "expiresAt": self.expires_at,
            "expiresTs": self.expires_ts,
            "closed": self.closed,
            "forkedFrom": self.forked_from,
            "forkOffset": self.fork_offset,
            "forkSubOffset": self.fork_sub_offset,
            "created": self.created,
        }


def state_from_config(cfg: dict[str, Any], js_seq: int) -> StreamState:
    """A new stream from a ``create`` record's configuration."""
    st = StreamState(
        path=cfg["path"],
        content_type=cfg.get("contentType"),
        ttl=cfg.get("ttl"),
        expires_at=cfg.get("expiresAt"),
        expires_ts=cfg.get("expiresTs"),
        created=cfg.get("created", 0.0),
        last_access=cfg.get("created", 0.0),
        closed=bool(cfg.get("closed")),
        forked_from=cfg.get("forkedFrom"),
        fork_offset=cfg.get("forkOffset"),
        fork_sub_offset=int(cfg.get("forkSubOffset") or 0),
        js_last=js_seq,
    )
    if st.fork_offset:
        st.offset = st.fork_offset
    return st


_ENCODER = json.JSONEncoder(separators=(",", ":"))  # one encoder, not one per json.dumps call


def encode_record(meta: dict[str, Any], data: bytes = b"") -> bytes:
    """A record's body: 4-byte big-endian metadata length, the metadata JSON, the data.

    Metadata rides in the body, not in NATS headers: paths and producer ids are arbitrary
    UTF-8, which header parsing does not round-trip.
    """
    raw = _ENCODER.encode(meta).encode()
    return len(raw).to_bytes(4, "big") + raw + data


def decode_record(body: bytes) -> tuple[dict[str, Any], bytes]:
    """``(metadata, data)`` of a record body written by :func:`encode_record`."""
    n = int.from_bytes(body[:4], "big")
    return json.loads(body[4 : 4 + n]), body[4 + n :]


def apply(st: StreamState | None, js_seq: int, headers: dict[str, Any], data: bytes) -> StreamState | None:
    """Fold one record into a stream's state.

    Returns:
        The new state (the same object, updated), or ``None`` once deleted.
    """
    op = headers.get(OP, "")
    if op == "create":
        return state_from_config(headers[CONFIG], js_seq)
    if op == "delete" or st is None:
        return None
    st.js_last = js_seq
    if op == "append":
        st.messages.append(Message(headers[OFFSET], data))
        st.offset = headers[OFFSET]
        if SEQ in headers:
            st.last_seq = headers[SEQ]
        _producer(st, headers)
        if headers.get(CLOSE):
            _close(st, headers)
    elif op == "close":
        _producer(st, headers)
        _close(st, headers)
    elif op == "softdelete":
        st.soft_deleted = True
    elif op == "ref":
        st.refs += 1
    elif op == "unref":
        st.refs = max(0, st.refs - 1)
    return st


def _producer(st: StreamState, headers: dict[str, Any]) -> None:
    if PID in headers:
        st.producers[headers[PID]] = ProducerState(int(headers[PEPOCH]), int(headers[PSEQ]))


def _close(st: StreamState, headers: dict[str, Any]) -> None:
    st.closed = True
    if PID in headers:
        st.closed_by = (headers[PID], int(headers[PEPOCH]), int(headers[PSEQ]))


@dataclass(frozen=True)
class Verdict:
    """An idempotent producer check: ``accepted``, ``duplicate``, ``stale_epoch``,
    ``invalid_epoch_seq`` or ``sequence_gap`` (with the numbers each answer needs)."""

    status: str
    last_seq: int = 0
    current_epoch: int = 0
    expected: int = 0
    received: int = 0


def check_producer(st: StreamState, p: P.Producer) -> Verdict:
    """The protocol's producer rule (PROTOCOL.md §5.2.1): epochs fence, sequences dedupe."""
    cur = st.producers.get(p.id)
    if cur is None:
        if p.seq != 0:
            return Verdict("sequence_gap", expected=0, received=p.seq)
        return Verdict("accepted")
    if p.epoch < cur.epoch:
        return Verdict("stale_epoch", current_epoch=cur.epoch)
    if p.epoch > cur.epoch:
        return Verdict("accepted") if p.seq == 0 else Verdict("invalid_epoch_seq")
    if p.seq <= cur.last_seq:
        return Verdict("duplicate", last_seq=cur.last_seq)
    if p.seq == cur.last_seq + 1:
        return Verdict("accepted")
    return Verdict("sequence_gap", expected=cur.last_seq + 1, received=p.seq)


def after(messages: list[Message], after: str | None) -> list[Message]:
    """The messages with an offset strictly past ``after`` (all of them for ``None``)."""
    if after is None:
        return list(messages)
    # Offsets increase strictly: binary search the first one past ``after``.
    lo, hi = 0, len(messages)
    while lo < hi:
        mid = (lo + hi) // 2
        if messages[mid].offset <= after:
            lo = mid + 1
        else:
            hi = mid
    return messages[lo:]


def same_config(st: StreamState, cfg: dict[str, object]) -> bool:
    """Whether a create's config ``cfg`` names the stream ``st`` is (an idempotent create)."""
    want_ct = P.normalize_content_type(cfg.get("contentType")) or P.DEFAULT_CONTENT_TYPE  # type: ignore[arg-type]
    have_ct = P.normalize_content_type(st.content_type) or P.DEFAULT_CONTENT_TYPE
    if cfg.get("forkedFrom") and not cfg.get("contentType"):
        want_ct = have_ct
    return (
        want_ct == have_ct
        and cfg.get("ttl") == st.ttl
        and cfg.get("expiresAt") == st.expires_at
        and bool(cfg.get("closed")) == st.closed
        and (cfg.get("forkedFrom") or None) == st.forked_from
        and (cfg.get("forkOffset") is None or cfg.get("forkOffset") == st.fork_offset)
        and int(cfg.get("forkSubOffset") or 0) == st.fork_sub_offset  # type: ignore[call-overload]
    )
