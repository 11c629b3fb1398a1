"""Snapshot manifests: every entry of a workspace tree and where its bytes live.

Pure: no I/O. A snapshot is one manifest object (``snapshots/<digest>``, the sha256 of
its stored bytes) and the pack objects it names (``packs/<digest>``). A pack is file
contents laid end to end, each raw or zlib-compressed on its own, so a snapshot reads
any file of a pack by ``(offset, length)`` and packs are shared by every snapshot that
reuses one of their files.

The stored manifest is zlib-compressed JSON::

    {"v": 1, "parent": <digest> | null,
     "packs": [[<pack digest>, <pack bytes>], ...],
     "entries": [["work/a.py", "f", mode, mtime, size, <sha256>, pack_index, offset, length, z],
                 ["work/src", "d", mode, mtime],
                 ["work/link", "l", "<target>"], ...]}

Entries are sorted by path, each path once; a directory precedes its contents.
"""
from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal

from baton.errors import WorkspaceUnsafe
from baton.workspaces.paths import link_stays_inside, parents, safe_path

Kind = Literal["f", "d", "l"]
VERSION = 1
#: Object name prefixes in the Object Store: ``snapshots/<digest>``, ``packs/<digest>``.
SNAPSHOTS = "snapshots/"
PACKS = "packs/"


@dataclass(frozen=True)
class Stored:
    """Where one file content lives: ``length`` bytes at ``offset`` of pack ``pack``,
    zlib-compressed when ``z``."""

    pack: str
    offset: int
    length: int
    z: bool


@dataclass(frozen=True)
class Entry:
    """One tree entry.

    Attributes:
        path: a safe path (:func:`baton.workspaces.paths.safe_path`).
        kind: ``"f"`` regular file, ``"d"`` directory, ``"l"`` symlink.
        mode: permission bits (``0o7777`` at most).
        mtime: modification time, whole seconds since the epoch.
        size: the file's size in bytes (0 for others).
        digest: sha256 hex of the file's content (``""`` for others).
        stored: where the content lives (files only).
        target: the symlink's target (symlinks only).
    """

    path: str
    kind: Kind
    mode: int = 0o644
    mtime: int = 0
    size: int = 0
    digest: str = ""
    stored: Stored | None = None
    target: str = ""


@dataclass(frozen=True)
class Manifest:
    """A snapshot: its parent's digest, its packs (digest -> stored size) and entries."""

    parent: str | None
    packs: dict[str, int] = field(default_factory=dict)
    entries: tuple[Entry, ...] = ()

    @property
    def files(self) -> int:
        return sum(1 for e in self.entries if e.kind == "f")

    @property
    def bytes_total(self) -> int:
        """Bytes of file content in the tree."""
        return sum(e.size for e in self.entries if e.kind == "f")

    def content_index(self) -> dict[str, Stored]:
        """sha256 of a content -> where it is stored (the dedupe table of a child)."""
        return {e.digest: e.stored for e in self.entries if e.kind == "f" and e.stored is not None}

    def live_bytes(self) -> dict[str, int]:
        """Per pack, the stored bytes this snapshot uses (each content counted once)."""
        seen: dict[tuple[str, int], int] = {}
        for e in self.entries:
            if e.stored is not None:
                seen[(e.stored.pack, e.stored.offset)] = e.stored.length
        live = {p: 0 for p in self.packs}
        for (pack, _), n in seen.items():
            live[pack] = live.get(pack, 0) + n
        return live

    def encode(self) -> bytes:
        """The stored bytes (deterministic: same manifest, same bytes, same digest)."""
        packs = sorted(self.packs)
        index = {p: i for i, p in enumerate(packs)}
        rows: list[list[Any]] = []
        for e in sorted(self.entries, key=lambda x: x.path):
            if e.kind == "f":
                assert e.stored is not None
                rows.append([e.path, "f", e.mode, e.mtime, e.size, e.digest, index[e.stored.pack],
                             e.stored.offset, e.stored.length, int(e.stored.z)])
            elif e.kind == "d":
                rows.append([e.path, "d", e.mode, e.mtime])
            else:
                rows.append([e.path, "l", e.target])
        doc = {"v": VERSION, "parent": self.parent, "packs": [[p, self.packs[p]] for p in packs], "entries": rows}
        # ASCII JSON: a file name that is not UTF-8 (a lone surrogate after the filesystem's
        # surrogateescape decoding) is kept as a \udcXX escape and comes back as the same name.
        return zlib.compress(json.dumps(doc, separators=(",", ":"), ensure_ascii=True).encode("ascii"), 6)


def digest_of(blob: bytes) -> str:
    """The content address of a stored object: sha256 hex."""
    return hashlib.sha256(blob).hexdigest()


def decode(blob: bytes) -> Manifest:
    """Parse and validate stored manifest bytes.

    Raises:
        WorkspaceUnsafe: an entry's path is not safe, repeats, lies under a symlink entry,
            a symlink escapes the tree, or a row is malformed (a tampered or foreign object).
    """
    try:
        doc = json.loads(zlib.decompress(blob))
        if doc.get("v") != VERSION:
            raise ValueError(f"manifest version {doc.get('v')!r}")
        packs_rows = [(str(p), int(n)) for p, n in doc["packs"]]
        names = [p for p, _ in packs_rows]
        entries: list[Entry] = []
        for row in doc["entries"]:
            path, kind = str(row[0]), row[1]
            if kind == "f":
                _, _, mode, mtime, size, digest, pi, off, length, z = row
                if not (0 <= int(pi) < len(names)) or int(off) < 0 or int(length) < 0:
                    raise ValueError(f"bad location in {path!r}")
                entries.append(Entry(path, "f", int(mode) & 0o7777, int(mtime), int(size), str(digest),
                                     Stored(names[int(pi)], int(off), int(length), bool(z))))
            elif kind == "d":
                entries.append(Entry(path, "d", int(row[2]) & 0o7777, int(row[3])))
            elif kind == "l":
                entries.append(Entry(path, "l", target=str(row[2])))
            else:
                raise WorkspaceUnsafe(path, f"unknown entry type {kind!r}")
    except (ValueError, KeyError, TypeError, IndexError, zlib.error) as exc:
        raise WorkspaceUnsafe("<manifest>", f"malformed manifest: {type(exc).__name__}") from exc
    check_tree(entries)
    return Manifest(doc.get("parent"), dict(packs_rows), tuple(entries))


def check_tree(entries: Iterable[Entry]) -> None:
    """Every path safe and once, no entry under a symlink, no symlink escaping.

    Raises:
        WorkspaceUnsafe: naming the first offending path.
    """
    links: set[str] = set()
    seen: set[str] = set()
    ordered = sorted(entries, key=lambda x: x.path)
    for e in ordered:
        if not e.path or safe_path(e.path) != e.path:
            raise WorkspaceUnsafe(e.path, "not a normalized relative path")
        if e.path in seen:
            raise WorkspaceUnsafe(e.path, "the path appears twice")
        seen.add(e.path)
        if e.kind == "l":
            if not link_stays_inside(e.path, e.target):
                raise WorkspaceUnsafe(e.path, "a symlink whose target escapes the tree")
            links.add(e.path)
    for e in ordered:
        if any(p in links for p in parents(e.path)):
            raise WorkspaceUnsafe(e.path, "an entry under a symlink")


def packs_to_rewrite(parent: Manifest | None, *, max_packs: int, min_live: float = 0.25) -> set[str]:
    """The parent's packs whose live contents the child stores again instead of reusing.

    A restore gets every pack a snapshot names once, whole: a pack mostly dead (less than
    ``min_live`` of it used) wastes transfer, and many small packs (one per turn) waste
    round trips. So: every pack under ``min_live``; then, while the parent names more than
    ``max_packs - 1`` packs (the child adds at least one), the ones with the fewest live
    bytes. Rewriting costs at most those live bytes once.
    """
    if parent is None:
        return set()
    live = parent.live_bytes()
    chosen = {p for p, n in live.items() if parent.packs.get(p, 0) > 0 and n < min_live * parent.packs[p]}
    rest = sorted((n, p) for p, n in live.items() if p not in chosen)
    while len(rest) > max(max_packs - 1, 0):
        chosen.add(rest.pop(0)[1])
    return chosen
