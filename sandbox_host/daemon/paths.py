"""Which paths a sandbox daemon serves: inside its roots, never climbing out (pure).

A request names a file either absolutely (it must then lie inside one of the daemon's roots)
or relative to the daemon's working directory. A ``..`` component is refused outright, even
where it would land inside a root again: no request needs one, and refusing it is simpler to
reason about than normalizing it. Symbolic links are the adapter's to resolve
(:func:`confine` is given the resolved path to check again).
"""
from __future__ import annotations

import posixpath
from typing import Sequence


class PathRefused(ValueError):
    """A path the daemon will not touch.

    Attributes:
        path: the path as asked (cut to 200 characters).
        outside: ``True`` when it lies outside every root (else it is malformed: ``..``,
            NUL, empty).
    """

    def __init__(self, path: str, reason: str, *, outside: bool) -> None:
        self.path = path[:200]
        self.outside = outside
        super().__init__(f"path {self.path!r} {reason}")


def normalize_roots(roots: Sequence[str]) -> tuple[str, ...]:
    """The roots as absolute normalized paths, in order.

    Raises:
        ValueError: no root, or a root that is not absolute.
    """
    if not roots:
        raise ValueError("a sandbox daemon needs at least one root")
    out = []
    for r in roots:
        if not r.startswith("/"):
            raise ValueError(f"root {r!r} is not an absolute path")
        out.append(posixpath.normpath(r))
    return tuple(out)


def within(path: str, roots: Sequence[str]) -> bool:
    """Whether the absolute normalized ``path`` is one of ``roots`` or lies under one."""
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def confine(path: str, roots: Sequence[str], workdir: str) -> str:
    """The absolute path a request means, checked against the roots.

    Args:
        path: absolute, or relative to ``workdir``.
        roots: absolute normalized roots (:func:`normalize_roots`).
        workdir: absolute; relative paths are taken from here.

    Returns:
        The absolute normalized path.

    Raises:
        PathRefused: empty, holding NUL, a ``..`` component (``outside=False``), or outside
            every root (``outside=True``).
    """
    if not path or "\x00" in path:
        raise PathRefused(path, "is empty or holds NUL", outside=False)
    if ".." in path.split("/"):
        raise PathRefused(path, "climbs out with '..'", outside=False)
    full = posixpath.normpath(path if path.startswith("/") else posixpath.join(workdir, path))
    if not within(full, roots):
        raise PathRefused(path, "is outside the sandbox's roots", outside=True)
    return full


__all__ = ["PathRefused", "confine", "normalize_roots", "within"]
