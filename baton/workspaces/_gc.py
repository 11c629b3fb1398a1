"""The workspace gc: mark from live heads, sweep unreachable snapshots and packs.

Mark: every snapshot a live head names (its own and its turn records'), plus every
snapshot younger than ``grace`` (a turn's end stores its manifest before its head names
it; a child's manifest may reuse packs only its parent named); then every pack those
manifests name. Sweep: every snapshot and pack not marked and older than ``grace``
(an object whose age cannot be read is kept). A head whose idle TTL ran out is gone from
the KV bucket, so its snapshots become unreachable here.
"""
from __future__ import annotations

import asyncio
import base64
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Awaitable, Callable

import nats.js.errors
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from baton.errors import SnapshotMissing, WorkspaceUnsafe
from baton.workspaces.heads import ThreadHead
from baton.workspaces.manifest import PACKS, SNAPSHOTS, Manifest

log = logging.getLogger("baton.workspaces")


@dataclass(frozen=True)
class GcReport:
    """What one sweep did: objects kept and deleted, and the bytes deleted."""

    heads: int
    snapshots_kept: int
    snapshots_deleted: int
    packs_kept: int
    packs_deleted: int
    bytes_deleted: int


def _age(mtime: str | None, now: float) -> float | None:
    if not mtime:
        return None
    try:
        return now - datetime.fromisoformat(mtime.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


async def live_snapshots(kv: KeyValue, timeout: float) -> tuple[int, set[str]]:
    """``(heads, snapshots they name)`` over every head in the bucket."""
    heads, marked = 0, set()
    async with asyncio.timeout(timeout):
        watcher = await kv.watchall(ignore_deletes=True)
        try:
            async for entry in watcher:
                if entry is None:  # the end of what is stored now
                    break
                try:
                    head = ThreadHead.decode(entry.value or b"")
                except ValueError:
                    continue
                heads += 1
                marked |= head.snapshots()
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]
    return heads, marked


async def sweep(
    obj: ObjectStore, kv: KeyValue, load: Callable[[str], Awaitable[Manifest]], *, now: float, grace: float,
    timeout: float,
) -> GcReport:
    """One mark-and-sweep (see the module docstring).

    Args:
        obj: the snapshots' Object Store.
        kv: the heads' bucket.
        load: a snapshot digest -> its manifest (raises ``SnapshotMissing``/``WorkspaceUnsafe``).
        now: seconds since the epoch (the objects' mtimes are compared with it).
        grace: seconds; nothing younger is deleted.
        timeout: seconds one JetStream operation may take.
    """
    heads, roots = await live_snapshots(kv, timeout)
    async with asyncio.timeout(timeout):
        try:
            infos = await obj.list(ignore_deletes=True)
        except nats.js.errors.NotFoundError:
            infos = []
    snapshots = {i.name[len(SNAPSHOTS):]: i for i in infos if i.name.startswith(SNAPSHOTS)}
    packs = {i.name[len(PACKS):]: i for i in infos if i.name.startswith(PACKS)}

    def young(mtime: str | None) -> bool:
        age = _age(mtime, now)
        return age is None or age < grace

    roots |= {d for d, i in snapshots.items() if young(i.mtime)}
    marked_packs: set[str] = set()
    kept_snapshots = 0
    for digest in sorted(roots & snapshots.keys()):
        try:
            manifest = await load(digest)
        except (SnapshotMissing, WorkspaceUnsafe):
            log.warning("gc: snapshot %s is unreadable; its packs are not marked by it", digest)
            continue
        kept_snapshots += 1
        marked_packs |= {e.stored.pack for e in manifest.entries if e.stored is not None}
    deleted_snapshots = deleted_packs = freed = 0
    for digest, info in snapshots.items():
        if digest not in roots and not young(info.mtime):
            await _delete(obj, info.name, timeout)
            deleted_snapshots += 1
            freed += info.size or 0
    for name, info in packs.items():
        if name not in marked_packs and not young(info.mtime):
            await _delete(obj, info.name, timeout)
            deleted_packs += 1
            freed += info.size or 0
    return GcReport(heads, kept_snapshots, deleted_snapshots, len(packs) - deleted_packs, deleted_packs, freed)


async def _delete(obj: ObjectStore, name: str, timeout: float) -> None:
    """Delete an object and its tombstone (nats-py leaves a meta record marked deleted)."""
    async with asyncio.timeout(timeout):
        try:
            await obj.delete(name)
        except nats.js.errors.ObjectNotFoundError:
            return
        meta = f"$O.{obj._name}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"
        await obj._js.purge_stream(obj._stream, subject=meta)
