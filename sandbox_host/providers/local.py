"""The ``local`` provider: a directory plus a detached process group (docs/design.md §5.1).

A sandbox is ``<base_dir>/<file stem of the key>/`` holding ``workspace/`` (the agent's
working directory) and ``.baton/`` (the wrapper script, the one-shot nonce file, the
prompt). The journal and its stderr file live in ``<journal_dir>`` named after the key
(:func:`sandbox_host.journal.journal_path`). The agent runs under the launch wrapper in its
own session (``setsid``) whose parent exits at once, so the agent is nobody's child: it
survives the host process (even SIGKILL) and any host on the machine can follow, signal or
destroy it from the handle (``data = {"dir", "pgid"}``).

This module is the adapter: all process and file I/O of local sandboxes lives here.
"""
from __future__ import annotations

import asyncio
import os
import pathlib
import secrets as _secrets
import shutil
import signal as _signal
from typing import Any, AsyncIterator, Mapping, Sequence

from baton.errors import SandboxBuildFailed
from baton.ids import file_stem
from sandbox_host import journal as _journal
from sandbox_host._wrapper import wrapper_argv, wrapper_script
from sandbox_host.providers._base import Provider, SandboxHandle, SandboxSpec, check_input, run_host_command
from sandbox_host.providers._inotify import FileWatcher
from sandbox_host.providers import _tree
from sandbox_host.providers import _workspace as _ws
from sandbox_host.providers._redact import redact

#: Bytes of a failing step's stderr kept in ``SandboxBuildFailed.detail``.
STDERR_TAIL = 2000
_READ_CHUNK = 1 << 20
# Host variables the agent's environment inherits; everything else (the host's own
# credentials included) stays out of its environment. Sandbox env and secrets are added on
# top. This is not isolation: the agent runs as the host's user and can read what it can
# (/proc, files); docs/overview.md says so, and the docker provider is the isolated one.
_INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME", "SHELL", "TZ")
_PROXY_ENV = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy")
# Launch: `setsid` (not forking, as it is not a group leader in a non-interactive sh) makes
# the child a session and group leader with pid == pgid; that child records its pid in the
# sandbox (`.baton/pgid`, first argument) and only then becomes the wrapper, while the
# launching sh prints the pid and exits. The record is what lets any host kill an agent whose
# launch never reached the sandbox registry (the launching host died, or the store was down,
# right after the launch). It is written by the group leader itself, after `setsid`: written
# by the launching sh right after the fork, it could name a process not yet leading its
# group, which a successor's SIGKILL of the group would miss while the agent went on. And when the sandbox was removed
# meanwhile, the record cannot be written and no agent starts (`&&`).
_LAUNCHER = ('f=$1; shift; setsid sh -c \'echo $$ >"$0" && exec "$@"\' "$f" "$@" '
             '</dev/null >/dev/null 2>&1 & echo $!')
_PGID_FILE = "pgid"


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state, pgrp)`` of a process from ``/proc``, ``None`` when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # comm may contain spaces and parentheses: fields restart after the last ")".
    fields = raw[raw.rfind(b")") + 2 :].split()
    return fields[0].decode(), int(fields[2])


def group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is in process group ``pgid``.

    ``killpg(pgid, 0)`` is not enough: detached agents are reparented to PID 1, which may
    not reap them (it does not in our CI container), and a zombie still "exists" for kill.
    """
    st = _proc_stat(pgid)
    if st is not None and st[0] != "Z" and st[1] == pgid:
        return True
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = _proc_stat(int(name))
        if st is not None and st[1] == pgid and st[0] != "Z":
            return True
    return False


class LocalProvider(Provider):
    """Sandboxes as local directories with detached process groups.

    Args:
        base_dir: where sandboxes are created (default ``BATON_SANDBOX_DIR``).
        journal_dir: where journals live (default ``BATON_JOURNAL_DIR``).
        idle_check: seconds a follow waits for an inotify wake-up before it re-checks the
            file anyway (also the poll interval where inotify is unavailable).
    """

    name = "local"
    killable_processes = True
    can_follow = True
    cheap_file_size = True  # one stat of a local file

    def __init__(
        self,
        base_dir: str | None = None,
        journal_dir: str | None = None,
        *,
        idle_check: float = 0.25,
    ) -> None:
        from baton import config

        self.base_dir = base_dir or config.get("BATON_SANDBOX_DIR")
        self.journal_dir = journal_dir or config.get("BATON_JOURNAL_DIR")
        self.idle_check = idle_check
        self._watcher = FileWatcher()  # one inotify instance for every follow (see _inotify)

    # --- building -------------------------------------------------------------------------

    async def create(self, key: str, spec: SandboxSpec) -> SandboxHandle:
        """Create the directory, fill the workspace, run the setup commands in order.

        With ``spec.thread_dir`` the working directory and agent home are the thread's
        (:meth:`thread_paths`); an existing working directory is kept as it is (the thread's
        earlier turns built it), so neither the workspace nor the setup runs again.

        Raises:
            SandboxBuildFailed: ``step`` is ``"create"`` (the sandbox already exists),
                ``"workspace"`` (copy or git clone/checkout failed, over the size limit, or
                out of time) or ``"setup[i]"`` (the i-th setup command exited non-zero or
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
        env = _ws.setup_env(self._env(spec.env, spec.secrets, home))
        steps = _ws.BuildSteps()
        try:
            if home is not None:
                os.makedirs(os.path.join(home, ".codex"), exist_ok=True)
            if fresh:
                async with _ws.build_budget(spec.build_timeout, steps):
                    await self._workspace(spec, workdir)
                    for i, cmd in enumerate(spec.setup):
                        steps.current = f"setup[{i}]"
                        code, err = await run_host_command(["sh", "-c", cmd], workdir, env)
                        if code != 0:
                            raise SandboxBuildFailed(
                                f"setup[{i}]", redact(f"exit {code}: {_tail(err)}", _ws.redactions(spec.secrets)))
        except BaseException:
            await asyncio.shield(asyncio.to_thread(shutil.rmtree, root, True))
            if fresh and spec.thread_dir is not None:
                # A half-built thread workspace would be taken as built by the next turn.
                await asyncio.shield(asyncio.to_thread(shutil.rmtree, workdir, True))
            raise
        return handle

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
        """Tar of ``work/`` (the working directory) and ``home/`` (see :mod:`._tree`)."""
        return await asyncio.to_thread(_tree.export_local, handle.workdir, handle.data.get("home"))

    async def import_tree(self, handle: SandboxHandle, tar: bytes, *, replace: bool = False) -> None:
        """Extract an exported tar into the working directory and home (see :mod:`._tree`);
        with ``replace`` both are emptied first (and the thread directory's marker dropped)."""
        home = handle.data.get("home")
        if replace:
            await asyncio.to_thread(_empty_tree, handle.workdir, home)
        await asyncio.to_thread(_tree.import_local, tar, handle.workdir, home)

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

    async def copy_in(self, handle: SandboxHandle, path: str, content: bytes, mode: int = 0o644) -> None:
        """Write ``content`` to ``path`` (absolute, or relative to the workspace)."""
        target = os.path.join(handle.workdir, path)

        def write() -> None:
            os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
            tmp = f"{target}.tmp-{_secrets.token_hex(4)}"
            with open(tmp, "wb") as f:
                f.write(content)
            os.chmod(tmp, mode)
            os.replace(tmp, target)

        await asyncio.to_thread(write)

    # --- running --------------------------------------------------------------------------

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
        """Start ``argv`` under the wrapper in a new session; returns ``{"pgid": int}`` (and
        ``"inbox"``: its path, when ``interactive``).

        The journal is created (empty) before the agent starts, so an attach preflight
        sees it at once. Returns once the process group exists; does not wait for the
        agent.
        """
        meta = os.path.join(handle.data["dir"], ".baton")
        wrapper = os.path.join(meta, "wrapper.sh")
        nonce_file = os.path.join(meta, f"nonce-{_secrets.token_hex(8)}")
        stdin_file = os.path.join(meta, "stdin") if stdin is not None else None
        inbox = os.path.join(meta, "inbox") if interactive else ""

        def prepare() -> None:
            with open(wrapper, "w") as f:
                f.write(wrapper_script())
            fd = os.open(nonce_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(nonce)
            if stdin_file is not None:
                with open(stdin_file, "wb") as f:
                    f.write(stdin or b"")
            if inbox:
                with open(inbox, "wb"):
                    pass  # empty: the relay follows it from its first line
            os.makedirs(os.path.dirname(handle.journal_path), exist_ok=True)
            open(handle.journal_path, "ab").close()
            open(handle.stderr_path, "ab").close()

        await asyncio.to_thread(prepare)
        cmd = wrapper_argv(wrapper, handle.journal_path, handle.stderr_path, nonce_file, stdin_file, argv, inbox)
        proc = await asyncio.create_subprocess_exec(
            "sh", "-c", _LAUNCHER, "baton-launch", os.path.join(meta, _PGID_FILE), *cmd,
            cwd=handle.workdir,
            env=self._env(env, secrets, handle.data.get("home")),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        out, _ = await proc.communicate()
        try:
            pgid = int(out.strip())
        except ValueError:
            raise SandboxBuildFailed("launch", redact(f"launcher printed {out[-200:]!r}", secrets)) from None
        # The sh printed the pid right after fork; wait until the wrapper has deleted the
        # nonce file (so it is a group leader with its TERM trap installed) or ended, so
        # kill/processes_alive act on the group at once. (One small /proc read per poll:
        # inline, negligible, unlike the full /proc scan of group_alive.)
        for _ in range(5000):
            st = _proc_stat(pgid)
            if st is None or st[0] == "Z" or (st[1] == pgid and not os.path.exists(nonce_file)):  # noqa: ASYNC240 -- one stat, see above
                break
            await asyncio.sleep(0.001)
        return {"pgid": pgid, "inbox": inbox} if inbox else {"pgid": pgid}

    async def send_input(self, handle: SandboxHandle, input_id: str, payload: bytes) -> None:
        """Append the input's line to the inbox (one ``O_APPEND`` write). Raises ``ValueError``
        (see :func:`sandbox_host.providers._base.check_input`), ``OSError``."""
        line = check_input(handle, input_id, payload)

        def append() -> None:
            fd = os.open(handle.inbox_path, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, line)  # one write of at most ~65 KiB to a regular file: not split
            finally:
                os.close(fd)

        await asyncio.to_thread(append)

    async def follow(self, handle: SandboxHandle, path: str, offset: int) -> AsyncIterator[bytes]:
        """Yield the file's bytes from ``offset`` as they are written (inotify wake-ups).

        Raises:
            FileNotFoundError: the file does not exist, or was deleted (after everything
                written to it was yielded).
        """
        # Reads run in a worker thread: a catch-up over a long journal reads megabytes. The
        # read is shielded and awaited before the file is closed, so a cancelled follow
        # never closes the file under a read still running in its thread. open and fstat
        # stay inline (metadata only, negligible).
        loop = asyncio.get_running_loop()
        f = open(path, "rb")  # noqa: ASYNC230 -- metadata only, see above
        watch = self._watcher.watch(path)
        reading: asyncio.Future[bytes] | None = None

        async def read(n: int) -> bytes:
            nonlocal reading
            reading = loop.run_in_executor(None, f.read, n)
            data = await asyncio.shield(reading)
            reading = None
            return data

        try:
            f.seek(offset)
            while True:
                data = await read(_READ_CHUNK)
                if data:
                    yield data
                    continue
                if watch is not None:
                    await watch.wait(self.idle_check)
                else:
                    await asyncio.sleep(min(self.idle_check, 0.02))
                if os.fstat(f.fileno()).st_nlink == 0:
                    rest = await read(-1)
                    if rest:
                        yield rest
                    raise FileNotFoundError(path)
        finally:
            if watch is not None:
                watch.close()
            if reading is not None:
                await asyncio.wait({reading})
                if not reading.cancelled():
                    reading.exception()  # retrieved: the follow is ending anyway
            f.close()

    async def read_file(self, handle: SandboxHandle, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        def read() -> bytes:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read(-1 if limit is None else limit)

        return await asyncio.to_thread(read)

    async def file_size(self, handle: SandboxHandle, path: str) -> int | None:
        try:
            return os.stat(path).st_size
        except FileNotFoundError:
            return None

    @staticmethod
    def _pgid(handle: SandboxHandle) -> int | None:
        """The agent's process group: from the handle, else as the launcher recorded it in
        the sandbox (a handle registered before its launch does not know it)."""
        pgid = handle.data.get("pgid")
        if pgid:
            return int(pgid)
        root = handle.data.get("dir")
        if not root:
            return None
        try:
            with open(os.path.join(root, ".baton", _PGID_FILE)) as f:
                return int(f.read().strip())
        except (FileNotFoundError, NotADirectoryError, ValueError):
            return None

    async def kill(self, handle: SandboxHandle, signal: int) -> bool:
        # The liveness check scans /proc (one read per process on the machine): in a thread.
        return await asyncio.to_thread(self._kill_sync, handle, signal)

    def _kill_sync(self, handle: SandboxHandle, signal: int) -> bool:
        pgid = self._pgid(handle)
        if not pgid or not group_alive(pgid):
            return False
        try:
            os.killpg(pgid, signal)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    async def processes_alive(self, handle: SandboxHandle) -> bool:
        return await asyncio.to_thread(self._alive_sync, handle)

    def _alive_sync(self, handle: SandboxHandle) -> bool:
        pgid = self._pgid(handle)
        if not pgid:
            return False
        return group_alive(pgid)

    async def exists(self, handle: SandboxHandle) -> bool:
        return os.path.isdir(handle.data["dir"])  # noqa: ASYNC240 -- one stat of a local dir: negligible

    async def destroy(self, handle: SandboxHandle) -> bool:
        """SIGKILL the process group, remove the directory, the journal and its stderr."""
        killed = await self.kill(handle, _signal.SIGKILL)
        removed = False
        root = handle.data["dir"]
        if os.path.isdir(root):  # noqa: ASYNC240 -- one stat; the slow rmtree runs in a thread
            await asyncio.to_thread(shutil.rmtree, root, True)
            removed = True
        for p in (handle.journal_path, handle.stderr_path):
            try:
                os.unlink(p)
                removed = True
            except FileNotFoundError:
                pass
        return killed or removed


def _tail(err: bytes) -> str:
    return err[-STDERR_TAIL:].decode("utf-8", "replace").strip()


def _marker_path(handle: SandboxHandle) -> str | None:
    # A thread sandbox's home is <top>/home beside its working directory <top>/work.
    home = handle.data.get("home")
    if not home or os.path.dirname(home) != os.path.dirname(handle.workdir):
        return None
    return os.path.join(os.path.dirname(handle.workdir), ".baton-snapshot")


def _empty_tree(workdir: str, home: str | None) -> None:
    marker = _marker_path(SandboxHandle("local", "", "", "", workdir, {"home": home}))
    if marker is not None and os.path.exists(marker):
        os.unlink(marker)
    for top in (workdir, home):
        if top and os.path.isdir(top):
            shutil.rmtree(top)
            os.makedirs(top)


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
