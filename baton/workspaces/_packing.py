"""Reading a workspace tar into manifest entries and new packs (local work: no network).

Blocking (hashing, compression, temp files): the store runs :func:`read_tree` in a thread.
Each file is hashed while it is written, tentatively, at the end of the open pack; when its
sha256 turns out to be stored already (in the parent snapshot's reusable packs, or earlier
in this tree) the pack is cut back, so only new contents are ever kept.
"""
from __future__ import annotations

import hashlib
import io
import tarfile
import tempfile
import zlib
from dataclasses import dataclass, field
from typing import IO, BinaryIO

from baton.errors import WorkspaceTooLarge
from baton.workspaces.manifest import Entry, Stored, check_tree
from baton.workspaces.paths import Excludes, link_stays_inside, safe_path

_READ = 1 << 20
_SAMPLE = 64 << 10
# Below this a file is stored raw: zlib's header and the per-entry flag cost more than it saves.
_MIN_COMPRESS = 512
# Compress a content only when its first _SAMPLE bytes shrink below this fraction.
_WORTH = 0.9
# Packs stay in memory up to this size, then spool to a temp file.
_SPOOL = 8 << 20


@dataclass
class PackFile:
    """A sealed pack: its content address, size, and its bytes (rewound)."""

    name: str
    size: int
    data: IO[bytes]


@dataclass
class Tree:
    """What :func:`read_tree` found.

    Attributes:
        entries: every kept entry, with its content's location.
        packs: the new packs (not stored yet).
        bytes_total: bytes of file content in the tree.
        bytes_new: bytes written into new packs (compressed where it paid).
        skipped: ``(path, reason)`` of members left out (devices, fifos, escaping symlinks),
            excludes not included.
    """

    entries: list[Entry] = field(default_factory=list)
    packs: list[PackFile] = field(default_factory=list)
    bytes_total: int = 0
    bytes_new: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)


class _PackWriter:
    """Appends contents to the open pack; seals it past ``target`` bytes."""

    def __init__(self, target: int) -> None:
        self._target = target
        self.sealed: list[PackFile] = []
        self._open()

    def _open(self) -> None:
        self._file: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=_SPOOL)  # noqa: SIM115 - owned by the PackFile
        self._hash = hashlib.sha256()
        self._size = 0

    def add(self, src: IO[bytes], size: int, known: dict[str, Stored]) -> tuple[str, Stored, bool]:
        """Hash ``size`` bytes of ``src`` and store them unless ``known``.

        Returns:
            ``(sha256, where it is stored, whether it was written now)``; a new content's
            ``Stored.pack`` is ``""`` until its pack is sealed (see :meth:`seal`).
        """
        first = src.read(min(size, _READ))
        compress = size >= _MIN_COMPRESS and len(zlib.compress(first[:_SAMPLE], 1)) < _WORTH * min(len(first), _SAMPLE)
        start, before = self._size, self._hash.copy()
        digest = hashlib.sha256()
        z = zlib.compressobj(1) if compress else None
        block = first
        while block:
            digest.update(block)
            self._write(z.compress(block) if z is not None else block)
            block = src.read(_READ)
        if z is not None:
            self._write(z.flush())
        sha = digest.hexdigest()
        if sha in known:  # stored already: cut the pack back
            self._file.seek(start)
            self._file.truncate()
            self._size, self._hash = start, before
            return sha, known[sha], False
        return sha, Stored("", start, self._size - start, compress), True

    def _write(self, data: bytes) -> None:
        if data:
            self._file.write(data)
            self._hash.update(data)
            self._size += len(data)

    def close_open(self) -> None:
        """Drop the open pack (empty once :meth:`seal` ran last)."""
        self._file.close()

    @property
    def full(self) -> bool:
        return self._size >= self._target

    def seal(self) -> str | None:
        """Close the open pack (when it holds anything) and open the next; its name."""
        if self._size == 0:
            return None
        self._file.seek(0)
        name = self._hash.hexdigest()
        self.sealed.append(PackFile(name, self._size, self._file))
        self._open()
        return name


def read_tree(
    src: bytes | BinaryIO, *, reusable: dict[str, Stored], excludes: Excludes, max_bytes: int, pack_bytes: int,
) -> Tree:
    """Read an uncompressed tar (a stream: it may not be seekable) into a :class:`Tree`.

    Args:
        src: the archive's bytes or a readable binary file object.
        reusable: sha256 -> stored location of contents the snapshot may reference
            instead of storing them again (the parent's, less the packs being rewritten).
        excludes: paths left out (and everything under them).
        max_bytes: bytes of file content the tree may hold.
        pack_bytes: a pack is sealed once it holds this many bytes.

    Returns:
        The tree; its new packs' temp files belong to the caller (close them).

    Raises:
        WorkspaceTooLarge: the tree's file content passed ``max_bytes`` (reading stops).
        WorkspaceUnsafe: a member with an absolute or ``..`` path, or under a symlink.
        tarfile.TarError: not a tar archive.
    """
    fileobj = io.BytesIO(src) if isinstance(src, (bytes, bytearray, memoryview)) else src
    tree = Tree()
    known = dict(reusable)
    writer = _PackWriter(pack_bytes)
    by_path: dict[str, Entry] = {}
    unsealed: list[str] = []  # paths whose content is in the open pack
    try:
        with tarfile.open(fileobj=fileobj, mode="r|") as tar:
            for m in tar:
                path = safe_path(m.name)
                if not path or excludes.excluded(path):
                    continue
                mtime, mode = int(m.mtime), m.mode & 0o7777
                if m.isdir():
                    by_path[path] = Entry(path, "d", mode, mtime)
                elif m.issym():
                    if link_stays_inside(path, m.linkname):
                        by_path[path] = Entry(path, "l", target=m.linkname)
                    else:
                        tree.skipped.append((path, "a symlink whose target escapes the tree"))
                elif m.islnk():
                    # A hard link names a file earlier in the archive: the same content.
                    target = by_path.get(safe_path(m.linkname))
                    if target is None or target.kind != "f":
                        tree.skipped.append((path, "a hard link to a file not in the archive"))
                        continue
                    tree.bytes_total += target.size
                    _check_limit(tree.bytes_total, max_bytes)
                    by_path[path] = Entry(path, "f", mode, mtime, target.size, target.digest, target.stored)
                    if target.stored is not None and target.stored.pack == "":
                        unsealed.append(path)
                elif m.isreg():
                    tree.bytes_total += m.size
                    _check_limit(tree.bytes_total, max_bytes)
                    data = tar.extractfile(m)
                    assert data is not None
                    sha, stored, new = writer.add(data, m.size, known)
                    by_path[path] = Entry(path, "f", mode, mtime, m.size, sha, stored)
                    if new:
                        known[sha] = stored
                        tree.bytes_new += stored.length
                    if stored.pack == "":  # in the open pack: named when it is sealed
                        unsealed.append(path)
                    if writer.full:
                        _seal(writer, by_path, known, unsealed)
                else:
                    tree.skipped.append((path, "not a file, directory or symlink"))
        _seal(writer, by_path, known, unsealed)
        tree.entries = sorted(by_path.values(), key=lambda e: e.path)
        check_tree(tree.entries)
    except BaseException:
        for p in writer.sealed:
            p.data.close()
        raise
    finally:
        writer.close_open()
    tree.packs = writer.sealed
    return tree


def _seal(writer: _PackWriter, by_path: dict[str, Entry], known: dict[str, Stored], unsealed: list[str]) -> None:
    """Seal the open pack and give its name to the entries (and known contents) inside it."""
    name = writer.seal()
    if name is None:
        return
    for path in unsealed:
        e = by_path[path]
        if e.stored is not None and e.stored.pack == "":
            fixed = Stored(name, e.stored.offset, e.stored.length, e.stored.z)
            by_path[path] = Entry(e.path, e.kind, e.mode, e.mtime, e.size, e.digest, fixed)
            known[e.digest] = fixed
    unsealed.clear()


def _check_limit(total: int, limit: int) -> None:
    if total > limit:
        raise WorkspaceTooLarge(limit, total)
