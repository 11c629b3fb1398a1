"""The workspace store on NATS JetStream: snapshots in an Object Store, heads in a KV bucket.

The adapter of :mod:`baton.workspaces`: every NATS call of the package is here, each
bounded by ``cfg.timeout`` and translated once (``LogUnavailable``, ``SnapshotMissing``).
The rules are pure and live beside it: manifests and packs (:mod:`.manifest`), paths and
excludes (:mod:`.paths`), heads (:mod:`.heads`), the fence
(:mod:`baton.log._transcript_fence`). Objects are written before anything names them
(packs, then the manifest, then the head), so a failure half-way leaves only garbage for
:meth:`WorkspaceStore.gc`, never a head naming a missing object.
"""
from __future__ import annotations

import asyncio
import io
import logging
import pathlib
import time
from dataclasses import dataclass, replace
from typing import IO, Any, BinaryIO, Callable

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js import api
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from baton.errors import LogUnavailable, SnapshotMissing, UnknownRun, UnknownThread, WorkspaceConflict, WorkspaceFenced
from baton.log._transcript_fence import TranscriptWriter, verdict
from baton.log._transcripts import thread_key
from baton.workspaces import _gc
from baton.workspaces._config import WorkspaceConfig
from baton.workspaces._packing import PackFile, read_tree
from baton.workspaces._unpack import write_dir, write_tar
from baton.workspaces.heads import ThreadHead, TurnRecord, forked, with_turn
from baton.workspaces.manifest import PACKS, SNAPSHOTS, Manifest, decode, digest_of, packs_to_rewrite

log = logging.getLogger("baton.workspaces")

NATS_ERRORS = (nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError, TimeoutError)
_CAS_TRIES = 3


@dataclass(frozen=True)
class SnapshotInfo:
    """One stored snapshot.

    Attributes:
        digest: the snapshot's content address (its manifest's sha256).
        files: regular files in the tree.
        bytes_total: bytes of file content in the tree.
        bytes_stored: bytes this call wrote (new packs and the manifest); 0 when the same
            tree was stored already.
        skipped: ``(path, reason)`` of archive members left out (devices, fifos, symlinks
            whose target escapes the tree); excluded paths are not listed.
    """

    digest: str
    files: int
    bytes_total: int
    bytes_stored: int
    skipped: tuple[tuple[str, str], ...] = ()


class WorkspaceStore:
    """Snapshots workspace trees and keeps each thread's head.

    Args:
        nc: a connected NATS client.
        cfg: bucket names, replicas and limits (default: from the environment).
        clock: seconds since the epoch (turn records, forks).
    """

    def __init__(self, nc: NATS, cfg: WorkspaceConfig | None = None, *, clock: Callable[[], float] = time.time) -> None:
        self._nc = nc
        self.cfg = cfg or WorkspaceConfig.from_env()
        self._js = nc.jetstream(timeout=self.cfg.timeout)
        self._clock = clock
        self._obj: ObjectStore | None = None
        self._kv: KeyValue | None = None
        self._slots = asyncio.Semaphore(self.cfg.parallel)

    # --- buckets ----------------------------------------------------------------------------

    async def provision(self) -> None:
        """Create the Object Store and the KV bucket if missing (idempotent).

        Raises:
            LogUnavailable: JetStream did not answer.
        """
        try:
            async with asyncio.timeout(self.cfg.timeout):
                await self._provision()
        except NATS_ERRORS as exc:
            raise LogUnavailable(self.cfg.objects, f"provisioning workspaces failed: {type(exc).__name__}") from exc

    async def _provision(self) -> None:
        try:
            self._obj = await self._js.object_store(self.cfg.objects)
        except nats.js.errors.BucketNotFoundError:
            self._obj = await self._js.create_object_store(
                self.cfg.objects,
                api.ObjectStoreConfig(storage=api.StorageType.FILE, replicas=self.cfg.replicas),
            )
        try:
            self._kv = await self._js.key_value(self.cfg.heads)
        except nats.js.errors.BucketNotFoundError:
            self._kv = await self._js.create_key_value(api.KeyValueConfig(
                bucket=self.cfg.heads, history=1, storage=api.StorageType.FILE, replicas=self.cfg.replicas,
                ttl=self.cfg.idle_ttl if self.cfg.idle_ttl > 0 else None,
            ))

    async def _buckets(self) -> tuple[ObjectStore, KeyValue]:
        if self._obj is None or self._kv is None:
            await self._provision()
        assert self._obj is not None and self._kv is not None
        return self._obj, self._kv

    # --- objects ----------------------------------------------------------------------------

    async def _get(self, name: str) -> bytes:
        """An object's bytes (raises ``ObjectNotFoundError``); one get at a time per slot."""
        obj, _ = await self._buckets()
        async with self._slots, asyncio.timeout(self.cfg.timeout):
            buf = io.BytesIO()
            await obj.get(name, writeinto=buf)  # without writeinto nats-py grows one bytes per chunk
            return buf.getvalue()

    async def _exists(self, obj: ObjectStore, name: str, size: int) -> bool:
        try:
            info = await obj.get_info(name)
        except nats.js.errors.ObjectNotFoundError:
            return False
        return info.size == size

    async def _put(self, name: str, data: bytes | IO[bytes], size: int) -> int:
        """Put unless an object of that name and size exists (names are content addresses).
        Returns the bytes written."""
        obj, _ = await self._buckets()
        async with self._slots, asyncio.timeout(self.cfg.timeout):
            if await self._exists(obj, name, size):
                return 0
            meta = api.ObjectMeta(name=name, options=api.ObjectMetaOptions(max_chunk_size=self._chunk()))
            await obj.put(name, data, meta=meta)  # type: ignore[arg-type]  # any readinto-able file
            return size

    def _chunk(self) -> int:
        return max(min(self.cfg.chunk_bytes, self._nc.max_payload - 1024), 4096)

    async def manifest(self, digest: str) -> Manifest:
        """A snapshot's manifest.

        Raises:
            SnapshotMissing: no such snapshot, or its bytes do not match the digest.
            WorkspaceUnsafe: the manifest names unsafe paths.
            LogUnavailable: JetStream did not answer.
        """
        try:
            blob = await self._get(SNAPSHOTS + digest)
        except nats.js.errors.ObjectNotFoundError as exc:
            raise SnapshotMissing(digest, "no such snapshot") from exc
        except NATS_ERRORS as exc:
            raise LogUnavailable(digest, f"reading a snapshot failed: {type(exc).__name__}") from exc
        if digest_of(blob) != digest:
            raise SnapshotMissing(digest, "the manifest does not match its digest")
        return decode(blob)

    # --- snapshot and restore ---------------------------------------------------------------

    async def snapshot(self, tar: bytes | BinaryIO, parent: str | None = None) -> SnapshotInfo:
        """Store a workspace tree; contents the parent snapshot holds are not stored again.

        Args:
            tar: an uncompressed tar archive (bytes, or a readable binary file object, read
                once from its current position; read in a worker thread) whose members are
                relative paths (``work/...``, ``home/...``).
            parent: the snapshot this tree descends from (the thread head's), or ``None``.
                A parent that is gone only costs the dedupe: the tree is stored whole.

        Returns:
            The snapshot's :class:`SnapshotInfo`.

        Raises:
            WorkspaceTooLarge: more file content than ``cfg.max_bytes``; nothing stored.
            WorkspaceUnsafe: a member with an absolute or ``..`` path, or under a symlink.
            LogUnavailable: JetStream did not answer; what was stored is named by nothing.
        """
        base: Manifest | None = None
        if parent is not None:
            try:
                base = await self.manifest(parent)
            except SnapshotMissing:
                log.warning("parent snapshot %s is gone: storing the tree whole", parent)
        rewrite = packs_to_rewrite(base, max_packs=self.cfg.max_packs)
        reusable = {d: s for d, s in (base.content_index() if base else {}).items() if s.pack not in rewrite}
        tree = await asyncio.to_thread(
            read_tree, tar, reusable=reusable, excludes=self.cfg.excludes,
            max_bytes=self.cfg.max_bytes, pack_bytes=self.cfg.pack_bytes,
        )
        try:
            stored = sum(await asyncio.gather(*(self._put_pack(p) for p in tree.packs)))
        finally:
            for p in tree.packs:
                p.data.close()
        sizes = {p.name: p.size for p in tree.packs}
        named = {e.stored.pack for e in tree.entries if e.stored is not None}
        packs = {p: sizes[p] if p in sizes else (base.packs[p] if base else 0) for p in named}
        manifest = Manifest(parent if base is not None else None, packs, tuple(tree.entries))
        blob = manifest.encode()
        digest = digest_of(blob)
        try:
            stored += await self._put(SNAPSHOTS + digest, blob, len(blob))
        except NATS_ERRORS as exc:
            raise LogUnavailable(digest, f"storing a snapshot failed: {type(exc).__name__}") from exc
        return SnapshotInfo(digest, manifest.files, tree.bytes_total, stored, tuple(tree.skipped))

    async def _put_pack(self, pack: PackFile) -> int:
        try:
            return await self._put(PACKS + pack.name, pack.data, pack.size)
        except NATS_ERRORS as exc:
            raise LogUnavailable(pack.name, f"storing a pack failed: {type(exc).__name__}") from exc

    async def _packs(self, digest: str, manifest: Manifest) -> dict[str, bytes]:
        """Every pack the snapshot names, fetched in parallel and checked."""
        names = sorted({e.stored.pack for e in manifest.entries if e.stored is not None})

        async def one(name: str) -> bytes:
            try:
                data = await self._get(PACKS + name)
            except nats.js.errors.ObjectNotFoundError as exc:
                raise SnapshotMissing(digest, f"pack {name} is gone") from exc
            except NATS_ERRORS as exc:
                raise LogUnavailable(digest, f"reading a pack failed: {type(exc).__name__}") from exc
            if await asyncio.to_thread(digest_of, data) != name:
                raise SnapshotMissing(digest, f"pack {name} does not match its digest")
            return data

        datas = await asyncio.gather(*(one(n) for n in names))
        return dict(zip(names, datas))

    async def restore_to_dir(self, digest: str, path: str | pathlib.Path) -> Manifest:
        """Write snapshot ``digest`` under the local directory ``path`` (created if missing;
        meant to be empty). Never writes outside it.

        Returns:
            The snapshot's manifest.

        Raises:
            SnapshotMissing: the snapshot or one of its packs is gone or corrupt.
            WorkspaceUnsafe: the snapshot names an unsafe entry; nothing written.
            LogUnavailable: JetStream did not answer; nothing written.
        """
        manifest = await self.manifest(digest)
        packs = await self._packs(digest, manifest)
        await asyncio.to_thread(write_dir, manifest, packs, pathlib.Path(path))
        return manifest

    async def write_tar(self, digest: str, out: BinaryIO, *, uid: int = 0, gid: int = 0) -> Manifest:
        """Write snapshot ``digest`` as an uncompressed tar stream to ``out`` (in a thread).

        Raises:
            SnapshotMissing, WorkspaceUnsafe, LogUnavailable: as :meth:`restore_to_dir`.
        """
        manifest = await self.manifest(digest)
        packs = await self._packs(digest, manifest)
        await asyncio.to_thread(write_tar, manifest, packs, out, uid=uid, gid=gid)
        return manifest

    async def restore_tar(self, digest: str, *, uid: int = 0, gid: int = 0) -> bytes:
        """Snapshot ``digest`` as uncompressed tar bytes (see :meth:`write_tar`)."""
        buf = io.BytesIO()
        await self.write_tar(digest, buf, uid=uid, gid=gid)
        return buf.getvalue()

    # --- thread heads -----------------------------------------------------------------------

    async def load_head(self, thread_id: str) -> tuple[ThreadHead | None, int | None]:
        """The thread's head and its revision; ``(None, None)`` when it has none.

        Raises:
            LogUnavailable: JetStream did not answer, or the stored value is not a head.
        """
        try:
            _, kv = await self._buckets()
            async with asyncio.timeout(self.cfg.timeout):
                return await _read_head(kv, thread_key(thread_id))
        except ValueError as exc:
            raise LogUnavailable(thread_id, "the stored thread head is malformed") from exc
        except NATS_ERRORS as exc:
            raise LogUnavailable(thread_id, f"loading the thread head failed: {type(exc).__name__}") from exc

    async def save_turn(
        self, thread_id: str, *, run_id: str, snapshot: str | None, agent_session_id: str | None, messages: int,
        workspace: dict[str, Any], agent_kind: str, writer: TranscriptWriter, tenant: str | None = None,
    ) -> int:
        """Record run ``run_id``'s turn: the thread's next run starts from ``snapshot`` and
        ``agent_session_id``. Fenced like a transcript save: it reads the stored head's
        writer, refuses a successor's or a later run's head, and replaces it with
        compare-and-set on the revision read (re-read and retried on a lost race).

        Args:
            thread_id: the thread.
            run_id: the run whose turn ended.
            snapshot: the snapshot taken at its end (``None``: none).
            agent_session_id: the agent session to resume.
            messages: the transcript's length at the run's end.
            workspace: the workspace spec (JSON object; never secrets).
            agent_kind: the agent kind.
            writer: the run, its claim's epoch and start time.
            tenant: the thread's tenant (``None``: keep the stored one).

        Returns:
            The head's new revision.

        Raises:
            WorkspaceFenced: a successor of this run or a later run saved the head.
            WorkspaceConflict: the head changed under every retry.
            LogUnavailable: JetStream did not answer.
        """
        def change(head: ThreadHead | None) -> ThreadHead:
            turn = TurnRecord(snapshot, agent_session_id, messages, self._clock())
            return with_turn(head, run_id=run_id, turn=turn, workspace=workspace, agent_kind=agent_kind,
                             writer=writer, max_turns=self.cfg.max_turns, tenant=tenant)

        landed = await self._replace_head(thread_id, writer, change)
        assert landed is not None  # ``change`` always gives a head
        return landed

    async def note_lost_turn(self, thread_id: str, *, run_id: str, reason: str, writer: TranscriptWriter) -> int | None:
        """Record that run ``run_id``'s turn could not be snapshotted: the head keeps its
        snapshot and session, and names the lost turn until the next turn is saved. Fenced
        as :meth:`save_turn`.

        Returns:
            The head's new revision; ``None`` when the thread has no head (nothing to note on).

        Raises:
            WorkspaceFenced, WorkspaceConflict, LogUnavailable: as :meth:`save_turn`.
        """
        def change(head: ThreadHead | None) -> ThreadHead | None:
            if head is None:
                return None
            return replace(head, lost={"run": run_id, "reason": reason[:500]}, writer=writer, updated_at=self._clock())

        return await self._replace_head(thread_id, writer, change)

    async def _replace_head(self, thread_id: str, writer: TranscriptWriter,
                            change: Callable[[ThreadHead | None], ThreadHead | None]) -> int | None:
        """Replace the thread's head with ``change(head)`` under the transcript fence: read the
        stored writer, refuse a successor's or a later run's head, compare-and-set on the
        revision read (re-read and retried on a lost race).

        Returns:
            The new revision; ``None`` when ``change`` gave nothing to write.

        Raises:
            WorkspaceFenced, WorkspaceConflict, LogUnavailable: as :meth:`save_turn`.
        """
        key = thread_key(thread_id)
        rev: int | None = None
        try:
            _, kv = await self._buckets()
            for _ in range(_CAS_TRIES):
                async with asyncio.timeout(self.cfg.timeout):
                    head, rev = await _read_head(kv, key, lenient=True)
                    stored = head.writer if head is not None else None
                    if verdict(stored, writer) != "replace":
                        assert stored is not None
                        raise WorkspaceFenced(thread_id, writer.run_id, writer.epoch, stored.run_id, stored.epoch)
                    new = change(head)
                    if new is None:
                        return None
                    landed = await _cas(kv, key, new.encode(), rev)
                    if landed is not None:
                        return landed
        except NATS_ERRORS as exc:
            raise LogUnavailable(thread_id, f"saving the thread head failed: {type(exc).__name__}") from exc
        raise WorkspaceConflict(thread_id, rev)

    async def fork(self, src_thread: str, run_id: str, new_thread: str, writer: TranscriptWriter) -> int:
        """Start ``new_thread`` where ``src_thread``'s run ``run_id`` left off: its snapshot
        and agent session (packs shared, nothing copied), ``forked_from`` set. The source is
        untouched.

        Returns:
            The new head's revision.

        Raises:
            UnknownThread: ``src_thread`` has no head.
            UnknownRun: the source head keeps no turn of ``run_id``.
            WorkspaceConflict: ``new_thread`` has a head already.
            LogUnavailable: JetStream did not answer.
        """
        source, _ = await self.load_head(src_thread)
        if source is None:
            raise UnknownThread(src_thread)
        if run_id not in source.turns:
            raise UnknownRun(run_id)
        head = forked(source, source_thread=src_thread, run_id=run_id, writer=writer, now=self._clock())
        try:
            _, kv = await self._buckets()
            async with asyncio.timeout(self.cfg.timeout):
                landed = await _cas(kv, thread_key(new_thread), head.encode(), None)
        except NATS_ERRORS as exc:
            raise LogUnavailable(new_thread, f"saving the thread head failed: {type(exc).__name__}") from exc
        if landed is None:
            raise WorkspaceConflict(new_thread, None)
        return landed

    async def delete_thread(self, thread_id: str) -> None:
        """Delete the thread's head (its snapshots go at the next :meth:`gc`). Idempotent.

        Raises:
            LogUnavailable: JetStream did not answer.
        """
        try:
            _, kv = await self._buckets()
            async with asyncio.timeout(self.cfg.timeout):
                await kv.purge(thread_key(thread_id))
        except NATS_ERRORS as exc:
            raise LogUnavailable(thread_id, f"deleting the thread head failed: {type(exc).__name__}") from exc

    async def gc(self, now: float, grace: float) -> "_gc.GcReport":
        """Delete snapshots and packs no live head reaches (see :func:`baton.workspaces._gc.sweep`).

        Raises:
            LogUnavailable: JetStream did not answer (nothing reachable was deleted).
        """
        obj, kv = await self._buckets()
        try:
            return await _gc.sweep(obj, kv, self.manifest, now=now, grace=grace, timeout=self.cfg.timeout)
        except NATS_ERRORS as exc:
            raise LogUnavailable(self.cfg.objects, f"workspace gc failed: {type(exc).__name__}") from exc


async def _read_head(kv: KeyValue, key: str, *, lenient: bool = False) -> tuple[ThreadHead | None, int | None]:
    try:
        entry = await kv.get(key)
    except nats.js.errors.KeyNotFoundError:  # absent, deleted or purged
        return None, None
    try:
        return ThreadHead.decode(entry.value or b""), int(entry.revision or 0)
    except ValueError:
        if lenient:  # a malformed value has no writer: anyone may replace it
            return None, int(entry.revision or 0)
        raise


async def _cas(kv: KeyValue, key: str, value: bytes, revision: int | None) -> int | None:
    """Write ``value`` if the key is still at ``revision`` (``None``: absent); the new
    revision, or ``None`` when another write came first."""
    try:
        if revision:
            return int(await kv.update(key, value, last=revision))
        return int(await kv.create(key, value))
    except nats.js.errors.KeyWrongLastSequenceError:
        return None
    except nats.js.errors.BadRequestError as exc:
        if exc.err_code in (10071, 10164):  # wrong last sequence; create of an existing key
            return None
        raise
