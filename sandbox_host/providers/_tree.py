"""A sandbox's tree as one tar: its working directory (``work/``) and agent home (``home/``).

``export_tree`` of a provider writes an uncompressed tar whose members are relative:
``work``, ``work/…``, ``home``, ``home/…`` (``home`` only when the sandbox has one), in a
stable order (directories walked sorted), so the same tree gives the same members.
``import_tree`` extracts such a tar, refusing it whole before anything is written when a
member is absolute, climbs out (``..``), or lies outside ``work`` and ``home``; links may
not point out of their root either (``tarfile``'s ``data`` filter, or the same checks where
the sandbox's Python lacks it).

Every provider's trees are made and extracted by the sandbox's daemon (``ExportTree``,
``ImportTree``: :mod:`sandbox_host.daemon`), with these functions, inside the sandbox.
Blocking functions: called in a worker thread.
"""
from __future__ import annotations

import copy
import io
import os
import posixpath
import stat
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


#: Whether this Python has tarfile's extraction filters (3.12, and 3.11.4 onwards): a sandbox
#: image's may not (Debian bookworm's 3.11.2), and then :func:`_checked` does their work.
HAS_FILTERS = hasattr(tarfile, "data_filter")


def import_local(data: bytes, workdir: str, home: str | None, *, filters: bool = HAS_FILTERS) -> None:
    """Extract an exported tar into ``workdir`` and ``home`` (created when missing).

    Args:
        data: the tar.
        workdir: where ``work/`` goes.
        home: where ``home/`` goes (``None``: the tar may have none).
        filters: use tarfile's ``data`` filter (else :func:`_checked`: the same refusals,
            for a Python without it).

    Raises:
        SandboxBuildFailed: ``import``: a bad member (nothing written), ``home/`` members
            for a sandbox without a home, or a member the ``data`` filter refuses (a link,
            or a path through a link, out of its root).
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
            linkname = split(m.linkname)[1] if m.islnk() else None
            if not filters:
                checked = _checked(m, rest, linkname, target)
                if HAS_FILTERS:  # a test of the fallback on a Python with filters
                    tar.extract(checked, path=target, set_attrs=True, filter="fully_trusted")
                else:
                    tar.extract(checked, path=target, set_attrs=True)
                continue
            renamed = m.replace(name=rest, deep=False)
            if linkname is not None:
                renamed = renamed.replace(linkname=linkname, deep=False)
            try:
                tar.extract(renamed, path=target, set_attrs=True, filter="data")
            except tarfile.FilterError as exc:
                raise SandboxBuildFailed("import", f"member {m.name[:200]!r} refused: {exc}") from exc


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _checked(m: tarfile.TarInfo, rest: str, linkname: str | None, target: str) -> tarfile.TarInfo:
    """A copy of member ``m`` renamed to ``rest`` (a hard link's target to ``linkname``) for
    extraction under ``target``, with what tarfile's ``data`` filter does (Python docs,
    "Extraction filters"): refused when its path resolves (through links already extracted)
    out of ``target``, or when it is a symbolic link to an absolute path or out of
    ``target``; high mode bits and group/other write cleared, owner read/write set on files;
    the owner is the extracting user's.

    Raises:
        SandboxBuildFailed: ``import``, refused.
    """
    root = os.path.realpath(target)
    path = os.path.join(root, rest)
    if not _inside(os.path.realpath(os.path.dirname(path)), root) or (
            not m.issym() and not _inside(os.path.realpath(path), root)):
        raise SandboxBuildFailed("import", f"member {m.name[:200]!r} refused: its path leads out of the tree")
    if m.issym() and (m.linkname.startswith("/") or not _inside(
            os.path.normpath(os.path.join(os.path.realpath(os.path.dirname(path)), m.linkname)), root)):
        raise SandboxBuildFailed("import", f"member {m.name[:200]!r} refused: it links out of the tree")
    if linkname is not None and not _inside(os.path.realpath(os.path.join(root, linkname)), root):
        raise SandboxBuildFailed("import", f"member {m.name[:200]!r} refused: it links out of the tree")
    c = copy.copy(m)
    c.name = rest
    if linkname is not None:
        c.linkname = linkname
    c.mode = m.mode & 0o755
    if m.isreg() or m.islnk():
        c.mode |= stat.S_IRUSR | stat.S_IWUSR
        if not c.mode & stat.S_IXUSR:
            c.mode &= ~(stat.S_IXGRP | stat.S_IXOTH)
    c.uid, c.gid, c.uname, c.gname = os.getuid(), os.getgid(), "", ""
    return c


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
