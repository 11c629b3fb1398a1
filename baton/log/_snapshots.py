"""Snapshot records in JetStream: where they live, how a writer stores one and a reader
finds the latest (docs/design.md §4.6; the rule itself is :mod:`baton.log.snapshot`).

A run's snapshots live on ``<run subject>.~snap``: a subject of its own, so the aligner, the
takeover read and every plain join (all read the run subject exactly) never see them. A
snapshot larger than one message is stored as consecutive parts; each part is published
with the run log's head as its expected last sequence *on the run subject*
(``Nats-Expected-Last-Subject-Sequence-Subject``), so a writer fenced out by a successor
cannot store a part, exactly as it cannot store a chunk.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS

from baton.errors import LogUnavailable
from baton.log import _headers as H
from baton.log._api import (ERR_WRONG_LAST_SEQUENCE, RawRecord, direct_batch, first_on_subject, last_on_subject,
                            record_at)
from baton.log._config import LogConfig
from baton.log.snapshot import Snapshot, decode, encode, split

log = logging.getLogger(__name__)

#: The last token of a run's snapshot subject.
SNAP_TOKEN = "~snap"


class SnapshotFenced(Exception):
    """A part was refused: the run log's head is not the one the writer holds."""


def snapshot_subject(cfg: LogConfig, run_id: str) -> str:
    """``<run subject>.~snap``."""
    return f"{cfg.subject(run_id)}.{SNAP_TOKEN}"


def _final(rec: RawRecord) -> bool:
    i, _, n = rec.headers.get(H.SNAP_PART, "").partition("/")
    return rec.headers.get(H.KIND) == "snapshot" and bool(n) and i == n


async def latest_final(nc: NATS, cfg: LogConfig, run_id: str, *, timeout: float = 5.0) -> RawRecord | None:
    """The last part of the run's latest complete snapshot, or ``None`` (one or two reads).

    Raises:
        LogUnavailable: JetStream did not answer.
    """
    try:
        rec = await last_on_subject(nc, cfg.stream, snapshot_subject(cfg, run_id), timeout=timeout)
        if rec is not None and not _final(rec):
            # A snapshot whose writer stopped between its parts: the one before it.
            prev = int(rec.headers.get(H.SNAP_PREV, "0") or 0)
            rec = await record_at(nc, cfg.stream, prev, timeout=timeout) if prev else None
    except (nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError) as exc:
        raise LogUnavailable(run_id, f"reading the snapshot failed: {type(exc).__name__}") from exc
    return rec if rec is not None and _final(rec) else None


async def body_of(nc: NATS, cfg: LogConfig, run_id: str, final: RawRecord, *, timeout: float = 5.0) -> bytes | None:
    """The whole body of the snapshot whose last part is ``final`` (``None``: parts are gone).

    Raises:
        LogUnavailable: JetStream did not answer.
    """
    subject = snapshot_subject(cfg, run_id)
    n = int(final.headers[H.SNAP_PART].partition("/")[2])
    parts: list[bytes] = []
    seq = int(final.headers.get(H.SNAP_FIRST, str(final.seq)))
    try:
        for _ in range(n - 1):
            part = await first_on_subject(nc, cfg.stream, subject, start=seq, timeout=timeout)
            if part is None or part.seq >= final.seq:
                return None  # parts expired under us: as if there were no snapshot
            parts.append(part.data)
            seq = part.seq + 1
    except (nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError) as exc:
        raise LogUnavailable(run_id, f"reading the snapshot failed: {type(exc).__name__}") from exc
    parts.append(final.data)
    return b"".join(parts)


def part_seqs(final: RawRecord) -> list[int] | None:
    """The stream sequences of every part of the snapshot whose last part is ``final``, in order
    (``None``: not recorded, a snapshot stored before they were, or one of one part)."""
    raw = final.headers.get(H.SNAP_SEQS, "")
    try:
        seqs = [int(s) for s in raw.split(",")] if raw else []
    except ValueError:
        return None
    n = int(final.headers.get(H.SNAP_PART, "0/0").partition("/")[2] or 0)
    return seqs + [final.seq] if seqs and len(seqs) == n - 1 else None


async def part_at(nc: NATS, cfg: LogConfig, run_id: str, seq: int, final: RawRecord, *,
                  timeout: float = 5.0) -> bytes | None:
    """The bytes of the part at ``seq`` of the snapshot whose last part is ``final`` (``None``:
    gone, e.g. expired under the reader, or not a part of it).

    Raises:
        LogUnavailable: JetStream did not answer.
    """
    try:
        rec = await record_at(nc, cfg.stream, seq, timeout=timeout)
    except (nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError) as exc:
        raise LogUnavailable(run_id, f"reading the snapshot failed: {type(exc).__name__}") from exc
    if rec is None or rec.headers.get(H.KIND) != "snapshot" \
            or rec.headers.get(H.SNAP_OFFSET) != final.headers.get(H.SNAP_OFFSET) \
            or rec.headers.get(H.MSG_ID, "").rpartition("/")[0] != final.headers.get(H.MSG_ID, "").rpartition("/")[0]:
        return None
    return rec.data


async def latest(nc: NATS, cfg: LogConfig, run_id: str, *, timeout: float = 5.0) -> tuple[Snapshot, int] | None:
    """The run's latest complete snapshot and the sequence of its last part, or ``None``.

    Raises:
        LogUnavailable: JetStream did not answer.
    """
    final = await latest_final(nc, cfg, run_id, timeout=timeout)
    body = None if final is None else await body_of(nc, cfg, run_id, final, timeout=timeout)
    if final is None or body is None:
        return None
    try:
        snap = decode(body)
        return dataclasses.replace(snap, body=body), final.seq
    except (ValueError, KeyError) as exc:
        log.warning("snapshot of run %s at %d is unreadable (%s): ignored", run_id, final.seq, exc)
        return None


async def store(nc: NATS, cfg: LogConfig, run_id: str, epoch: int, snap: Snapshot, *, head: int, prev: int,
                part_bytes: int, timeout: float) -> int:
    """Store ``snap`` as parts fenced on the run log's ``head``; return its last part's sequence.

    Message ids ``<run>/snap/<offset>/<i>`` are the same for every writer of the same
    snapshot, so a successor storing again what its predecessor stored within JetStream's
    de-duplication window stores nothing twice.

    Raises:
        SnapshotFenced: the run log's head is not ``head`` (read the tail to learn why).
        LogUnavailable: JetStream refused or did not answer.
    """
    subject = snapshot_subject(cfg, run_id)
    parts = split(snap.body or encode(snap), part_bytes)
    first = 0
    seq = 0
    seqs: list[str] = []
    for i, body in enumerate(parts, 1):
        headers = {
            H.KIND: "snapshot", H.EPOCH: str(epoch), H.SNAP_OFFSET: str(snap.offset),
            H.SNAP_PART: f"{i}/{len(parts)}", H.SNAP_PREV: str(prev),
            H.MSG_ID: f"{run_id}/snap/{snap.offset}/{i}",
            H.EXPECTED_LAST_SUBJECT_SEQ: str(head), H.EXPECTED_LAST_SUBJECT_SEQ_SUBJECT: cfg.subject(run_id),
        }
        if i == len(parts) and first:
            headers[H.SNAP_FIRST] = str(first)
            # Where every part is: a reader of the newest messages reads only the parts it needs.
            headers[H.SNAP_SEQS] = ",".join(seqs)
        try:
            reply = await nc.request(subject, body, timeout=timeout, headers=headers)
        except (nats.errors.Error, asyncio.TimeoutError) as exc:
            raise LogUnavailable(run_id, f"snapshot part not stored: {type(exc).__name__}") from exc
        resp = json.loads(reply.data)
        err = resp.get("error")
        if err is not None:
            if err.get("err_code") == ERR_WRONG_LAST_SEQUENCE:
                raise SnapshotFenced()
            raise LogUnavailable(run_id, f"snapshot part refused: {err.get('description', '')}")
        seq = int(resp["seq"])
        first = first or seq
        seqs.append(str(seq))
    return seq


async def chunks_between(nc: NATS, cfg: LogConfig, run_id: str, after: int, up_to: int, *,
                         timeout: float = 5.0) -> list[tuple[int, bytes]]:
    """The chunk records of the run strictly after ``after`` up to ``up_to`` (inclusive):
    ``(sequence, body)``, read by batched direct gets (no consumer: a takeover primes its
    snapshot state from these, at most about one snapshot's worth).

    Raises:
        LogUnavailable: JetStream did not answer, or the records before ``up_to`` are gone.
    """
    subject = cfg.subject(run_id)
    out: list[tuple[int, bytes]] = []
    start = after + 1
    try:
        while start <= up_to:
            batch = await direct_batch(nc, cfg.stream, subject, up_to=up_to, max_bytes=4 << 20, timeout=timeout,
                                       start=start)
            if not batch:
                raise LogUnavailable(run_id, f"the log stops short of {up_to} (read from {start})")
            for rec in batch:
                if rec.headers.get(H.KIND, "chunk") == "chunk":
                    out.append((rec.seq, rec.data))
            start = batch[-1].seq + 1
    except (nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError) as exc:
        raise LogUnavailable(run_id, f"reading the log failed: {type(exc).__name__}") from exc
    return out
