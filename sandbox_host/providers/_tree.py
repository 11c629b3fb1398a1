"""A sandbox's tree as one tar: its working directory (``work/``) and agent home (``home/``).

``export_tree`` of a provider writes an uncompressed tar whose members are relative:
``work``, ``work/…``, ``home``, ``home/…`` (``home`` only when the sandbox has one), in a
stable order (directories walked sorted), so the same tree gives the same members.
``import_tree`` extracts such a tar, refusing it whole before anything is written when a
member is absolute, climbs out (``..``), or lies outside ``work`` and ``home``; links may
not point out of their root either (``tarfile``'s ``data`` filter).

Every provider's trees are made and extracted by the sandbox's daemon (``ExportTree``,
``ImportTree``: :mod:`sandbox_host.daemon`), with these functions, inside the sandbox.
Blocking functions: called in a worker thread.
"""
from __future__ import annotations

import io
import os
import posixpath
import tarfile
import time
from typing import Iterable

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


def workspace_tar(src: str | None, home: bool) -> bytes:
    """A new sandbox's tree as :func:`import_local` takes it: the host directory ``src`` (a
    workspace built on the host) as ``work/…`` (an empty ``work/`` without one) and, for a
    thread, ``home/.codex/``. Blocking (reads the tree): call it in a thread."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add_dir(name: str) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
            tar.addfile(info)
        if src is None:
            add_dir("work")
        else:
            tar.add(src, arcname="work", recursive=True)
        if home:
            add_dir("home")
            add_dir("home/.codex")
    return buf.getvalue()


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


__all__ = ["ROOTS", "check", "export_local", "import_local", "renamed_for_put", "split", "workspace_tar"]
