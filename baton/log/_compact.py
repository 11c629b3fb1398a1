"""Compaction of a finished run's delivery log to its final snapshot and its end (docs/design.md §4.4).

A closed log whose final snapshot covers its last chunk loses nothing a client can show when
the chunks before are dropped: a join from the start then gets the snapshot, marked
``CUSTOM stream.compacted`` (gateway), and the end. What stays: the close record on the run
subject and the final snapshot's parts on ``<run>.~snap``. A log whose end is not covered
by a snapshot (an old log, or one whose final snapshot was never stored) is left as it is.
"""
from __future__ import annotations

from collections.abc import Mapping

import asyncio
import logging

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS

from baton.errors import LogUnavailable
from baton.log import _headers as H
from baton.log._api import RawRecord, first_on_subject, last_on_subject
from baton.log._config import LogConfig
from baton.log._snapshots import latest_final, snapshot_subject

log = logging.getLogger(__name__)


def is_compacted(first: RawRecord | None) -> bool:
    """Whether a log whose first stored record is ``first`` was compacted: it begins with its
    close record, which was not the log's first record (not published on an empty subject)."""
    return first is not None and begins_compacted(first.headers)


def begins_compacted(headers: Mapping[str, str]) -> bool:
    """:func:`is_compacted` from the first stored record's headers."""
    return headers.get(H.KIND) == "close" and headers.get(H.EXPECTED_LAST_SUBJECT_SEQ) != "0"


#: What :func:`compact_outcome` found: compacted now, compacted before, not closed yet (or
#: empty), closed too recently, or closed but its end not covered by a final snapshot (left
#: whole: a join from the start reads it all, as before).
OUTCOMES = ("compacted", "already", "open", "young", "uncovered")


async def compact(nc: NATS, cfg: LogConfig, run_id: str, *, now: float, older_than: float,
                  timeout: float = 5.0) -> bool:
    """:func:`compact_outcome`, as a boolean: True when the log is compacted (now or before)."""
    out = await compact_outcome(nc, cfg, run_id, now=now, older_than=older_than, timeout=timeout)
    return out in ("compacted", "already")


async def compact_outcome(nc: NATS, cfg: LogConfig, run_id: str, *, now: float, older_than: float,
                          timeout: float = 5.0) -> str:
    """Drop the run's chunks and earlier snapshots when its log closed more than
    ``older_than`` seconds before ``now`` and its final snapshot covers its last chunk.

    Args:
        now: the current time (Unix seconds), injected.
        older_than: how long ago the close record must have been stored (seconds).

    Idempotent: a compacted log is found so (``already``) and left as it is. A reader in the
    middle of the log when its chunks go gets an ``OffsetExpired`` (a gap), never a silent
    jump to the end (:class:`baton.log._reader.LogReader`).

    Returns:
        One of :data:`OUTCOMES`.

    Raises:
        LogUnavailable: JetStream did not answer.
    """
    subject = cfg.subject(run_id)
    js = nc.jetstream()
    try:
        close = await last_on_subject(nc, cfg.stream, subject, timeout=timeout)
        if close is None or close.headers.get(H.KIND) != "close":
            return "open"
        if now - close.stored_at < older_than:
            return "young"
        first = await first_on_subject(nc, cfg.stream, subject, timeout=timeout)
        if is_compacted(first):
            return "already"
        final = await latest_final(nc, cfg, run_id, timeout=timeout)
        if final is None:
            return "uncovered"
        offset = int(final.headers.get(H.SNAP_OFFSET, "0") or 0)
        after = await first_on_subject(nc, cfg.stream, subject, start=offset + 1, timeout=timeout)
        if after is None or after.seq != close.seq:
            return "uncovered"  # chunks (or a fence) after the snapshot: it does not cover the end
        keep_from = int(final.headers.get(H.SNAP_FIRST, str(final.seq)))
        await js.purge_stream(cfg.stream, subject=snapshot_subject(cfg, run_id), seq=keep_from)
        await js.purge_stream(cfg.stream, subject=subject, seq=close.seq)
    except (nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError) as exc:
        raise LogUnavailable(run_id, f"compacting the log failed: {type(exc).__name__}") from exc
    log.info("log of run %s compacted to its final snapshot (offset %d) and its close", run_id, offset)
    return "compacted"
