"""The snapshots a gateway serves joins from (docs/design.md §4.6): read once, shared by readers.

A join from a snapshot looks up the run's latest complete snapshot (one read of the last
record on ``<run>.~snap``) and serves its events. The events' JSON bytes are kept in a
small cache keyed by the snapshot's last record, so a hundred readers of one long run hold
one copy, not a hundred, and the decoded messages are dropped at once. The frames are
written in slices (:data:`SLICE` bytes), so a reader whose client stopped reading holds at
most a slice and the socket's buffer of the snapshot, however long the run: what a reader
costs the gateway does not grow with the run.
"""
from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import dataclass
from typing import Any, Iterator

import nats.errors
import nats.js.errors

from baton.errors import LogUnavailable
from baton.log._api import first_on_subject
from baton.log._compact import is_compacted
from baton.log._snapshots import body_of, latest_final
from baton.runs import STREAM_COMPACTED
from baton.log.snapshot import event_lines
from gateway import _grpc_wire
from gateway._sse import Framing, dumps

log = logging.getLogger("gateway.snapshots")

#: Largest piece of a snapshot frame written at once (bytes).
SLICE = 64 * 1024
#: Bytes of snapshot events a gateway keeps for the next reader.
CACHE_BYTES = 64 << 20


@dataclass(frozen=True)
class ServedSnapshot:
    """A snapshot as readers get it.

    Attributes:
        offset: the stream sequence of the last chunk it covers (the resume id of its last event).
        events: each event's JSON bytes, in order.
    """

    offset: int
    events: tuple[bytes, ...]

    def compacted(self) -> "ServedSnapshot":
        """The same, after a ``CUSTOM stream.compacted {snapshotOffset}`` event (no id): what a
        join from the start of a compacted log gets (docs/api.md)."""
        marker = dumps({"type": "CUSTOM", "name": STREAM_COMPACTED, "value": {"snapshotOffset": str(self.offset)}})
        return ServedSnapshot(self.offset, (marker, *self.events))

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
        self._bytes = 0

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
            offset, lines = event_lines(body)  # served as stored: never parsed here
        except ValueError as exc:
            log.warning("snapshot of run %s at %d is unreadable (%s): joined from the start", run_id, final.seq, exc)
            return None
        served = ServedSnapshot(offset, tuple(lines))
        if served.size <= self._max:
            self._kept[key] = served
            self._bytes += served.size
            while self._bytes > self._max:
                _, old = self._kept.popitem(last=False)
                self._bytes -= old.size
        return served


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
