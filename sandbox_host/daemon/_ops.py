"""A sandbox's files and processes as plain calls: what the daemon's gRPC service does, without
the gRPC.

Two callers use these operations: the daemon's service (:mod:`sandbox_host.daemon._service`,
which maps their errors to status codes once), and a host on a local sandbox's own machine
(:mod:`sandbox_host.providers._on_machine`, ``BATON_LOCAL_SANDBOX_IO=direct``), which would
otherwise start a daemon process for the very calls it can make itself. One implementation,
so both ways confine paths, build the agent's environment and redact secrets alike.

Errors are Python's own:

- :class:`~sandbox_host.daemon.paths.PathRefused` (a ``ValueError``): a path outside the
  roots (``outside``) or malformed;
- ``ValueError``: a bad argument (an empty command, a negative bound, not an inbox, an input
  that is not one line);
- ``FileNotFoundError``: a missing file, inbox or working directory;
- :class:`~sandbox_host.daemon._procs.LaunchFailed` or ``OSError``: a launch or command that
  could not start;
- :class:`~baton.errors.SandboxBuildFailed` (``import``): a bad member of an imported tree.
"""
from __future__ import annotations

import asyncio
import os
import posixpath
import shutil
import tarfile
from typing import Mapping, Sequence

from baton.errors import SandboxBuildFailed
from sandbox_host.daemon import _exec, _procs
from sandbox_host.daemon._files import write_whole
from sandbox_host.daemon.paths import confine, normalize_roots
from sandbox_host.providers import _tree


class SandboxOps:
    """The operations over one sandbox's roots.

    Args:
        roots: absolute directories (or files) every path must lie in.
        workdir: relative paths are taken from here (default: the first root); the agent's
            default working directory.
        state_dir: the wrapper, nonce files, prompts, inboxes and the pgid record (default
            ``<first root>/.baton``).
        base_env: the environment the agent's and commands' environments start from, less
            the daemon's own credentials (:func:`sandbox_host.daemon._procs.agent_env`);
            default this process's.
    """

    def __init__(self, roots: Sequence[str], workdir: str | None = None, state_dir: str | None = None,
                 base_env: Mapping[str, str] | None = None) -> None:
        self.roots = normalize_roots(roots)
        self.workdir = os.path.normpath(workdir) if workdir else self.roots[0]
        self.state_dir = state_dir or os.path.join(self.roots[0], ".baton")
        self._base_env = base_env

    @property
    def base_env(self) -> Mapping[str, str]:
        return os.environ if self._base_env is None else self._base_env

    def path(self, path: str) -> str:
        """The absolute path ``path`` means (relative ones from the working directory).

        Raises:
            PathRefused: malformed, or outside the roots, also once its links are resolved
                (a link inside a root may point out of it).
        """
        full = confine(path, self.roots, self.workdir)
        real = os.path.realpath(full)
        if real != full:
            confine(real, tuple(os.path.realpath(r) for r in self.roots), self.workdir)
        return full

    async def copy_in(self, path: str, content: bytes, mode: int = 0o644) -> None:
        """Write ``content`` to ``path`` whole (a temporary name, then a rename).

        Raises:
            PathRefused, OSError.
        """
        await asyncio.to_thread(write_whole, self.path(path), content, mode or 0o644)

    async def launch(self, argv: Sequence[str], *, nonce: str, journal_path: str, stderr_path: str,
                     stdin: bytes | None = None, env: Mapping[str, str] | None = None,
                     secrets: Mapping[str, str] | None = None, interactive: bool = False,
                     home: str = "", workdir: str = "") -> tuple[int, str]:
        """Start ``argv`` under the wrapper in a new session (:func:`sandbox_host.daemon._procs.launch`):
        ``(pgid, inbox path or "")``.

        Raises:
            ValueError: ``argv`` is empty.
            PathRefused: the journal, stderr, working directory or home lies outside the roots.
            LaunchFailed, OSError: the launch failed (the message may hold no secret: the
                caller redacts it).
        """
        if not argv:
            raise ValueError("argv must not be empty")
        spec = _procs.LaunchSpec(
            argv=list(argv), nonce=nonce, journal_path=self.path(journal_path), stderr_path=self.path(stderr_path),
            # Absolute, as for exec: a handle's home is relative to the sandbox's root (the
            # kubernetes provider's is "home"), and HOME=home would be taken from the agent's
            # working directory by every program that reads it.
            workdir=self.path(workdir) if workdir else self.workdir, stdin=stdin, env=dict(env or {}),
            secrets=dict(secrets or {}), interactive=interactive, home=self.path(home) if home else "")
        return await _procs.launch(self.state_dir, spec, base_env=self.base_env)

    async def send_input(self, inbox: str, line: bytes) -> None:
        """Append ``line`` to one of this sandbox's inboxes in one ``O_APPEND`` write.

        Raises:
            ValueError: ``inbox`` is no inbox of this sandbox's state directory, or ``line``
                is not one line ending with a newline.
            FileNotFoundError: no such inbox.
            PermissionError: a symbolic link or not a regular file at the inbox's path.
        """
        norm = posixpath.normpath(inbox)
        if (posixpath.dirname(norm) != posixpath.normpath(self.state_dir)
                or not posixpath.basename(norm).startswith("inbox-")):
            raise ValueError(f"{inbox[:200]!r} is not an inbox")
        if not line.endswith(b"\n") or b"\n" in line[:-1]:
            raise ValueError("an input is one line ending with a newline")
        await asyncio.to_thread(_procs.append_line, norm, line)

    def pgid(self, pgid: int | None) -> int | None:
        """``pgid``, else the group the last launch recorded."""
        return pgid or _procs.recorded_pgid(self.state_dir)

    async def kill(self, pgid: int | None, signal: int) -> bool:
        """Signal the group (``None``/0: the one recorded); whether it was signalled
        (``signal`` 0: whether it has a live member)."""
        return await asyncio.to_thread(_procs.signal_group, self.pgid(pgid), signal)

    async def exec(self, argv: Sequence[str], *, timeout: float, workdir: str = "",  # noqa: ASYNC109 -- the command's own bound
                   env: Mapping[str, str] | None = None, secrets: Mapping[str, str] | None = None,
                   home: str = "", output_limit: int = 0) -> _exec.ExecResult:
        """Run ``argv`` to its end (:func:`sandbox_host.daemon._exec.run`): its exit and the
        redacted tail of its output (at most ``output_limit`` bytes, 0: the default, capped
        at :data:`~sandbox_host.daemon._exec.MAX_LIMIT`; ``timeout`` 0: the longest).

        Raises:
            ValueError: ``argv`` is empty, or a bound is negative.
            PathRefused: the working directory or home lies outside the roots.
            OSError: the command did not start (the caller redacts the message).
        """
        if not argv:
            raise ValueError("argv must not be empty")
        if timeout < 0 or output_limit < 0:
            raise ValueError("timeout_seconds and output_limit must not be negative")
        cwd = self.path(workdir) if workdir else self.workdir
        home_dir = self.path(home) if home else ""
        secrets = dict(secrets or {})
        limit = min(output_limit or _exec.DEFAULT_LIMIT, _exec.MAX_LIMIT)
        full_env = _procs.agent_env(self.base_env, _procs.LaunchSpec(
            argv=(), nonce="", journal_path="", stderr_path="", workdir=cwd, env=dict(env or {}),
            secrets=secrets, home=home_dir))
        # A secret cut by the tail's start would survive its redaction: a margin is kept.
        margin = max((len(v) for v in secrets.values()), default=0)
        got = await _exec.run(list(argv), cwd=cwd, env=full_env,
                              timeout=min(timeout or _exec.MAX_TIMEOUT, _exec.MAX_TIMEOUT), limit=limit + margin)
        text = _exec.redacted_tail(got.output, secrets, cut=got.output_bytes > len(got.output), limit=limit)
        return _exec.ExecResult(got.exit_code, got.timed_out, text, got.output_bytes)

    def _tree_dirs(self, workdir: str, home: str) -> tuple[str, str | None]:
        return (self.path(workdir) if workdir else self.workdir), (self.path(home) if home else None)

    async def export_tree(self, workdir: str = "", home: str = "") -> bytes:
        """The tar of ``workdir`` (``work/``) and ``home`` (``home/``) (:func:`sandbox_host.providers._tree.export_local`),
        the state directory left out where it lies inside the working directory.

        Raises:
            PathRefused; FileNotFoundError: no such working directory; OSError: unreadable.
        """
        top, home_dir = self._tree_dirs(workdir, home)
        inside = os.path.commonpath([top, self.state_dir]) == top
        return await asyncio.to_thread(_tree.export_local, top, home_dir, self.state_dir if inside else None)

    async def import_tree(self, data: bytes, *, workdir: str = "", home: str = "", replace: bool = False) -> None:
        """Extract an exported tar into ``workdir`` and ``home``, checked whole before anything
        is emptied (``replace``: both emptied first, the state directory kept) or written.

        Raises:
            PathRefused; SandboxBuildFailed: ``import`` for a bad member, or no tar at all
            (nothing written).
        """
        top, home_dir = self._tree_dirs(workdir, home)
        try:
            await asyncio.to_thread(_tree.renamed_for_put, data, {"work": "w", **({"home": "h"} if home_dir else {})})
        except tarfile.TarError as exc:
            raise SandboxBuildFailed("import", f"not a tar: {exc}"[:300]) from None
        if replace:
            await asyncio.to_thread(_empty, top, home_dir, self.state_dir)
        await asyncio.to_thread(_tree.import_local, data, top, home_dir)


def _empty(workdir: str, home: str | None, keep: str) -> None:
    """Empty both directories, keeping ``keep`` (the daemon's state) where it lies in one."""
    for top in (workdir, home):
        if not top or not os.path.isdir(top):
            continue
        for name in os.listdir(top):
            path = os.path.join(top, name)
            if path == keep:
                continue
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)


__all__ = ["SandboxOps"]
