"""The ``local`` provider: a directory plus a detached process group (docs/design.md §5.1).

A sandbox is ``<base_dir>/<file stem of the key>/`` holding ``workspace/`` (the agent's
working directory) and ``.baton/`` (the wrapper script, the one-shot nonce file, the
prompt). The journal and its stderr file live in ``<journal_dir>`` named after the key
(:func:`sandbox_host.journal.journal_path`). The agent runs under the launch wrapper in its
own session (``setsid``) whose parent exits at once, so the agent is nobody's child: it
survives the host process (even SIGKILL) and any host on the machine can follow, signal or
destroy it from the handle (``data = {"dir", "pgid"}``, and ``"daemon"`` when reached through it).

``BATON_LOCAL_SANDBOX_IO`` says how a host reaches a local sandbox's files and processes:

- ``direct`` (the default): the host makes every call itself, on the machine, with the
  daemon's own operations over the same roots (:mod:`._on_machine`), but for setup commands
  (below); no daemon runs for a sandbox without any. Only a
  host on the sandbox's machine can reach a local sandbox's daemon (it listens on loopback and
  is found in the sandbox's directory), and that host sees the very files and processes the
  daemon would touch, as the same user. Through the daemon, each journal line was an inotify
  wake-up, a read and a gRPC message on both sides, each start waited for a daemon process to
  start, and every sandbox kept a process (``bench/results/README.md``, "Local journals read on
  the machine" and "A local sandbox without its daemon"). The journal and stderr file are
  never read through a symbolic link here. A setup command runs through the daemon both
  ways: it is a child of whoever runs it, and its ``/proc/$PPID/environ`` must not be the
  host's (the agent is nobody's child either way).
- ``daemon``: every copy, launch, input, signal, setup command, tree and read goes through the
  sandbox's daemon (:mod:`sandbox_host.daemon`, started on demand and detached like the agent:
  :mod:`._local_daemon`), as for the docker and kubernetes providers, whose sandboxes a host
  reaches only so; the sandbox CA's certificates (``BATON_SANDBOX_CA_*``) are served then.
This module creates and destroys sandboxes on this machine: their directories, the workspace
built in place (a clone or a copy), thread directories, their snapshot markers (the machine's
note beside a thread's ``work/`` and ``home/``, not in the sandbox) and the sweep of idle ones.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import shutil
import signal as _signal
import stat as _stat
from typing import Any, AsyncIterator, Mapping, Sequence

from baton.errors import SandboxBuildFailed
from baton.ids import file_stem
from sandbox_host import journal as _journal
from sandbox_host.daemon import _procs
from sandbox_host.daemon._files import follow_file, size_at_least
from sandbox_host.providers._base import Chunk, Provider, SandboxHandle, SandboxSpec, check_input
from sandbox_host.providers._daemon_client import DaemonClient
from sandbox_host.providers._inotify import FileWatcher
from sandbox_host.providers._local_daemon import START_TIMEOUT, LocalDaemons
from sandbox_host.providers._on_machine import OnMachine
from sandbox_host.providers import _sandbox_tls
from sandbox_host.providers import _workspace as _ws
from sandbox_host.providers._redact import redact

# Host variables the agent's environment inherits; everything else (the host's own
# credentials included) stays out of its environment. Sandbox env and secrets are added on
# top. This is not isolation: the agent runs as the host's user and can read what it can
# (/proc, files); docs/overview.md says so, and the docker provider is the isolated one.
_INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME", "SHELL", "TZ")
_PROXY_ENV = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy")
#: ``BATON_LOCAL_SANDBOX_IO``: how a host reaches a local sandbox (see the module docstring).
SANDBOX_IO = ("direct", "daemon")


def group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is in process group ``pgid`` (see
    :func:`sandbox_host.daemon._procs.group_alive`)."""
    return _procs.group_alive(pgid)


def _signal_group(pgid: int | None, signal: int) -> bool:
    return _procs.signal_group(pgid, signal)


def sandbox_io_setting(value: str | None = None) -> str:
    """``value``, else ``BATON_LOCAL_SANDBOX_IO``, checked: ``"direct"`` or ``"daemon"``.

    Raises:
        ValueError: anything else (named, cut to 40 characters).
    """
    from baton import config

    way = config.get("BATON_LOCAL_SANDBOX_IO") if value is None else value
    if way not in SANDBOX_IO:
        raise ValueError(f"BATON_LOCAL_SANDBOX_IO must be one of {', '.join(SANDBOX_IO)}, not {way[:40]!r}")
    return way


class LocalProvider(Provider):
    """Sandboxes as local directories with detached process groups.

    Args:
        base_dir: where sandboxes are created (default ``BATON_SANDBOX_DIR``).
        journal_dir: where journals live (default ``BATON_JOURNAL_DIR``).
        idle_check: seconds a follow waits for an inotify wake-up before it re-checks the
            file anyway (also the poll interval where inotify is unavailable).
        sandbox_io: ``"direct"`` (every call made here, on the machine) or ``"daemon"``
            (through the sandbox's daemon); default ``BATON_LOCAL_SANDBOX_IO``.

    Raises:
        ValueError: ``sandbox_io`` is neither.
    """

    name = "local"
    killable_processes = True
    can_follow = True

    def __init__(
        self,
        base_dir: str | None = None,
        journal_dir: str | None = None,
        *,
        idle_check: float = 0.25,
        sandbox_io: str | None = None,
    ) -> None:
        from baton import config

        self.sandbox_io = sandbox_io_setting(sandbox_io)
        # One inotify instance for the journals this provider follows on the machine.
        self._watcher = FileWatcher()

        self.base_dir = base_dir or config.get("BATON_SANDBOX_DIR")
        self.journal_dir = journal_dir or config.get("BATON_JOURNAL_DIR")
        self.idle_check = idle_check
        # With sandbox_io "daemon", a sandbox's files and processes are reached through its daemon.
        self._daemons = LocalDaemons(self._env(None, None), idle_check=idle_check)
        self._base_env = self._env(None, None)

    # --- building -------------------------------------------------------------------------

    async def create(self, key: str, spec: SandboxSpec) -> SandboxHandle:
        """Create the directory, fill the workspace, run the setup commands in order.

        With ``spec.thread_dir`` the working directory and agent home are the thread's
        (:meth:`thread_paths`); an existing working directory is kept as it is (the thread's
        earlier turns built it), so neither the workspace nor the setup runs again.

        Raises:
            SandboxBuildFailed: ``step`` is ``"create"`` (the sandbox already exists),
                ``"workspace"`` (copy or git clone/checkout failed, over the size limit, or
                out of time), ``"daemon"`` (the sandbox's daemon the setup commands run
                through did not start) or ``"setup[i]"`` (the i-th setup command exited non-zero or
                ran out of time); ``detail`` is the redacted reason.
        """
        base = spec.base_dir or self.base_dir
        root = os.path.join(base, file_stem(key))
        workdir, home = os.path.join(root, "workspace"), None
        if spec.thread_dir is not None:
            workdir, home = self.thread_paths(spec.thread_dir, base)
        os.makedirs(base, exist_ok=True)
        os.makedirs(self.journal_dir, exist_ok=True)
        try:
            os.mkdir(root)
        except FileExistsError:
            raise SandboxBuildFailed("create", f"sandbox {file_stem(key)} already exists") from None
        os.mkdir(os.path.join(root, ".baton"), 0o700)
        handle = SandboxHandle(
            provider=self.name,
            key=key,
            journal_path=_journal.journal_path(self.journal_dir, key),
            stderr_path=_journal.stderr_path(self.journal_dir, key),
            workdir=workdir,
            data={"dir": root, "pgid": None, **({"home": home} if home else {})},
        )
        if spec.thread_dir is not None and spec.rebuild_thread_dir:
            await self.remove_thread_dir(spec.thread_dir)
        fresh = not os.path.isdir(workdir)  # noqa: ASYNC240 -- one stat
        steps = _ws.BuildSteps()
        try:
            if home is not None:
                os.makedirs(os.path.join(home, ".codex"), exist_ok=True)
            if fresh:
                if spec.setup:
                    # Setup commands run through the sandbox's daemon both ways: a command's
                    # parent is whoever runs it, and /proc/$PPID/environ would be the host's
                    # (its credentials) where the daemon's holds none of them. The daemon
                    # starts outside the build's budget (as a container's does): the budget
                    # is the build's own.
                    try:
                        await self._daemons.client(handle).wait_serving(START_TIMEOUT)
                    except OSError as exc:
                        raise SandboxBuildFailed("daemon", str(exc)) from None
                async with _ws.build_budget(spec.build_timeout, steps):
                    await self._workspace(spec, workdir)
                    if spec.setup:
                        await _ws.run_setup(self._daemons.client(handle), spec, steps, workdir=workdir,
                                            home=home or "")
                if spec.setup and self.sandbox_io == "direct":
                    # Nothing else calls it: it goes now, not with the agent (its idle exit
                    # waits for the agent's processes too).
                    await self._daemons.stop(handle)
                    await self._daemons.forget(handle)
        except BaseException:
            await asyncio.shield(self._undo_create(handle, workdir if fresh and spec.thread_dir is not None else None))
            raise
        return handle

    async def _undo_create(self, handle: SandboxHandle, thread_workdir: str | None) -> None:
        """Remove what a failed create made: its daemon, its directory and, for a thread whose
        working directory it was building, that (a half-built one would be taken as built by
        the next turn)."""
        await self._daemons.stop(handle)
        await asyncio.to_thread(shutil.rmtree, str(handle.data["dir"]), True)
        await self._daemons.forget(handle)
        if thread_workdir is not None:
            await asyncio.to_thread(shutil.rmtree, thread_workdir, True)

    def thread_paths(self, thread_dir: str, base: str | None = None) -> tuple[str, str]:
        """``(working directory, agent home)`` of a thread: ``<base>/threads/<stem>/work|home``."""
        top = os.path.join(base or self.base_dir, "threads", file_stem(thread_dir))
        return os.path.join(top, "work"), os.path.join(top, "home")

    async def remove_thread_dir(self, thread_dir: str) -> bool:
        """Remove a thread's working directory and home; ``True`` when they existed."""
        top = os.path.dirname(self.thread_paths(thread_dir)[0])
        if not os.path.isdir(top):  # noqa: ASYNC240 -- one stat; the rmtree runs in a thread
            return False
        await asyncio.to_thread(shutil.rmtree, top, True)
        return True

    async def _workspace(self, spec: SandboxSpec, workdir: str) -> None:
        if spec.workspace is None:
            os.makedirs(workdir)
            return
        os.makedirs(os.path.dirname(workdir), exist_ok=True)
        await _ws.build_tree(spec, workdir)

    @staticmethod
    def _env(env: Mapping[str, str] | None, secrets: Mapping[str, str] | None,
             home: str | None = None) -> dict[str, str]:
        out = {k: os.environ[k] for k in _INHERITED_ENV if k in os.environ}
        out.setdefault("LANG", "C.UTF-8")
        if home is not None:
            # The thread's own home: the agent's session store (~/.claude, $CODEX_HOME)
            # stays where its next turn looks for it.
            out.update(HOME=home, CODEX_HOME=os.path.join(home, ".codex"))
        out.update(env or {})
        out.update(secrets or {})
        for k in _PROXY_ENV:
            out.pop(k, None)
        return out

    async def export_tree(self, handle: SandboxHandle) -> bytes:
        """Tar of ``work/`` (the working directory) and ``home/`` (see :mod:`._tree`), made by
        the daemon's operations (``ExportTree``), here or through the sandbox's daemon."""
        return await self._client(handle).export_tree(handle.workdir, str(handle.data.get("home") or ""))

    async def import_tree(self, handle: SandboxHandle, tar: bytes, *, replace: bool = False) -> None:
        """Extract an exported tar into the working directory and home with the daemon's
        operations (``ImportTree``, see :mod:`._tree`), here or through the sandbox's daemon; with ``replace`` both are emptied first,
        and the thread directory's snapshot marker (this machine's note beside them, not in
        the sandbox) is dropped before.

        Raises:
            SandboxBuildFailed: ``import`` for a bad member (nothing written).
        """
        if replace:
            await asyncio.to_thread(_drop_marker, handle)
        await self._client(handle).import_tree(tar, workdir=handle.workdir, home=str(handle.data.get("home") or ""),
                                               replace=replace)

    async def remove_idle_thread_dirs(self, marked_before: float) -> int:
        """Remove ``<base>/threads/*`` whose ``.baton-snapshot`` marker is older than
        ``marked_before`` (an unmarked directory is in use, or was left by a failed turn)."""
        return await asyncio.to_thread(_remove_idle, os.path.join(self.base_dir, "threads"), marked_before)

    async def tree_marker(self, handle: SandboxHandle) -> str | None:
        """The digest in ``<thread directory>/.baton-snapshot`` (thread sandboxes only)."""
        path = _marker_path(handle)
        if path is None:
            return None
        try:
            return (await asyncio.to_thread(pathlib.Path(path).read_text, encoding="ascii")).strip() or None
        except OSError:
            return None

    async def mark_tree(self, handle: SandboxHandle, digest: str) -> None:
        """Write ``<thread directory>/.baton-snapshot`` (thread sandboxes only)."""
        path = _marker_path(handle)
        if path is not None:
            await asyncio.to_thread(pathlib.Path(path).write_text, digest + "\n", encoding="ascii")

    # --- I/O: here, or through the sandbox's daemon --------------------------------------------

    def _client(self, handle: SandboxHandle) -> DaemonClient | OnMachine:
        """What the sandbox's calls go through: here (``direct``) or its daemon."""
        if self.sandbox_io == "direct":
            return OnMachine(handle, self._base_env, self._watcher, self.idle_check)
        return self._daemons.client(handle)

    async def copy_in(self, handle: SandboxHandle, path: str, content: bytes, mode: int = 0o644) -> None:
        """Write ``content`` to ``path`` (relative to the workspace, or absolute inside the
        sandbox) whole, here or through the daemon."""
        await self._client(handle).copy_in(path, content, mode)

    async def launch(
        self,
        handle: SandboxHandle,
        argv: Sequence[str],
        *,
        nonce: str,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
        interactive: bool = False,
    ) -> Mapping[str, Any]:
        """Start ``argv`` under the wrapper in a new session, here or through the sandbox's
        daemon; returns ``{"pgid"}`` (and ``"daemon"``, the daemon's address, through it;
        ``"inbox"``: its path, when ``interactive``).

        The journal is created (empty) before the agent starts, so an attach preflight
        sees it at once. Returns once the process group exists; does not wait for the
        agent.

        Raises:
            SandboxBuildFailed: ``launch`` (the launch failed, or the daemon refused or did not
                start; redacted).
        """
        try:
            client = self._client(handle)
            pgid, inbox = await client.launch(
                argv, nonce=nonce, stdin=stdin, env=env, secrets=secrets, interactive=interactive,
                journal_path=handle.journal_path, stderr_path=handle.stderr_path,
                home=str(handle.data.get("home") or ""), workdir=handle.workdir)
        except (OSError, ValueError) as exc:
            raise SandboxBuildFailed("launch", redact(str(exc), secrets)) from None
        out: dict[str, Any] = {"pgid": pgid}
        if self.sandbox_io == "daemon":
            out["daemon"] = await self._daemons.resolve(handle)
        if inbox:
            out["inbox"] = inbox
        return out

    async def send_input(self, handle: SandboxHandle, input_id: str, payload: bytes) -> None:
        """Append the input's line to the inbox (one ``O_APPEND`` write, here or by the daemon).
        Raises ``ValueError`` (see :func:`sandbox_host.providers._base.check_input`), ``OSError``."""
        line = check_input(handle, input_id, payload)
        await self._client(handle).send_input(handle.inbox_path, line)

    def _on_machine(self, handle: SandboxHandle, path: str) -> bool:
        """Whether ``path`` is read here rather than through the daemon: the sandbox's own
        journal or stderr file, with ``sandbox_io`` ``"direct"`` (never through a link, unlike
        other files, which are confined to the sandbox's roots as the daemon confines them)."""
        return self.sandbox_io == "direct" and path in (handle.journal_path, handle.stderr_path)

    async def follow(self, handle: SandboxHandle, path: str, offset: int) -> AsyncIterator[Chunk]:
        """Yield the file's bytes from ``offset`` as they are written, each chunk with the
        file's size just after its read: the journal and stderr on this machine (this
        provider's inotify wake-ups), any other file confined to the sandbox's roots, here or
        through the daemon (its wake-ups; a restarted daemon is followed on from the offset
        reached).

        Raises:
            FileNotFoundError: the file does not exist, or was deleted (after everything
                written to it was yielded), or the sandbox is gone.
            PermissionError: the journal or stderr path is a symbolic link (never followed
                here; the daemon refuses a link out of the sandbox's roots) or not a regular
                file (a FIFO there would hold the host's loop in its ``open``).
        """
        if not self._on_machine(handle, path):
            async with contextlib.aclosing(self._client(handle).follow(path, offset)) as chunks:
                async for chunk in chunks:
                    yield chunk
            return
        pos = offset
        # Closed with this generator (not left to the loop's clean-up): its descriptor and
        # watch go at the run's end.
        async with contextlib.aclosing(follow_file(path, offset, self._watcher, self.idle_check,
                                                   no_link=True)) as pieces:
            async for data in pieces:
                pos += len(data)
                yield Chunk(data, pos - len(data), size_at_least(path, pos, follow_links=False))

    async def read_file(self, handle: SandboxHandle, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        """Bytes of the file from ``offset`` (at most ``limit``): the journal and stderr read
        here (in a worker thread past 64 KiB), any other file confined to the sandbox's roots,
        here or through the daemon.

        Raises:
            FileNotFoundError: the file does not exist.
            PermissionError: the journal or stderr path is a symbolic link or not a regular file.
        """
        if not self._on_machine(handle, path):
            return await self._client(handle).read_file(path, offset, limit)
        if limit == 0:
            return b""
        # The daemon's own reader, with no follow: short reads inline, long ones in a worker
        # thread that the file's close waits for (a cancelled read never leaves one reading).
        async with contextlib.aclosing(follow_file(path, offset, self._watcher, self.idle_check, follow=False,
                                                   limit=limit or 0, no_link=True)) as pieces:
            return b"".join([data async for data in pieces])

    async def file_size(self, handle: SandboxHandle, path: str) -> int | None:
        """Size in bytes, ``None`` when the file does not exist (or the sandbox is gone).

        Raises:
            PermissionError: the journal or stderr path is a symbolic link or not a regular file.
        """
        if not self._on_machine(handle, path):
            return await self._client(handle).file_size(path)
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if _stat.S_ISLNK(st.st_mode):
            raise PermissionError(f"{path} is a symbolic link: not read")
        if not _stat.S_ISREG(st.st_mode):
            raise PermissionError(f"{path} is not a regular file: not read")
        return st.st_size

    @staticmethod
    def _pgid(handle: SandboxHandle) -> int | None:
        """The agent's process group: from the handle, else as the launcher recorded it in
        the sandbox (a handle registered before its launch does not know it)."""
        pgid = handle.data.get("pgid")
        if pgid:
            return int(pgid)
        root = handle.data.get("dir")
        return _procs.recorded_pgid(os.path.join(root, ".baton")) if root else None

    async def kill(self, handle: SandboxHandle, signal: int) -> bool:
        """Signal the agent's process group, here or through the daemon (the group the launch
        recorded when the handle does not know it)."""
        if not os.path.isdir(handle.data["dir"]):  # noqa: ASYNC240 -- one stat
            return False
        return await self._client(handle).kill(self._pgid(handle), signal)

    def cert_check_every(self) -> float | None:
        """See :meth:`Provider.cert_check_every` (with a sandbox CA and through daemons: a
        sixth of its TTL; ``direct`` serves no daemon, so no certificate)."""
        ca = self._daemons.sandbox_ca if self.sandbox_io == "daemon" else None
        return _sandbox_tls.check_every(ca.ttl) if ca is not None else None

    async def renew_tls(self, handle: SandboxHandle) -> float | None:
        """See :meth:`Provider.renew_tls` (a certificate minted by the sandbox CA, through the daemon)."""
        ca = self._daemons.sandbox_ca if self.sandbox_io == "daemon" else None
        if ca is None:
            return None
        return await _sandbox_tls.renew_if_due(self._daemons.client(handle), ca, handle.key)

    async def processes_alive(self, handle: SandboxHandle) -> bool:
        """Whether any of the agent's processes runs, looked up on this machine (as
        :meth:`destroy` signals them here), not through the daemon.

        A followed journal's idle waits ask this 4 times a second per run
        (``BATON_JOURNAL_POLL``); through the daemon each was a gRPC call and a worker
        thread on both sides, which at 200 runs on 2 cores cost more CPU than the runs'
        streaming (``bench/results/README.md``, "Many runs against the base"). The group's
        leader is one small ``/proc`` read; only when it is gone is ``/proc`` scanned, in a
        thread. Same rule as the daemon's (:func:`sandbox_host.daemon._procs.group_alive`).
        """
        if not os.path.isdir(handle.data["dir"]):  # noqa: ASYNC240 -- one stat
            return False
        pgid = self._pgid(handle)
        if not pgid:
            return False
        return _procs.leader_alive(pgid) or await asyncio.to_thread(_procs.group_alive, pgid)

    async def close(self) -> None:
        """Close the channels to the sandboxes' daemons (they, and the agents, run on)."""
        await self._daemons.close()

    async def exists(self, handle: SandboxHandle) -> bool:
        return os.path.isdir(handle.data["dir"])  # noqa: ASYNC240 -- one stat of a local dir: negligible

    async def destroy(self, handle: SandboxHandle) -> bool:
        """SIGKILL the process group, stop the daemon, remove the directory, the journal and
        its stderr (also where the agent made either a directory).

        The agent is killed here, not through the daemon: destroying must work with the
        daemon dead too (this is the machine it runs on).
        """
        killed = await asyncio.to_thread(_signal_group, self._pgid(handle), _signal.SIGKILL)
        await self._daemons.stop(handle)
        removed = False
        root = handle.data["dir"]
        if os.path.isdir(root):  # noqa: ASYNC240 -- one stat; the slow rmtree runs in a thread
            await asyncio.to_thread(shutil.rmtree, root, True)
            removed = True
        # After the removal: a follow cut off by the closed channel then finds the sandbox gone.
        await self._daemons.forget(handle)
        for p in (handle.journal_path, handle.stderr_path):
            try:
                os.unlink(p)
                removed = True
            except FileNotFoundError:
                pass
            except IsADirectoryError:  # the agent made a directory of it: removed as well
                await asyncio.to_thread(shutil.rmtree, p, True)
                removed = removed or not os.path.lexists(p)  # noqa: ASYNC240 -- one stat
        return killed or removed


def _marker_path(handle: SandboxHandle) -> str | None:
    # A thread sandbox's home is <top>/home beside its working directory <top>/work.
    home = handle.data.get("home")
    if not home or os.path.dirname(home) != os.path.dirname(handle.workdir):
        return None
    return os.path.join(os.path.dirname(handle.workdir), ".baton-snapshot")


def _drop_marker(handle: SandboxHandle) -> None:
    marker = _marker_path(handle)
    if marker is not None and os.path.exists(marker):
        os.unlink(marker)


def _remove_idle(top: str, marked_before: float) -> int:
    removed = 0
    try:
        names = os.listdir(top)
    except FileNotFoundError:
        return 0
    for name in names:
        marker = os.path.join(top, name, ".baton-snapshot")
        try:
            st = os.stat(marker)
            if st.st_size == 0 or st.st_mtime >= marked_before:
                continue
        except FileNotFoundError:
            continue
        # The marker goes first: a run starting now on this directory restores it anew.
        os.unlink(marker)
        shutil.rmtree(os.path.join(top, name), ignore_errors=True)
        removed += 1
    return removed
