"""Workspace paths: which member names are safe, which symlinks stay inside, what is excluded.

Pure: no I/O. A workspace path is relative, ``/``-separated, normalized (no ``.``, no
empty component), never absolute and never with a ``..`` component; the tree's root is
the snapshot's root (its top-level directories are ``work/`` and ``home/``).
"""
from __future__ import annotations

import fnmatch
import posixpath
import re
from dataclasses import dataclass
from typing import Iterable

from baton.errors import WorkspaceUnsafe


def safe_path(name: str) -> str:
    """The normalized form of a tar member name, or raise.

    ``./work/a`` and ``work//a/`` become ``work/a``. A name that normalizes to the root
    itself (``.``, ``./``) returns ``""`` (callers skip it).

    Raises:
        WorkspaceUnsafe: an absolute name, a ``..`` component, or a NUL byte.
    """
    if "\x00" in name:
        raise WorkspaceUnsafe(name, "a NUL byte in the name")
    if name.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", name):
        raise WorkspaceUnsafe(name, "an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise WorkspaceUnsafe(name, "a '..' component")
    return "/".join(parts)


def link_stays_inside(path: str, target: str) -> bool:
    """Whether a symlink at ``path`` (a safe path) pointing at ``target`` resolves inside the
    tree, judged lexically (the tree's other symlinks are not followed: a chain of
    inside-pointing links stays inside).

    An absolute target, or one whose ``..`` climbs above its root, escapes. The roots are a
    tree's top directories (``work/``, ``home/``): each is restored into its own place (the
    working directory, the agent's home), so a link from one into the other, or to the
    tree's top, would point outside the directory it is restored into.
    """
    if not target or target.startswith("/") or "\x00" in target:
        return False
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if joined == ".." or joined.startswith("../") or joined.startswith("/"):
        return False
    top = path.split("/", 1)[0]
    return "/" not in path or joined == top or joined.startswith(top + "/")


def parents(path: str) -> Iterable[str]:
    """The proper ancestors of ``path``, nearest first: ``a/b/c`` -> ``a/b``, ``a``."""
    while "/" in path:
        path = path.rsplit("/", 1)[0]
        yield path


@dataclass(frozen=True)
class Excludes:
    """Glob patterns of paths never snapshotted (``BATON_WORKSPACE_EXCLUDES``).

    A pattern with a ``/`` matches a path from the root (``home/.codex/auth.json``,
    ``work/*.log``); one without matches any single component (``node_modules``,
    ``*.pyc``), like a ``.gitignore`` line. A pattern matching a directory excludes
    everything under it. ``*`` and ``?`` are :mod:`fnmatch`'s and may cross ``/`` in a
    rooted pattern.
    """

    patterns: tuple[str, ...] = ()

    @classmethod
    def parse(cls, raw: str) -> "Excludes":
        """Comma-separated patterns; blanks and surrounding spaces and slashes dropped."""
        return cls(tuple(p.strip().strip("/") for p in raw.split(",") if p.strip().strip("/")))

    def excluded(self, path: str) -> bool:
        """Whether ``path`` (a safe path) or one of its ancestors matches a pattern."""
        if not self.patterns:
            return False
        candidates = [path, *parents(path)]
        components = path.split("/")
        for pattern in self.patterns:
            if "/" in pattern:
                if any(fnmatch.fnmatchcase(c, pattern) for c in candidates):
                    return True
            elif any(fnmatch.fnmatchcase(c, pattern) for c in components):
                return True
        return False
