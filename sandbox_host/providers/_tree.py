"""A sandbox's tree as one tar: its working directory (``work/``) and agent home (``home/``).

``export_tree`` of a provider writes an uncompressed tar whose members are relative:
``work``, ``work/…``, ``home``, ``home/…`` (``home`` only when the sandbox has one), in a
stable order (directories walked sorted), so the same tree gives the same members.
``import_tree`` extracts such a tar, refusing it whole before anything is written when a
member is absolute, climbs out (``..``), or lies outside ``work`` and ``home``; links may
not point out of their root either (``tarfile``'s ``data`` filter, for local sandboxes).

Blocking functions: providers call them in a worker thread.
"""
from __future__ import annotations

import io
import os
import posixpath
import tarfile
import tempfile
import time
from typing import IO, Any, Iterable, Iterator

from baton.errors import SandboxBuildFailed

ROOTS = ("work", "home")


def split(name: str) -> tuple[str, str]:
    """``(root, rest)`` of a member name: ``"work/a/b"`` → ``("work", "a/b")``.

    Raises:
        SandboxBuildFailed: ``import``: absolute, ``..``, or not under ``work``/``home``.
    """
    if name.startswith("/") or "\\" in name or "\x00" in name:
        raise SandboxBuildFailed("import", f"member {name[:200]!r} is not a relative path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise SandboxBuildFailed("import", f"member {name[:200]!r} climbs out of the tree")
    if not parts or parts[0] not in ROOTS:
        raise SandboxBuildFailed("import", f"member {name[:200]!r} is outside work/ and home/")
    return parts[0], "/".join(parts[1:])


def check(members: Iterable[tarfile.TarInfo]) -> list[tarfile.TarInfo]:
    """Every member, each checked with :func:`split` (hard links' targets too).

    Raises:
        SandboxBuildFailed: ``import`` for the first bad member, or a device/FIFO member.
    """
    out = []
    for m in members:
        root, _ = split(m.name)
        if m.islnk() and split(m.linkname)[0] != root:
            raise SandboxBuildFailed("import", f"member {m.name[:200]!r} links across work/ and home/")
        if m.ischr() or m.isblk() or m.isfifo():
            raise SandboxBuildFailed("import", f"member {m.name[:200]!r} is a device or FIFO")
        out.append(m)
    return out


def export_local(workdir: str, home: str | None, exclude: str | None = None) -> bytes:
    """The tar of a local sandbox (symlinks kept as links, never followed); ``exclude``: a
    directory inside ``workdir`` left out (a sandbox daemon's state kept in its workspace)."""
    buf = io.BytesIO()
    skip = None if exclude is None else "work/" + os.path.relpath(exclude, workdir)

    def keep(m: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if skip is not None and (m.name == skip or m.name.startswith(skip + "/")) else m

    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(workdir, arcname="work", filter=keep)
        if home and os.path.isdir(home):
            tar.add(home, arcname="home")
    return buf.getvalue()


def import_local(data: bytes, workdir: str, home: str | None) -> None:
    """Extract an exported tar into ``workdir`` and ``home`` (created when missing).

    Raises:
        SandboxBuildFailed: ``import``: a bad member (nothing written), ``home/`` members
            for a sandbox without a home, or a member the ``data`` filter refuses.
    """
    dest = {"work": workdir, "home": home}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        members = check(tar.getmembers())
        for m in members:
            root, rest = split(m.name)
            target = dest[root]
            if target is None:
                raise SandboxBuildFailed("import", "the tar has home/ but the sandbox has no agent home")
            os.makedirs(target, exist_ok=True)
            if not rest:
                continue
            renamed = m.replace(name=rest, deep=False)
            if m.islnk():
                renamed = renamed.replace(linkname=split(m.linkname)[1], deep=False)
            try:
                tar.extract(renamed, path=target, set_attrs=True, filter="data")
            except tarfile.FilterError as exc:
                raise SandboxBuildFailed("import", f"member {m.name[:200]!r} refused: {exc}") from exc


def retar(sources: Iterable[tuple[Iterator[bytes], str, str]], out: IO[bytes]) -> None:
    """Write one tar to ``out`` from several tar streams, renaming their top directory.

    Args:
        sources: ``(chunks of a tar, the top name in it, the name it gets)``; e.g. the
            engine's archive of ``/workspace`` (members ``workspace/…``) as ``work``.
        out: a binary file to write to.
    """
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as dst:
        for chunks, old, new in sources:
            with tarfile.open(fileobj=_ChunkReader(chunks), mode="r|") as src:
                for m in src:
                    _rename_member(m, _rename(m.name, old, new),
                                   _rename(m.linkname, old, new) if m.islnk() else None)
                    dst.addfile(m, src.extractfile(m) if m.isfile() else None)


def renamed_for_put(data: bytes, names: dict[str, str]) -> bytes:
    """A checked exported tar with ``work``/``home`` renamed (``{"work": "workspace"}``).

    Raises:
        SandboxBuildFailed: ``import`` for a bad member, or a root ``names`` lacks.
    """
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as src, \
            tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as dst:
        for m in check(src.getmembers()):
            root, rest = split(m.name)
            if root not in names:
                raise SandboxBuildFailed("import", f"the tar has {root}/ but the sandbox has no agent home")
            linkname = None
            if m.islnk():
                lroot, lrest = split(m.linkname)
                linkname = posixpath.join(names[lroot], lrest) if lrest else names[lroot]
            _rename_member(m, posixpath.join(names[root], rest) if rest else names[root], linkname)
            dst.addfile(m, src.extractfile(m) if m.isfile() else None)
    return out.getvalue()


def export_docker(api: Any, container_id: str, workdir: str, home: str | None) -> bytes:
    """The tar of a container's ``workdir`` and ``home`` (``get_archive``, Docker SDK ``api``)."""
    sources = [(api.get_archive(container_id, workdir)[0], posixpath.basename(workdir), "work")]
    if home:
        sources.append((api.get_archive(container_id, home)[0], posixpath.basename(home), "home"))
    buf = io.BytesIO()
    retar(sources, buf)
    return buf.getvalue()


def import_docker(api: Any, container_id: str, data: bytes, workdir: str, home: str | None) -> None:
    """Extract an exported tar into a container's ``workdir`` and ``home`` (``put_archive``).

    Raises:
        SandboxBuildFailed: ``import`` for a bad member (nothing extracted).
    """
    names = {"work": workdir.lstrip("/")}
    if home:
        names["home"] = home.lstrip("/")
    api.put_archive(container_id, "/", renamed_for_put(data, names))


def put_file(api: Any, container_id: str, path: str, content: bytes, mode: int) -> None:
    """Write one file into a container (``put_archive`` of a one-member tar at ``/``)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(path.lstrip("/"))
        info.size = len(content)
        info.mode = mode
        info.mtime = int(time.time())
        tar.addfile(info, io.BytesIO(content))
    # Extracted at "/", the engine creates missing parent directories itself.
    api.put_archive(container_id, "/", buf.getvalue())


def put_dir(api: Any, container_id: str, src: str, dest: str) -> None:
    """Copy the host directory ``src`` to ``dest`` in a container."""
    # Spooled to disk beyond 64 MiB so a large workspace does not sit in memory twice.
    with tempfile.SpooledTemporaryFile(max_size=64 << 20) as buf:
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(src, arcname=dest.lstrip("/"))
        buf.seek(0)
        api.put_archive(container_id, "/", buf.read())


def _rename_member(m: tarfile.TarInfo, name: str, linkname: str | None) -> None:
    """Rename a member read from a tar, to be written to another.

    A long name read from a PAX tar is also in ``m.pax_headers`` (``path``, ``linkpath``),
    and ``tarfile`` writes those over the renamed fields ("the pax header has priority"):
    the member would land under its old name. So they go, and are made again as needed.
    """
    m.pax_headers = {k: v for k, v in m.pax_headers.items() if k not in ("path", "linkpath")}
    m.name = name
    if linkname is not None:
        m.linkname = linkname


def _rename(name: str, old: str, new: str) -> str:
    parts = name.split("/", 1)
    if parts[0] != old:
        raise SandboxBuildFailed("export", f"unexpected member {name[:200]!r} in the archive of {old}")
    return new if len(parts) == 1 or not parts[1] else f"{new}/{parts[1]}"


class _ChunkReader(io.RawIOBase):
    """A readable file over an iterator of byte chunks (the engine's archive stream)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: "bytearray | memoryview") -> int:  # type: ignore[override]
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


__all__ = ["ROOTS", "check", "export_docker", "export_local", "import_docker", "import_local", "put_dir", "put_file", "renamed_for_put", "retar", "split"]
