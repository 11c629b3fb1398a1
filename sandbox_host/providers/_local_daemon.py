"""The daemon of a local sandbox: started on demand, found again by any host on the machine
(for its setup commands, or for every call with ``BATON_LOCAL_SANDBOX_IO=daemon``).

A local sandbox's daemon (:mod:`sandbox_host.daemon`) runs detached like its agent (its own
session, nobody's child: it survives the host, even a SIGKILL), listens on a free loopback
port and keeps its files in the sandbox's ``.baton/``:

- ``daemon.lock``: locked (``flock``) by the live daemon for its whole life, so "is it
  running" is one non-blocking lock attempt, whichever host asks;
- ``daemon.addr``: ``127.0.0.1:<port> <pid>``, written once it serves;
- ``daemon.spawn``: locked by the host starting one, so two hosts never start two;
- ``daemon.spawned``: the pid of the daemon last started (a start still under way is
  waited for, not repeated);
- ``daemon.log``: its stderr;
- ``daemon-tls.crt``/``daemon-tls.key`` (0600), with a sandbox CA (``BATON_SANDBOX_CA_*``):
  the certificate the host starting the daemon minted for it (afresh at each start).

Whoever finds no live daemon starts one (:meth:`LocalDaemons.resolve`): a daemon that was
killed is replaced at the next call, on a new port, and its agent is untouched. A start asks
the machine's fork server (:mod:`sandbox_host.daemon.forkserver`: the daemon's code imported
once, a ``fork`` per daemon, ~100 ms of CPU less per start); where none answers, it starts
the daemon as a command (``python -m sandbox_host.daemon``) and starts a fork server for the
next ones. A daemon
with no call and no live agent for ``idle_exit`` seconds stops by itself (the next call
starts another), so a sandbox nobody destroys leaves no daemon behind for long.
"""
from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import stat
import signal
import sys
import time
from typing import Mapping

from baton import internal_auth
from baton import tls as _tls
from sandbox_host.daemon import _procs, forkserver, sandbox_token
from sandbox_host.daemon._procs import OWN_ENV
from sandbox_host.providers import _sandbox_tls
from sandbox_host.providers._base import SandboxHandle
from sandbox_host.providers._daemon_client import DaemonClient, SandboxGone

log = logging.getLogger(__name__)

ADDR_FILE, LOCK_FILE, SPAWN_FILE, LOG_FILE = "daemon.addr", "daemon.lock", "daemon.spawn", "daemon.log"
#: Seconds a started daemon may take to serve.
#: Seconds a local daemon has to come up (its address written), as a container's daemon
#: has (docker.DAEMON_START_TIMEOUT). With 30 s, a run failed once on a machine at load ~20
#: (the nemesis beside the fault suite) whose daemon had written nothing by then.
START_TIMEOUT = 60.0
#: Seconds a waited-for daemon may be seen not running (its lock free) before it is started
#: again, unless the one this wait started is still alive (it is still starting: on a busy
#: machine a daemon's start takes seconds, and a second start would only cost its start-up
#: CPU, ~70 ms, then find the lock taken and exit).
RESPAWN_AFTER = 3.0
#: Starts the daemon detached (its own session) and writes its pid to a file (not to a pipe:
#: under uvloop the daemon inherited the pipe, so reading it to its end waited for the
#: daemon's exit). A background job of a non-interactive ``sh`` is no group leader, so
#: ``setsid`` does not fork: ``$!`` is the daemon.
_SPAWN = 'log=$1; pidfile=$2; shift 2; setsid "$@" </dev/null >>"$log" 2>&1 & echo $! >"$pidfile"'
#: The file :data:`_SPAWN` writes the daemon's pid to, in the sandbox's ``.baton``.
SPAWNED_FILE = "daemon.spawned"
#: Seconds a fork server has to answer a request for a daemon (else the daemon is started
#: as a command).
FORK_TIMEOUT = 10.0
#: Seconds between two starts of a fork server by one host (one that does not come up is
#: not started again at every daemon's start), and that a host leaves a server alone after
#: it did not answer in time (a hung server is not waited for at every start).
FORKSERVER_RESTART = 10.0
#: Requests one host has open at a fork server at once (a burst of starts queues here: each
#: sends its bytes right after its connect, where the server reads 256 connections at once
#: and closes one silent for a quarter second when more come).
FORK_ASKS = 32
#: The longest a host leaves alone a fork server that keeps not answering, in seconds.
FORKSERVER_BACKOFF_MAX = 300.0
#: The uid ``SO_PEERCRED`` gives a socket with no peer ((uid_t) -1).
_NO_PEER = 0xFFFFFFFF
#: An environment variable of this many bytes gives a fork server's forked daemons room for
#: their command lines (``setproctitle`` writes over the server's argv and environment).
TITLE_ROOM = 4096
#: The longest path a Unix socket can be bound at (``sun_path`` less its NUL, Linux).
_SOCKET_PATH_MAX = 107


def _starting(pid: int | None, meta: str) -> bool:
    """Whether the daemon process ``pid`` (one this host started for the sandbox whose state
    is ``meta``) is alive, not a zombie, and still that daemon (its working directory is
    ``meta``, where both ways of starting it put it, or its command line names ``meta``: a
    pid reused by another process is not)."""
    if pid is None:
        return False
    st = _procs.proc_stat(pid)
    if st is None or st[0] == "Z":
        return False
    try:
        cwd, own = os.stat(f"/proc/{pid}/cwd"), os.stat(meta)
        if (cwd.st_dev, cwd.st_ino) == (own.st_dev, own.st_ino):
            return True
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return meta.encode() in f.read()
    except OSError:
        return False


def _own_dir(path: str) -> bool:
    """Whether ``path`` is a directory (not a link) of this user's alone: owned by it, no
    access for group or others."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def meta_dir(handle: SandboxHandle) -> str:
    """The sandbox's ``.baton`` directory (the daemon's state, and its launches')."""
    return os.path.join(str(handle.data["dir"]), ".baton")


def daemon_roots(handle: SandboxHandle) -> list[str]:
    """The roots a local sandbox's daemon serves (and a host on the machine confines its
    calls to): the working directory, the sandbox's directory, the journal and stderr
    files, and the thread's home when it has one."""
    roots = [handle.workdir, str(handle.data["dir"]), handle.journal_path, handle.stderr_path]
    if handle.data.get("home"):
        roots.append(str(handle.data["home"]))
    return roots


def daemon_running(meta: str) -> bool:
    """Whether a daemon holds the sandbox's ``daemon.lock`` (one non-blocking attempt)."""
    try:
        fd = os.open(os.path.join(meta, LOCK_FILE), os.O_RDWR)
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _running_and_addr(meta: str) -> tuple[bool, str, int]:
    """``(running, address, pid)`` from the lock and ``daemon.addr`` (``""``/0 when none)."""
    running = daemon_running(meta)
    try:
        with open(os.path.join(meta, ADDR_FILE)) as f:
            parts = f.read().split()
    except (FileNotFoundError, NotADirectoryError):
        return running, "", 0
    if len(parts) != 2 or not parts[1].isdigit():
        return running, "", 0
    return running, parts[0], int(parts[1])


class LocalDaemons:
    """Starts, finds and stops the daemons of one machine's local sandboxes.

    Args:
        env: the environment a daemon starts with (the agent's inherited variables; the
            daemon's credentials are added here).
        idle_check: seconds a daemon's follow waits for an inotify wake-up before it looks.
        idle_exit: seconds without a call and without a live agent after which a daemon stops.
        token: the cluster's internal token (``None``: ``BATON_INTERNAL_TOKEN``); each
            daemon gets its sandbox's token derived from it.
        tls: the internal TLS (``None``: ``BATON_TLS_*``): a daemon serves it with the
            host's certificate, and hosts dial it so; unless there is a sandbox CA.
        sandbox_ca: the sandbox CA (default ``BATON_SANDBOX_CA_*``): then whoever starts a
            daemon mints it a fresh certificate (``.baton/daemon-tls.*``), and hosts check
            it against the CA and the sandbox's name instead.
        forkserver: start daemons through the machine's fork server (``False``: always as
            a command).
    """

    def __init__(self, env: Mapping[str, str], *, idle_check: float = 0.25, idle_exit: float = 60.0,
                 token: str | None = None, tls: _tls.GrpcTls | None = None,
                 sandbox_ca: _sandbox_tls.SandboxCa | None | str = "env", forkserver: bool = True) -> None:
        self.forkserver = forkserver
        self._forkserver_at: tuple[str, str] | None = None  # (directory, socket), once known
        self._forkserver_next = 0.0  # monotonic time before which none is started again
        self._forkserver_off = 0.0  # monotonic time before which the server is not asked
        self._forkserver_misses = 0  # the server's misses (no answer in time) in a row
        self._asking = asyncio.Semaphore(FORK_ASKS)  # this host's requests open at once
        self._ca = _sandbox_tls.from_env() if isinstance(sandbox_ca, str) else sandbox_ca
        self._env = dict(env)
        self.idle_check = idle_check
        self.idle_exit = idle_exit
        self._token = internal_auth.token_from_env() if token is None else token
        self._tls = _tls.from_env() if tls is None else tls
        self._clients: dict[str, DaemonClient] = {}
        self._starting: dict[str, asyncio.Lock] = {}

    @property
    def sandbox_ca(self) -> _sandbox_tls.SandboxCa | None:
        """The sandbox CA whose certificates the daemons serve (``None``: none)."""
        return self._ca

    def client(self, handle: SandboxHandle) -> DaemonClient:
        """The sandbox's client (one per sandbox directory, kept until :meth:`forget`)."""
        meta = meta_dir(handle)
        c = self._clients.get(meta)
        if c is None:
            async def resolve() -> str:
                return await self.resolve(handle)

            async def gone() -> bool:
                return not os.path.isdir(meta)  # noqa: ASYNC240 -- one stat

            tls = self._ca.client_tls(handle.key) if self._ca is not None else self._tls
            c = self._clients[meta] = DaemonClient(resolve, token=sandbox_token(self._token, handle.key),
                                                   tls=tls, gone=gone)
        return c

    async def resolve(self, handle: SandboxHandle) -> str:
        """The address of the sandbox's live daemon, starting one when none runs.

        Raises:
            SandboxGone: the sandbox's directory is gone.
            OSError: the daemon did not come up within :data:`START_TIMEOUT` (its log's tail).
        """
        meta = meta_dir(handle)
        # Inline, not in a thread: a non-blocking lock test and a read of a few bytes in the
        # sandbox's own directory cost less than the hand-off (every takeover of a run
        # resolves its daemon; a burst of them grew the thread pool on the loop).
        running, addr, _ = _running_and_addr(meta)
        if running and addr:
            return addr
        lock = self._starting.setdefault(meta, asyncio.Lock())
        async with lock:
            if not os.path.isdir(meta):  # noqa: ASYNC240 -- one stat
                raise SandboxGone(f"sandbox {handle.key}: its directory is gone")
            fd = os.open(os.path.join(meta, SPAWN_FILE), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                await _flock(fd, START_TIMEOUT)
                running, addr, _ = await asyncio.to_thread(_running_and_addr, meta)
                if running and addr:
                    return addr
                spawned = None if running else await self._spawn(handle, meta)
                return await self._wait_addr(handle, meta, spawned)
            finally:
                os.close(fd)  # releases the spawn lock

    def _argv(self, handle: SandboxHandle, meta: str) -> list[str]:
        """The daemon's arguments (after ``python -m sandbox_host.daemon``)."""
        roots = daemon_roots(handle)
        argv = ["--listen", "127.0.0.1:0",
                "--workdir", handle.workdir, "--state", meta,
                "--addr-file", os.path.join(meta, ADDR_FILE), "--lock-file", os.path.join(meta, LOCK_FILE),
                "--idle-exit", str(self.idle_exit), "--idle-check", str(self.idle_check)]
        for r in roots:
            argv += ["--root", r]
        return argv

    def _daemon_env(self, key: str, tls_files: tuple[str, str] | None = None) -> dict[str, str]:
        env = dict(self._env)
        token = sandbox_token(self._token, key)
        if token:
            env[internal_auth.ENV] = token
        if tls_files is not None:  # its own certificate, not the host's
            env = {k: v for k, v in env.items() if not k.startswith("BATON_TLS_")}
            env[_tls.CERT], env[_tls.KEY] = tls_files
        else:
            env.update({k: v for k, v in os.environ.items() if k.startswith("BATON_TLS_")})
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
            env[OWN_ENV] = "PYTHONPATH"
        return env

    async def _spawn(self, handle: SandboxHandle, meta: str, *, fresh: bool = True) -> int | None:
        """Start the sandbox's daemon (detached) → its pid (``None`` when the start did not
        tell): forked by the machine's fork server, else as a command. ``fresh``: remove the
        last one's address first (not on a start again while waiting: a daemon started just
        before may have written its own meanwhile)."""
        if fresh:
            try:
                os.unlink(os.path.join(meta, ADDR_FILE))
            except FileNotFoundError:
                pass
        tls_files = None
        if self._ca is not None:  # minted at every start: a restarted daemon never serves an expired one
            server = await asyncio.to_thread(self._ca.mint, handle.key)
            tls_files = await asyncio.to_thread(_sandbox_tls.write_files, meta, server)
        argv, env = self._argv(handle, meta), self._daemon_env(handle.key, tls_files)
        spawned = os.path.join(meta, SPAWNED_FILE)
        try:
            os.unlink(spawned)  # the last start's pid is not this one's
        except FileNotFoundError:
            pass
        pid = await self._fork(argv, env, meta) if self.forkserver else None
        if pid is not None:
            with open(spawned, "w") as f:  # noqa: ASYNC230 -- a few bytes
                f.write(f"{pid}\n")
            return pid
        proc = await asyncio.create_subprocess_exec(
            "sh", "-c", _SPAWN, "baton-daemon", os.path.join(meta, LOG_FILE), spawned,
            sys.executable, "-m", "sandbox_host.daemon", *argv,
            cwd=meta, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        await proc.wait()
        try:
            with open(spawned) as f:  # noqa: ASYNC230 -- a few bytes just written
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    async def _fork(self, args: list[str], env: Mapping[str, str], meta: str) -> int | None:
        """The pid of the daemon ``args`` (its arguments) the machine's fork server forked,
        or ``None``: when none may be asked (:meth:`_forkserver_socket`), none answered (then
        one is started for the next daemons), or it did not answer in time (then it is not
        asked for :data:`FORKSERVER_RESTART` s, doubled at each miss in a row up to
        :data:`FORKSERVER_BACKOFF_MAX`: a hung server is not waited for at every start; the
        starts that were waiting on it together count as one miss)."""
        where = await self._forkserver_socket()
        if where is None:
            return None
        top, sock = where
        try:
            async with self._asking:
                if time.monotonic() < self._forkserver_off:
                    return None  # it missed while this start queued: not waited for again
                request = {"argv": args, "env": dict(env), "cwd": meta, "log": os.path.join(meta, LOG_FILE),
                           "until": time.time() + FORK_TIMEOUT}
                answer = await self._ask_forkserver(sock, request)
        except (FileNotFoundError, ConnectionError):
            # None serves there, or it went away with the request (killed, or stopping):
            # start one for the next daemons.
            await self._start_forkserver(top, sock)
            return None
        except (OSError, TimeoutError, ValueError) as exc:
            if time.monotonic() < self._forkserver_off:
                return None  # a start beside this one saw the same miss and counted it
            off = min(FORKSERVER_RESTART * 2 ** min(self._forkserver_misses, 5), FORKSERVER_BACKOFF_MAX)
            self._forkserver_misses += 1
            self._forkserver_off = time.monotonic() + off
            log.warning("the fork server at %s did not answer (%s): daemons start as commands for %.3g s",
                        sock, str(exc) or type(exc).__name__, off)
            await self._start_forkserver(top, sock)
            return None
        self._forkserver_misses = 0
        if isinstance(answer, dict) and isinstance(answer.get("pid"), int):
            return int(answer["pid"])
        log.warning("the fork server at %s refused a daemon: %s", sock, str(answer)[:300])
        return None

    async def _forkserver_socket(self) -> tuple[str, str] | None:
        """The fork server's ``(directory, socket path)``, if it may be asked now: not while
        it is left alone after a miss, not when its path is too long for a Unix socket (then
        never), and not when its directory is not this user's alone (the request holds the
        sandbox's token; a server is then started, which refuses such a directory too)."""
        if time.monotonic() < self._forkserver_off:
            return None
        if self._forkserver_at is None:
            self._forkserver_at = forkserver.address(await asyncio.to_thread(forkserver.code_stamp))
        top, sock = self._forkserver_at
        if len(os.fsencode(sock)) > _SOCKET_PATH_MAX:
            log.warning("no fork server for sandbox daemons: its socket path %s is over %d bytes (a shorter "
                        "TMPDIR gives one)", sock, _SOCKET_PATH_MAX)
            self.forkserver = False
            return None
        if not _own_dir(top):
            await self._start_forkserver(top, sock)
            return None
        return top, sock

    async def _ask_forkserver(self, sock: str, request: dict[str, object]) -> object:
        """Send ``request`` to the fork server listening on ``sock`` → its answer (a JSON
        value), within :data:`FORK_TIMEOUT` s.

        Raises:
            FileNotFoundError, ConnectionError: none listens there (refused), or the
                connection ended without an answer (the server was killed or stopped).
            PermissionError: the listener is another user's (nothing was sent).
            TimeoutError: no answer in time, or its backlog is full.
            OSError, ValueError: any other failure; the answer is not JSON.
        """
        async with asyncio.timeout(FORK_TIMEOUT):
            reader, writer = await asyncio.open_unix_connection(sock)
            try:
                uid = forkserver.peer_uid(writer.get_extra_info("socket"))
                if uid == _NO_PEER:
                    # A non-blocking connect the listener's full backlog did not take (EAGAIN)
                    # looks connected to asyncio, with no peer.
                    raise TimeoutError(f"the fork server at {sock} has a full backlog")
                if uid != os.getuid():
                    raise PermissionError(f"the fork server at {sock} is another user's (uid {uid})")
                writer.write(json.dumps(request).encode() + b"\n")
                await writer.drain()
                line = await reader.readline()
                if not line:
                    raise ConnectionResetError(f"the fork server at {sock} closed the connection unanswered")
                return json.loads(line)
            finally:
                writer.close()

    async def _start_forkserver(self, top: str, sock: str) -> None:
        """Start the fork server at ``sock`` (detached, as a daemon is; not waited for), at
        most once per :data:`FORKSERVER_RESTART` seconds. Not in a directory this user does
        not own alone (``0700``), which is then left as it is."""
        now = time.monotonic()
        if now < self._forkserver_next:
            return
        self._forkserver_next = now + FORKSERVER_RESTART
        try:
            os.mkdir(top, 0o700)
            os.chmod(top, 0o700)  # whatever the umask
        except FileExistsError:
            pass
        except OSError as exc:
            log.warning("no fork server for sandbox daemons: %s", exc)
            return
        if not _own_dir(top):
            log.warning("no fork server for sandbox daemons: %s is not a directory of this user's alone", top)
            return
        env = dict(self._env)
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        env["BATON_FORKSERVER_TITLE_ROOM"] = "." * TITLE_ROOM
        proc = await asyncio.create_subprocess_exec(
            "sh", "-c", _SPAWN, "baton-forkserver", os.path.join(top, "log"), os.path.join(top, "spawned"),
            sys.executable, "-m", "sandbox_host.daemon.forkserver", "--socket", sock,
            "--lock", os.path.join(top, "lock"), "--idle-exit", str(self.idle_exit or 60.0),
            cwd=top, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        await proc.wait()

    async def _wait_addr(self, handle: SandboxHandle, meta: str, spawned: int | None = None) -> str:
        """Wait (holding the spawn lock) for a live daemon's address. A daemon found not running
        for :data:`RESPAWN_AFTER` seconds is started again: one that was stopping when the wait
        began (the run before, ending on another host, stopped it: it held its lock, so none
        was started) or one that died at its start; not while ``spawned`` (the pid of the
        daemon this wait started) is alive and starting. Until :data:`START_TIMEOUT`."""
        began = time.monotonic()
        deadline = began + START_TIMEOUT
        down_since: float | None = None
        while True:
            running, addr, _ = await asyncio.to_thread(_running_and_addr, meta)
            if running and addr:
                return addr
            now = time.monotonic()
            if now > deadline:
                tail = await _stacks_of_holder(meta) if running else _log_tail(meta)
                log.warning("sandbox daemon of %s did not start within %.0f s (%s); its log ends: %s",
                            handle.key, START_TIMEOUT, "running" if running else "not running", tail)
                raise OSError(f"the sandbox daemon did not start within {START_TIMEOUT:.0f} s "
                              f"({'running' if running else 'not running'}): {tail[-500:]}")
            if running or _starting(spawned, meta):
                down_since = None
            elif down_since is None:
                down_since = now
            elif now - down_since >= RESPAWN_AFTER:
                log.info("sandbox daemon of %s not running: starting it again", handle.key)
                spawned = await self._spawn(handle, meta, fresh=False)
                down_since = None
            await asyncio.sleep(0.01)

    async def stop(self, handle: SandboxHandle) -> bool:
        """Stop the sandbox's daemon (SIGTERM, when one holds the lock); ``True`` when signalled.
        Its client stays (:meth:`forget` closes it, once the sandbox is removed)."""
        meta = meta_dir(handle)
        running, _, pid = await asyncio.to_thread(_running_and_addr, meta)
        if not (running and pid):
            return False
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return False
        return True

    async def forget(self, handle: SandboxHandle) -> None:
        """Close the sandbox's client."""
        c = self._clients.pop(meta_dir(handle), None)
        if c is not None:
            await c.close()

    async def close(self) -> None:
        """Close every client (the daemons run on)."""
        clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            await c.close()


async def _flock(fd: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise OSError("another host is starting this sandbox's daemon and did not finish") from None
            await asyncio.sleep(0.01)


def _log_tail(meta: str, size: int = 500) -> str:
    try:
        with open(os.path.join(meta, LOG_FILE), "rb") as f:
            return f.read()[-size:].decode("utf-8", "replace").strip() or "(no output)"
    except OSError:
        return "(no log)"


#: Seconds a hung daemon is given to write its stacks into its log once asked.
STACKS_WAIT = 2.0


def _lock_holder(path: str) -> int | None:
    """The pid holding ``flock`` on ``path`` (Linux ``/proc/locks``), when it is a sandbox
    daemon (its command line says so); else ``None``."""
    try:
        st = os.stat(path)
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in lines:
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == want and parts[4].isdigit():
            pid = int(parts[4])
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as c:
                    if b"sandbox_host.daemon" in c.read():
                        return pid
            except OSError:
                return None
    return None


async def _stacks_of_holder(meta: str) -> str:
    """The log tail of a daemon that holds its lock but never wrote its address, after asking
    it (``SIGUSR1``: :mod:`faulthandler`) for every thread's stack: where it hangs. The plain
    tail when the holder is not a sandbox daemon (never signalled) or is gone."""
    return await asyncio.to_thread(_ask_for_stacks, meta)


def _log_size(meta: str) -> int:
    try:
        return os.path.getsize(os.path.join(meta, LOG_FILE))
    except OSError:
        return -1


def _ask_for_stacks(meta: str) -> str:
    pid = _lock_holder(os.path.join(meta, LOCK_FILE))
    size = _log_size(meta)
    if pid is None or size < 0:
        return _log_tail(meta)
    try:
        os.kill(pid, signal.SIGUSR1)
    except (ProcessLookupError, PermissionError):
        return _log_tail(meta)
    until = time.monotonic() + STACKS_WAIT
    while time.monotonic() < until and _log_size(meta) <= size:
        time.sleep(0.05)  # a worker thread's wait (asyncio.to_thread)
    time.sleep(0.2)  # the dump is written in a few writes
    return f"pid {pid}: " + _log_tail(meta, 4000)
