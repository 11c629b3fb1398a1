"""``python -m gateway`` with ``BATON_GATEWAY_WORKERS`` > 1: start N worker processes that
serve one HTTP port (and one gRPC port) together, keep them running, stop them together.

The ports are shared with ``SO_REUSEPORT``: every worker binds the same address and the
kernel spreads new connections over the workers that listen (by the connection's
addresses). A worker listens only once its app has started (uvicorn runs the lifespan
before it listens on the socket it is given; the gRPC server starts last in the lifespan),
so no connection lands on a worker that cannot serve it. A port given as 0 is chosen here
first: the supervisor binds it (``SO_REUSEPORT``, never listening, so it takes no
connection) and holds it, so the port stays this gateway's while workers come and go.

The supervisor itself serves nothing. It:

- restarts a worker that dies (:class:`gateway._workers.RestartPolicy`); while one is down
  the others serve, and the readers it served reconnect (to another worker) and resume
  from their ``Last-Event-ID``;
- on SIGTERM/SIGINT sends SIGTERM to every worker (each drains as a lone gateway does:
  not ready, stop accepting, end its streams, close its session) and waits for them, at
  most ``drain`` seconds before SIGKILL;
- asks the kernel to SIGTERM the workers should the supervisor itself die
  (``PR_SET_PDEATHSIG``, Linux), so a SIGKILLed supervisor leaves no worker behind.
"""
from __future__ import annotations

import ctypes
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from types import FrameType
from typing import Callable

from gateway._workers import RestartPolicy, join_listen, split_listen

log = logging.getLogger("gateway.supervisor")

_PR_SET_PDEATHSIG = 1


def reserve_port(listen: str) -> tuple[str, socket.socket | None]:
    """Bind ``listen`` with ``SO_REUSEPORT`` (never listening) to hold its port for the
    workers; a port 0 becomes the free port the kernel chose.

    Returns:
        ``(host:port with the real port, the holding socket)``; ``("", None)`` for an empty
        ``listen`` (that port is off).

    Raises:
        OSError: the address cannot be bound (taken by a process that did not set
            ``SO_REUSEPORT``, or not an address of this machine).
    """
    if not listen:
        return "", None
    host, port = split_listen(listen)
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                      flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    return join_listen(host, sock.getsockname()[1]), sock


def shared_socket(listen: str) -> socket.socket:
    """A worker's HTTP socket: bound to ``listen`` with ``SO_REUSEPORT``, not yet
    listening (uvicorn's startup listens on it once the app has started).

    Raises:
        OSError: it cannot be bound.
    """
    _, sock = reserve_port(listen)
    assert sock is not None
    return sock


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the supervisor dies (a graceful drain)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the supervisor's own handlers only
        pass


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restart_at: float | None = None


@dataclass
class Supervisor:
    """N worker processes (see the module docstring).

    Attributes:
        workers: how many.
        command: the argv of worker ``i`` (``python -m gateway --worker i/N ...``).
        env: the environment of worker ``i``.
        drain: seconds the workers have to stop after SIGTERM before SIGKILL.
        policy: when a dead worker is started again.
    """

    workers: int
    command: Callable[[int], list[str]]
    env: Callable[[int], dict[str, str]]
    drain: float = 15.0
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    _stop: int | None = None

    def run(self) -> int:
        """Run until SIGTERM/SIGINT (then 0) or until a worker cannot start (then 3).

        Blocks; installs SIGTERM, SIGINT and SIGCHLD handlers for its duration.
        """
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)}
        old_fd = signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGCHLD, lambda _s, _f: None)  # only to wake the select below
        workers = [_Worker(i) for i in range(self.workers)]
        code = 0
        try:
            for w in workers:
                self._spawn(w)
            while self._stop is None:
                now = time.monotonic()
                for w in workers:
                    if w.proc is not None and w.proc.poll() is not None:
                        code = self._died(w, now)
                        if code:
                            break
                    if w.restart_at is not None and w.restart_at <= now:
                        self._spawn(w)
                if code:
                    break
                due = [w.restart_at - now for w in workers if w.restart_at is not None]
                select.select([wake_r], [], [], max(0.0, min(due)) if due else None)
                _drain_pipe(wake_r)
            self._stop_all(workers, wake_r)
        finally:
            signal.set_wakeup_fd(old_fd)
            for s, h in previous.items():
                signal.signal(s, h)
            os.close(wake_r)
            os.close(wake_w)
        return code

    def _on_stop(self, sig: int, frame: FrameType | None) -> None:
        self._stop = sig

    def _spawn(self, w: _Worker) -> None:
        w.restart_at = None
        w.started = time.monotonic()
        w.proc = subprocess.Popen(self.command(w.index), env=self.env(w.index), stdin=subprocess.DEVNULL,
                                  preexec_fn=_die_with_parent)
        log.info("gateway worker %d/%d started (pid %d)", w.index, self.workers, w.proc.pid)

    def _died(self, w: _Worker, now: float) -> int:
        assert w.proc is not None
        rc, pid, w.proc = w.proc.returncode, w.proc.pid, None
        how = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
        delay = self.policy.died(w.index, now - w.started)
        if delay is None:
            log.error("gateway worker %d (pid %d) ended with %s right after it started, %d times in a row: "
                      "stopping the gateway", w.index, pid, how, self.policy.give_up_after)
            return 3
        log.warning("gateway worker %d (pid %d) ended with %s; starting it again in %.1fs", w.index, pid, how, delay)
        w.restart_at = now + delay
        return 0

    def _stop_all(self, workers: list[_Worker], wake_r: int) -> None:
        live = [w.proc for w in workers if w.proc is not None and w.proc.poll() is None]
        log.info("stopping %d gateway worker(s)", len(live))
        for p in live:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.drain
        while any(p.poll() is None for p in live):
            left = deadline - time.monotonic()
            if left <= 0:
                for p in live:
                    if p.poll() is None:
                        log.warning("gateway worker pid %d did not stop within %.0fs: SIGKILL", p.pid, self.drain)
                        p.kill()
                        p.wait()
                break
            select.select([wake_r], [], [], min(left, 0.5))  # SIGCHLD wakes it
            _drain_pipe(wake_r)


def _drain_pipe(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def worker_command(index: int, workers: int, listen: str, log_level: str) -> list[str]:
    """The argv of worker ``index`` of ``workers``."""
    return [sys.executable, "-m", "gateway", "--listen", listen, "--log-level", log_level,
            "--worker", f"{index}/{workers}"]
