"""Writing a snapshot out: into a local directory, or as a tar (local work: no network).

Blocking: the store runs these in a thread. ``packs`` maps each pack digest to its bytes
(already checked against the digest). The manifest was validated by
:func:`baton.workspaces.manifest.decode` (safe paths, nothing under a symlink, no escaping
symlink); writing a directory checks again on disk: it never follows a symlink it finds
in the target (one in the way is removed, not followed) and never writes outside it.
"""
from __future__ import annotations

import errno
import io
import os
import pathlib
import stat
import tarfile
import zlib
from typing import BinaryIO, Mapping

from baton.errors import WorkspaceUnsafe
from baton.workspaces.manifest import Entry, Manifest


def content(entry: Entry, packs: Mapping[str, bytes]) -> bytes:
    """A file entry's bytes from its pack.

    Raises:
        WorkspaceUnsafe: the location is outside its pack, or the bytes do not inflate to
            the entry's size.
    """
    s = entry.stored
    assert s is not None
    pack = packs[s.pack]
    if s.offset + s.length > len(pack):
        raise WorkspaceUnsafe(entry.path, "stored outside its pack")
    raw = pack[s.offset : s.offset + s.length]
    try:
        data = zlib.decompress(raw) if s.z else bytes(raw)
    except zlib.error as exc:
        raise WorkspaceUnsafe(entry.path, "stored bytes do not inflate") from exc
    if len(data) != entry.size:
        raise WorkspaceUnsafe(entry.path, "stored bytes are not the file's size")
    return data


def write_dir(manifest: Manifest, packs: Mapping[str, bytes], target: pathlib.Path) -> None:
    """Write the tree under ``target`` (created when missing; meant to be empty: an existing
    file at an entry's path is replaced, a symlink in the way is removed).

    Directories first, then files, then symlinks, then directory modes and mtimes (deepest
    first, so a read-only directory is filled before it is made read-only).

    Raises:
        WorkspaceUnsafe: an entry would need to replace a directory by a file or link.
        OSError: the file system refused.
    """
    target.mkdir(parents=True, exist_ok=True)
    root = os.path.realpath(target)
    made: set[str] = {""}

    def ensure_dir(rel: str) -> None:
        if rel in made:
            return
        parent = rel.rsplit("/", 1)[0] if "/" in rel else ""
        ensure_dir(parent)
        full = os.path.join(root, rel)
        try:
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
                os.unlink(full)  # a link or file where a directory belongs: never followed
                os.mkdir(full, 0o755)
        except FileNotFoundError:
            os.mkdir(full, 0o755)
        made.add(rel)

    def parent_of(path: str) -> str:
        return path.rsplit("/", 1)[0] if "/" in path else ""

    dirs = [e for e in manifest.entries if e.kind == "d"]
    for e in dirs:
        ensure_dir(e.path)
    for e in manifest.entries:
        if e.kind != "f":
            continue
        ensure_dir(parent_of(e.path))
        full = os.path.join(root, e.path)
        data = content(e, packs)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(full, flags, 0o600)
        except OSError as exc:
            if exc.errno == errno.EISDIR:
                raise WorkspaceUnsafe(e.path, "a directory is in the way of a file") from exc
            if exc.errno not in (errno.ELOOP, errno.EEXIST):
                raise
            os.unlink(full)  # a symlink at the file's path: replaced, never followed
            fd = os.open(full, flags, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, e.mode)
            os.utime(fd, (e.mtime, e.mtime))
        finally:
            os.close(fd)
    for e in manifest.entries:
        if e.kind != "l":
            continue
        ensure_dir(parent_of(e.path))
        full = os.path.join(root, e.path)
        if os.path.lexists(full):
            if os.path.isdir(full) and not os.path.islink(full):
                raise WorkspaceUnsafe(e.path, "a directory is in the way of a symlink")
            os.unlink(full)
        os.symlink(e.target, full)
    for e in sorted(dirs, key=lambda d: d.path.count("/"), reverse=True):
        full = os.path.join(root, e.path)
        os.chmod(full, e.mode)
        os.utime(full, (e.mtime, e.mtime))


def write_tar(manifest: Manifest, packs: Mapping[str, bytes], out: BinaryIO, *, uid: int = 0, gid: int = 0) -> None:
    """Write the tree as an uncompressed tar stream (members relative, sorted by path; what
    Docker's ``put_archive`` and :mod:`tarfile` extract), owned by ``uid:gid``."""
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for e in manifest.entries:
            info = tarfile.TarInfo(e.path)
            info.uid, info.gid = uid, gid
            if e.kind == "d":
                info.type, info.mode, info.mtime = tarfile.DIRTYPE, e.mode, e.mtime
                tar.addfile(info)
            elif e.kind == "l":
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, e.target, 0o777
                tar.addfile(info)
            else:
                data = content(e, packs)
                info.size, info.mode, info.mtime = len(data), e.mode, e.mtime
                tar.addfile(info, io.BytesIO(data))
