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

Protocol, one request per connection: a JSON line ``{"argv": [...], "env": {...}, "cwd":
str, "log": str, "until": float}`` (``argv``: the daemon's arguments, without the program;
``until``: the Unix time after which the host no longer waits: the request is then refused,
not forked) → a JSON line ``{"pid": int}`` (the daemon's) or ``{"error": str}``. The daemons
it forks are in sessions of their own and outlive it.

What a daemon takes from this server rather than from the host that asked for it: the
process state a command would inherit (umask, resource limits, cgroup, nice level), as the
server's starter had them. Its ``/proc/<pid>/cmdline`` is the daemon's command line as far
as the server's own argv and environment leave room for it (``setproctitle``: ~380 bytes, so
the last ``--root`` paths may be cut), and ``/proc/<pid>/environ`` holds what of the server's
environment that left (the agents' inherited variables, no credential); the daemon's
environment is the request's, in its memory.
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
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


def _read_request(conn: socket.socket) -> bytes:
    """The request's bytes, read within :data:`_READ_TIMEOUT` in all.

    Raises:
        ValueError: over :data:`MAX_REQUEST` bytes.
        TimeoutError: not all there in time.
    """
    buf = b""
    deadline = time.monotonic() + _READ_TIMEOUT
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request took too long")
        conn.settimeout(left)
        part = conn.recv(65536)
        if not part:
            break
        buf += part
        if len(buf) > MAX_REQUEST:
            raise ValueError(f"the request is over {MAX_REQUEST} bytes")
    return buf


def _child(argv: list[str], env: dict[str, str], cwd: str, log: str, keep_out: Sequence[int]) -> None:
    """In the forked child: become the daemon ``argv`` would start; never returns."""
    code = 1
    try:
        for fd in keep_out:  # the server's socket, connection and lock are not the daemon's
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


def _answer(conn: socket.socket, listener: socket.socket, lock_fd: int) -> None:
    """Serve one connection: check its peer, read its request, fork the daemon, answer."""
    _, uid, _ = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    if uid != os.getuid():
        conn.sendall(b'{"error": "another user"}\n')
        return
    try:
        argv, env, cwd, log = check_request(json.loads(_read_request(conn)))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSON's errors are ValueErrors
        conn.sendall(json.dumps({"error": str(exc)[:300]}).encode() + b"\n")
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as exc:
        conn.sendall(json.dumps({"error": f"fork failed: {exc}"}).encode() + b"\n")
        return
    if pid == 0:
        _child(argv, env, cwd, log, (listener.fileno(), conn.fileno(), lock_fd))
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")


def serve(args: argparse.Namespace) -> None:
    """Hold the lock, import the daemon, serve until idle or the socket is gone or replaced.

    Raises:
        SystemExit: 3 when another server holds the lock; 0 at SIGTERM.
        OSError: the socket cannot be bound (a path over 107 bytes, say).
    """
    lock_fd = os.open(args.lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(3)  # another serves: nothing heavy imported yet
    import sandbox_host.daemon.__main__  # noqa: F401 -- the point: imported once, forked many times
    try:
        import setproctitle  # noqa: F401 -- each child names itself with it
    except ImportError:
        pass
    from sandbox_host.providers import _inotify

    _inotify.libc()  # found once here (``ldconfig -p`` in a subprocess), not in every daemon

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        os.unlink(args.socket)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(args.socket)
    os.chmod(args.socket, 0o600)
    listener.listen(1024)  # a burst of starts (200 runs at once) queues, not refused
    listener.settimeout(1.0)
    bound = os.stat(args.socket).st_ino
    print(f"fork server {os.getpid()} listening on {args.socket}", flush=True)
    try:
        _accept(listener, args, bound, lock_fd)
    finally:
        try:
            if os.stat(args.socket).st_ino == bound:  # not a successor's
                os.unlink(args.socket)
        except FileNotFoundError:
            pass


def _accept(listener: socket.socket, args: argparse.Namespace, bound: int, lock_fd: int) -> None:
    last = time.monotonic()
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            try:
                if os.stat(args.socket).st_ino != bound:
                    return
            except FileNotFoundError:
                return
            if args.idle_exit and time.monotonic() - last > args.idle_exit:
                return
            continue
        last = time.monotonic()
        with conn:
            try:
                _answer(conn, listener, lock_fd)
            except Exception as exc:  # noqa: BLE001 -- one request's failure; the host falls back
                print(f"fork server: a request failed: {type(exc).__name__}: {str(exc)[:300]}",
                      file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m sandbox_host.daemon.forkserver``: :func:`serve` with the command line."""
    serve(parse_args(argv))


if __name__ == "__main__":
    main()
