"""A local sandbox's I/O made by the host on the sandbox's machine, without its daemon
(``BATON_LOCAL_SANDBOX_IO=direct``, the default).

:class:`OnMachine` has the calls of :class:`~sandbox_host.providers._daemon_client.DaemonClient`
that the local provider makes, with the same results and the same errors, and makes them with
the daemon's own operations (:class:`sandbox_host.daemon._ops.SandboxOps`) over the roots the
sandbox's daemon would serve (:func:`~sandbox_host.providers._local_daemon.daemon_roots`).
A local sandbox's daemon listens on
loopback and is found in the sandbox's directory, so only a host on its machine reaches it,
as the same user, seeing the very files and processes the daemon would touch: through it, a
start cost a daemon process's start (on a burst of 200 starts on 2 cores, 1 s p50 before the
agent could launch), a gRPC call per file and a process per sandbox
(``bench/results/README.md``, "A local sandbox without its daemon").
"""
from __future__ import annotations

import contextlib
import os
from typing import AsyncGenerator, Mapping, Sequence

from baton.errors import SandboxBuildFailed
from sandbox_host.daemon import _procs
from sandbox_host.daemon._files import follow_file, size_at_least
from sandbox_host.daemon._ops import SandboxOps
from sandbox_host.daemon._wire import Chunk
from sandbox_host.daemon.paths import PathRefused
from sandbox_host.providers._base import SandboxHandle
from sandbox_host.providers._inotify import FileWatcher
from sandbox_host.providers._local_daemon import daemon_roots, meta_dir
from sandbox_host.providers._redact import redact


def _refused(exc: PathRefused) -> Exception:
    """A refused path as the daemon's client raises it: outside the roots ``PermissionError``,
    malformed ``ValueError``."""
    return PermissionError(str(exc)) if exc.outside else ValueError(str(exc))


class OnMachine:
    """The I/O of one local sandbox, made here (see the module docstring); setup commands
    are not among it (they run through the daemon: :class:`sandbox_host.providers.local.LocalProvider`).

    Args:
        handle: the sandbox.
        base_env: the environment the agent's and setup commands' start from (the one its
            daemon would have).
        watcher: the inotify instance follows wait on.
        idle_check: seconds a follow waits for a wake-up before it looks anyway.
    """

    def __init__(self, handle: SandboxHandle, base_env: Mapping[str, str], watcher: FileWatcher,
                 idle_check: float) -> None:
        self._ops = SandboxOps(daemon_roots(handle), handle.workdir, meta_dir(handle), base_env)
        self._watcher = watcher
        self._idle_check = idle_check

    def _path(self, path: str) -> str:
        try:
            return self._ops.path(path)
        except PathRefused as exc:
            raise _refused(exc) from None

    async def follow(self, path: str, offset: int) -> AsyncGenerator[Chunk, None]:
        """Yield the file's bytes from ``offset`` as they are written, each chunk with the
        file's size just after its read; the file's descriptor and watch go with the
        generator's close.

        Raises:
            FileNotFoundError: the file does not exist, or was deleted (after its last bytes).
            PermissionError: outside the sandbox's roots, or not a regular file.
            OSError: a malformed path, a negative offset, a directory (as the daemon's
                client says its refusal).
        """
        try:
            full = self._ops.path(path)
            if offset < 0:
                raise ValueError("offset and limit must not be negative")
        except PathRefused as exc:
            if exc.outside:
                raise PermissionError(str(exc)) from None
            raise OSError(f"following {path} failed: {exc}") from None
        except ValueError as exc:
            raise OSError(f"following {path} failed: {exc}") from None
        pos = offset
        try:
            async with contextlib.aclosing(follow_file(full, offset, self._watcher, self._idle_check)) as pieces:
                async for data in pieces:
                    pos += len(data)
                    yield Chunk(data, pos - len(data), size_at_least(full, pos))
        except IsADirectoryError:
            raise OSError(f"following {path} failed: {path[:200]} is a directory") from None

    async def read_file(self, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        """Bytes of a file from ``offset`` (at most ``limit``).

        Raises:
            FileNotFoundError, PermissionError, ValueError (as :meth:`follow`; also a
            negative ``limit``).
        """
        full = self._path(path)
        if offset < 0 or (limit or 0) < 0:
            raise ValueError("offset and limit must not be negative")
        if limit == 0:
            return b""
        gen = follow_file(full, offset, self._watcher, self._idle_check, follow=False, limit=limit or 0)
        try:
            return b"".join([data async for data in gen])
        except IsADirectoryError:
            raise ValueError(f"{path[:200]} is a directory") from None
        finally:
            await gen.aclose()

    async def file_size(self, path: str) -> int | None:
        """Size in bytes, ``None`` when the file does not exist."""
        full = self._path(path)
        try:
            return os.stat(full).st_size
        except (FileNotFoundError, NotADirectoryError):
            return None

    async def copy_in(self, path: str, content: bytes, mode: int = 0o644) -> None:
        """Write ``content`` to ``path`` whole.

        Raises:
            PermissionError, ValueError: a refused path; OSError: the write failed.
        """
        try:
            await self._ops.copy_in(path, content, mode)
        except PathRefused as exc:
            raise _refused(exc) from None

    async def launch(self, argv: Sequence[str], *, nonce: str, journal_path: str, stderr_path: str,
                     stdin: bytes | None = None, env: Mapping[str, str] | None = None,
                     secrets: Mapping[str, str] | None = None, interactive: bool = False,
                     home: str = "", workdir: str = "") -> tuple[int, str]:
        """Start ``argv`` under the wrapper: ``(pgid, inbox or "")``.

        Raises:
            SandboxBuildFailed: ``launch`` (detail redacted).
        """
        try:
            return await self._ops.launch(argv, nonce=nonce, journal_path=journal_path, stderr_path=stderr_path,
                                          stdin=stdin, env=env, secrets=secrets, interactive=interactive,
                                          home=home, workdir=workdir)
        except (_procs.LaunchFailed, OSError, ValueError) as exc:
            raise SandboxBuildFailed("launch", redact(f"launch failed: {exc}", secrets or {})) from None

    async def send_input(self, inbox: str, line: bytes) -> None:
        """Append ``line`` to the inbox.

        Raises:
            ValueError: not an inbox of this sandbox, or not one line; PermissionError: a link
            or not a regular file there; OSError: not delivered.
        """
        try:
            await self._ops.send_input(inbox, line)
        except FileNotFoundError:
            raise OSError(f"input not delivered: {inbox[:200]}: no such inbox") from None

    async def kill(self, pgid: int | None, signal: int) -> bool:
        """Signal the process group (``None``: the one the launch recorded)."""
        return await self._ops.kill(pgid, signal)

    async def export_tree(self, workdir: str = "", home: str = "") -> bytes:
        """The tar of ``workdir`` (``work/``) and ``home`` (``home/``).

        Raises:
            FileNotFoundError: no such working directory; OSError: the tree cannot be read;
            PermissionError, ValueError: a refused path.
        """
        try:
            return await self._ops.export_tree(workdir, home)
        except PathRefused as exc:
            raise _refused(exc) from None
        except FileNotFoundError:
            raise FileNotFoundError(f"{workdir[:200]}: no such directory") from None

    async def import_tree(self, tar: bytes, *, workdir: str = "", home: str = "", replace: bool = False) -> None:
        """Extract an exported tar.

        Raises:
            SandboxBuildFailed: ``import``: a bad member (nothing written), or a malformed path;
            PermissionError: a path outside the roots.
        """
        try:
            await self._ops.import_tree(tar, workdir=workdir, home=home, replace=replace)
        except PathRefused as exc:
            if exc.outside:
                raise PermissionError(str(exc)) from None
            raise SandboxBuildFailed("import", str(exc)) from None


__all__ = ["OnMachine"]
