"""``python -m sandbox_host.daemon.forkserver``: starts local sandboxes' daemons by ``fork``,
their code already imported.

A daemon started as ``python -m sandbox_host.daemon`` spends ~100 ms of CPU on the
interpreter and its imports (gRPC, protobuf, asyncio) before it serves; with a daemon per
local sandbox, 200 runs started at once on 2 cores spent 20 s of CPU on it alone
(``bench/results/README.md``, "The whole bench-compare against the base"). This server
imports the daemon once and forks a child per daemon asked for, which then runs the daemon's
own :func:`sandbox_host.daemon.__main__.main` as a fresh command would: its own session
(``setsid``), its environment, working directory and log as the request gives them,
``SIGCHLD`` back to default. It holds no thread and made no gRPC object when it forks
(gRPC's rule for fork: nothing of its core in use in the parent).

One per machine, user and code: the hosts key its socket by the Python, the code's location
and the newest modification of its files (:func:`address`), so code changed on disk gets a
server of its own and the old one goes idle. It holds ``lock`` (``flock``) for its life
(a second one exits at once, before importing anything heavy), listens on a Unix socket in
a ``0700`` directory and serves only its own user (``SO_PEERCRED``), and stops after
``--idle-exit`` seconds without a request, or when its socket file is gone or replaced.

Protocol, one request per connection (connections are read side by side: a silent client
delays no other, and is closed after 5 s): a JSON line ``{"argv": [...], "env": {...}, "cwd":
str, "log": str, "until": float}`` (``argv``: the daemon's arguments, without the program;
``until``: the Unix time after which the host no longer waits: the request is then refused,
not forked) → a JSON line ``{"pid": int}`` (the daemon's) or ``{"error": str}``. The daemons
it forks are in sessions of their own and outlive it.

What a daemon takes from this server rather than from the host that asked for it: the
process state a command would inherit (umask, resource limits, cgroup, nice level), as the
server's starter had them. Its ``/proc/<pid>/cmdline`` is the daemon's command line as far
as the server's own argv and environment leave room for it (``setproctitle``; hosts start
the server with a 4 KiB variable, ``BATON_FORKSERVER_TITLE_ROOM``, for the room; Linux shows
at most a page of a rewritten title, 4 KiB, as one string with spaces between the
arguments), and
``/proc/<pid>/environ`` holds what of the server's environment that left (the agents'
inherited variables, no credential); the daemon's environment is the request's, in its
memory.
"""
from __future__ import annotations

import argparse
import fcntl
import gc
import hashlib
import json
import os
import resource
import selectors
import signal
import socket
import struct
import sys
import tempfile
import time
from typing import Any, Sequence

#: The largest request read (argv, env and paths of one daemon).
MAX_REQUEST = 1 << 20
#: Seconds a connection may take to send its request.
_READ_TIMEOUT = 5.0
#: Connections read at once (well under the usual 1,024 open files; half the limit when
#: it is lower).
MAX_PENDING = 256
#: Seconds a new server waits for the lock a stopping one still holds.
_LOCK_WAIT = 3.0
#: Seconds a connection read at once must have waited without a whole request before a new
#: one takes its place (a burst's bytes come within milliseconds of their connects; a flood
#: of silent connections then drains at ``room`` per quarter second).
_SILENT = 0.25
_UCRED = struct.Struct("iII")  # struct ucred: pid, uid, gid


def code_stamp() -> str:
    """A digest of the code a daemon runs and where: the Python, the versions of the
    daemon's third-party packages, the location of the ``baton`` and ``sandbox_host``
    packages, the modification time and size of each of their ``.py`` files (a walk of a few
    hundred files: call once per process), and the namespaces (network: a daemon listens on
    loopback, a host in another namespace needs one in its own; mount, pid, user: its files
    and pid must mean what they mean to the host)."""
    from importlib import metadata

    import baton
    import sandbox_host

    h = hashlib.sha256(sys.executable.encode())
    for ns in ("net", "mnt", "pid", "user"):
        try:
            h.update(os.readlink(f"/proc/self/ns/{ns}").encode())
        except OSError:
            pass
    for dist in ("grpcio", "grpcio-health-checking", "protobuf", "setproctitle"):
        try:
            h.update(f"{dist}={metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:
            pass
    for pkg in (baton, sandbox_host):
        top = os.path.dirname(os.path.abspath(pkg.__file__ or ""))
        h.update(top.encode())
        for d, dirs, files in os.walk(top):
            dirs[:] = sorted(x for x in dirs if x != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    st = os.stat(os.path.join(d, name))
                    h.update(f"{d}/{name}:{st.st_mtime_ns}:{st.st_size}".encode())
    return h.hexdigest()[:16]


def address(stamp: str) -> tuple[str, str]:
    """``(directory, socket path)`` of the fork server for ``stamp`` (:func:`code_stamp`):
    ``<tmp>/baton-forkserver-<uid>-<stamp>/sock`` (short: a Unix socket's path has at most
    107 bytes)."""
    d = os.path.join(tempfile.gettempdir(), f"baton-forkserver-{os.getuid()}-{stamp}")
    return d, os.path.join(d, "sock")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module's docstring)."""
    p = argparse.ArgumentParser(prog="python -m sandbox_host.daemon.forkserver",
                                description=(__doc__ or "").splitlines()[0])
    p.add_argument("--socket", required=True, help="the Unix socket to listen on (its directory: 0700)")
    p.add_argument("--lock", required=True, help="held locked while the server lives; exit 3 when taken")
    p.add_argument("--idle-exit", type=float, default=60.0, help="stop after this many seconds without a request")
    return p.parse_args(argv)


def check_request(req: Any, now: float | None = None) -> tuple[list[str], dict[str, str], str, str]:
    """``(argv, env, cwd, log)`` of a request, checked at Unix time ``now`` (default: now).

    Raises:
        ValueError: not the request's shape (an object with ``argv``: a list of strings,
            ``env``: an object of strings, ``cwd`` and ``log``: absolute paths, ``until``:
            a number), or past its ``until``.
    """
    if not isinstance(req, dict):
        raise ValueError("the request is not a JSON object")
    until = req.get("until")
    if not isinstance(until, (int, float)) or isinstance(until, bool):
        raise ValueError("until must be a number")
    if (time.time() if now is None else now) > until:
        raise ValueError("the request expired before it was read (its host no longer waits)")
    argv, env, cwd, log = req.get("argv"), req.get("env"), req.get("cwd"), req.get("log")
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ValueError("argv must be a list of strings")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("env must be an object of strings")
    for name, value in (("cwd", cwd), ("log", log)):
        if not isinstance(value, str) or not os.path.isabs(value) or "\0" in value:
            raise ValueError(f"{name} must be an absolute path")
    if any("\0" in s for s in [*argv, *env, *env.values()]):
        raise ValueError("a string holds a NUL byte")
    return argv, env, str(cwd), str(log)


def _child(argv: list[str], env: dict[str, str], cwd: str, log: str, keep_out: Sequence[int]) -> None:
    """In the forked child: become the daemon ``argv`` would start; never returns."""
    code = 1
    try:
        for fd in keep_out:  # the server's sockets, selector and lock are not the daemon's
            os.close(fd)
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(null)
        os.close(out)
        os.chdir(cwd)
        # Before the environment changes: setproctitle finds the command line's memory by
        # the environment's, right after it.
        title = " ".join([sys.executable, "-m", "sandbox_host.daemon", *argv])
        try:  # ps and /proc/<pid>/cmdline show the daemon's command, not its fork server's
            import setproctitle
        except ImportError:
            pass
        else:
            setproctitle.setproctitle(title)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [sys.executable, *argv]
        from sandbox_host.daemon.__main__ import main

        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 -- the child's last word goes to its log
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def peer_uid(sock: socket.socket) -> int:
    """The user id of the process at the other end of the Unix socket ``sock``
    (``SO_PEERCRED``: the peer's credentials when it connected or listened)."""
    _, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return int(uid)


def _send(conn: socket.socket, answer: dict[str, Any]) -> None:
    """Send one answer line; a peer that hung up (or cannot take 300 bytes at once) is
    dropped without a word in the log."""
    try:
        conn.send(json.dumps(answer).encode() + b"\n")
    except OSError:
        pass


class _Pending:
    """A connection whose request is still being read: its bytes so far, when it was
    accepted and the monotonic time by which its bytes must all be there."""

    __slots__ = ("conn", "buf", "accepted", "deadline")

    def __init__(self, conn: socket.socket, accepted: float) -> None:
        self.conn, self.buf, self.accepted, self.deadline = conn, b"", accepted, accepted + _READ_TIMEOUT


class _Server:
    """The accept-and-read loop: every connection is read as its bytes come (a selector), so
    a silent or slow client delays no other; a complete request is answered at once (a fork
    is ~1 ms); one not complete within :data:`_READ_TIMEOUT` s is closed unanswered.

    At most ``room`` connections are read at once (:data:`MAX_PENDING`, less with a low
    open-file limit). When they are all taken, the oldest makes room for the next once it
    has waited :data:`_SILENT` s without a whole request (a flood of silent connections
    ages out in the order it came); until then the next wait in the backlog (a burst of
    starts, whose bytes come a moment after their connects, is answered in full). Out of
    descriptors (EMFILE), such an old one is closed too, or accepting pauses half a second.
    """

    def __init__(self, listener: socket.socket, args: argparse.Namespace, bound: int, lock_fd: int) -> None:
        self.listener, self.args, self.bound, self.lock_fd = listener, args, bound, lock_fd
        self.sel = selectors.DefaultSelector()
        self.pending: dict[int, _Pending] = {}
        self.accepting = False
        self.last = time.monotonic()  # the last request answered: the idle exit counts from it
        self.paused = 0.0  # monotonic time before which no connection is accepted (after EMFILE)
        self.stopping = False  # SIGTERM came
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        self.room = MAX_PENDING if soft == resource.RLIM_INFINITY else max(4, min(MAX_PENDING, soft // 2))
        self.out_of_fds = False  # told the log once per spell

    def stop(self, *_: object) -> None:
        """SIGTERM's handler: the loop ends at its next turn (within a second). A flag, not an
        exception: a handler may run inside ``fork``'s hooks, which drop exceptions."""
        self.stopping = True

    def run(self) -> None:
        """Serve until idle for ``--idle-exit`` s (no connection open), SIGTERM, or the socket
        file is gone or replaced."""
        self.listener.setblocking(False)
        try:
            while not self.stopping:
                now = time.monotonic()
                while (oldest := self._oldest()) is not None and now >= oldest.deadline:
                    self._close(oldest)  # deadlines come in accept order too
                if self._done(now):
                    return
                self._accepting(self._may_accept(now))
                for key, _ in self.sel.select(timeout=self._next_timeout()):
                    if self.stopping:
                        return
                    if key.fileobj is self.listener:
                        self._accept()
                    elif (reading := self.pending.get(key.fd)) is not None and reading.conn is key.fileobj:
                        self._read(reading)  # (not when closed by an accept since the select)
        finally:
            for p in list(self.pending.values()):
                self._close(p)
            self.sel.close()

    def _oldest(self) -> _Pending | None:
        """The connection accepted first: ``pending`` is in accept order (a dict keeps the
        order of insertion, and each connection is inserted as it is accepted)."""
        return next(iter(self.pending.values()), None)

    def _may_accept(self, now: float) -> bool:
        """Whether a connection may be accepted now: not while paused, and with every place
        taken only when the oldest has been silent long enough to make room."""
        if now < self.paused:
            return False
        oldest = self._oldest()
        return len(self.pending) < self.room or (oldest is not None and now - oldest.accepted >= _SILENT)

    def _next_timeout(self) -> float:
        now = time.monotonic()
        oldest = self._oldest()
        soonest = oldest.deadline if oldest is not None else now + 1.0
        if not self.accepting:
            soonest = min(soonest, max(self.paused, oldest.accepted + _SILENT if oldest else now))
        return max(0.0, min(1.0, soonest - now))

    def _done(self, now: float) -> bool:
        try:
            if os.stat(self.args.socket).st_ino != self.bound:
                return True
        except FileNotFoundError:
            return True
        return bool(self.args.idle_exit) and not self.pending and now - self.last > self.args.idle_exit

    def _accepting(self, on: bool) -> None:
        """Watch the listener, or leave the next connections in its backlog."""
        if on != self.accepting:
            if on:
                self.sel.register(self.listener, selectors.EVENT_READ)
            else:
                self.sel.unregister(self.listener)
            self.accepting = on

    def _accept(self) -> None:
        while not self.stopping and self._may_accept(time.monotonic()):
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors (EMFILE, ENFILE), say
                oldest = self._oldest()
                if oldest is not None and time.monotonic() - oldest.accepted >= _SILENT:
                    self._close(oldest)
                    continue
                if not self.out_of_fds:
                    print(f"fork server: accept failed: {exc}", file=sys.stderr, flush=True)
                self.out_of_fds = True
                self.paused = time.monotonic() + 0.5
                break
            self.out_of_fds = False
            if peer_uid(conn) != os.getuid():
                _send(conn, {"error": "another user"})
                conn.close()
                continue
            if len(self.pending) >= self.room:
                oldest = self._oldest()
                assert oldest is not None  # (room >= 4)
                self._close(oldest)
            conn.setblocking(False)
            p = _Pending(conn, time.monotonic())
            self.pending[conn.fileno()] = p
            self.sel.register(conn, selectors.EVENT_READ)
            self._read(p)  # a request usually comes whole with its connection
        self._accepting(self._may_accept(time.monotonic()))

    def _read(self, p: _Pending) -> None:
        try:
            part = p.conn.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            part = b""
        p.buf += part
        if len(p.buf) > MAX_REQUEST:
            _send(p.conn, {"error": f"the request is over {MAX_REQUEST} bytes"})
        elif part and not p.buf.endswith(b"\n"):
            return  # more to come
        elif p.buf:
            try:
                self._answer(p)
            except Exception as exc:  # noqa: BLE001 -- one request's failure; its host falls back
                print(f"fork server: a request failed: {type(exc).__name__}: {str(exc)[:300]}",
                      file=sys.stderr, flush=True)
        self._close(p)

    def _answer(self, p: _Pending) -> None:
        """Check the request in ``p``, fork its daemon, answer its pid (or the error)."""
        try:
            argv, env, cwd, log = check_request(json.loads(p.buf))
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSON's errors are ValueErrors
            _send(p.conn, {"error": str(exc)[:300]})
            return
        if not os.path.isdir(cwd):
            _send(p.conn, {"error": "cwd is not a directory"})
            return
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as exc:
            _send(p.conn, {"error": f"fork failed: {exc}"})
            return
        if pid == 0:
            fds = [self.listener.fileno(), self.lock_fd, self.sel.fileno(), *self.pending]
            _child(argv, env, cwd, log, [fd for fd in fds if fd >= 0])
        self.last = time.monotonic()
        _send(p.conn, {"pid": pid})

    def _close(self, p: _Pending) -> None:
        del self.pending[p.conn.fileno()]
        self.sel.unregister(p.conn)
        p.conn.close()


def serve(args: argparse.Namespace) -> None:
    """Hold the lock, import the daemon, serve until idle or the socket is gone or replaced.

    Raises:
        SystemExit: 3 when another server holds the lock (it returns at SIGTERM).
        OSError: the socket cannot be bound (a path over 107 bytes, say).
    """
    lock_fd = os.open(args.lock, os.O_RDWR | os.O_CREAT, 0o600)
    # A server that is stopping (SIGTERM, idle, its socket replaced) removes its socket
    # before its exit frees the lock, and hosts then start the next one: wait out a stopping
    # holder's last second, then leave (another serves; nothing heavy imported yet).
    give_up = time.monotonic() + _LOCK_WAIT
    while True:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= give_up:
                sys.exit(3)
            time.sleep(0.05)
    import sandbox_host.daemon.__main__  # noqa: F401 -- the point: imported once, forked many times
    try:
        import setproctitle  # noqa: F401 -- each child names itself with it
    except ImportError:
        pass
    from sandbox_host.providers import _inotify

    _inotify.libc()  # found once here (``ldconfig -p`` in a subprocess), not in every daemon
    # What was imported is every child's too: frozen, no collection in a child walks it, so
    # the children's collections neither write to those pages (a copy of each, per child)
    # nor spend their time on them (Python's gc.freeze docs: for a fork without exec).
    gc.freeze()

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    try:
        os.unlink(args.socket)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(args.socket)
    os.chmod(args.socket, 0o600)
    listener.listen(1024)  # a burst of starts (200 runs at once) queues, not refused
    bound = os.stat(args.socket).st_ino
    print(f"fork server {os.getpid()} listening on {args.socket}", flush=True)
    try:
        server = _Server(listener, args, bound, lock_fd)
        signal.signal(signal.SIGTERM, server.stop)
        server.run()
    finally:
        try:
            if os.stat(args.socket).st_ino == bound:  # not a successor's
                os.unlink(args.socket)
        except FileNotFoundError:
            pass


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m sandbox_host.daemon.forkserver``: :func:`serve` with the command line."""
    serve(parse_args(argv))


if __name__ == "__main__":
    main()
