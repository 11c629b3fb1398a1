"""Start baton services for tests, benchmarks and the demo.

:func:`start_coordinator` runs a coordinator as a real subprocess (``python -m coordinator``
with ``BATON_*`` env) on a free loopback port, or in-process; either way the handle has
``.address``, ``await .stop()``, ``await .kill()`` and ``await .restart()`` (same port, so
clients reconnect).
"""
from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Awaitable, Protocol, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from baton.tls import PLAINTEXT, GrpcTls, aio_channel, from_env as tls_from_env
from baton_tools.testing.servers import env_without_proxy, free_port

# CoordinatorConfig field → environment variable.
#: The checkout, put on the children's PYTHONPATH.
_REPO = pathlib.Path(__file__).resolve().parents[2]

_ENV_NAMES = {
    "replica_id": "BATON_COORDINATOR_ID",
    "etcd_timeout": "BATON_ETCD_TIMEOUT",
    "election_ttl": "BATON_ELECTION_TTL",
    "detached_run_ttl": "BATON_DETACHED_RUN_TTL",
    "reaper_interval": "BATON_REAPER_INTERVAL",
    "session_ttl": "BATON_SESSION_TTL",
    "log_level": "BATON_LOG_LEVEL",
}


class CoordinatorHandle(Protocol):
    address: str

    async def stop(self) -> None: ...
    async def kill(self) -> None: ...
    async def restart(self) -> None: ...


async def wait_serving(address: str, timeout: float = 30.0, alive: Any = None, tls: GrpcTls = PLAINTEXT) -> None:
    """Poll the gRPC health service at ``address`` until it reports SERVING.

    Args:
        alive: optional callable returning ``False`` when the server process died.
        tls: how to dial it (:mod:`baton.tls`; the server's ``BATON_TLS_*`` settings).

    Raises:
        TimeoutError: not serving within ``timeout`` seconds.
        RuntimeError: ``alive()`` turned false.
    """
    deadline = time.monotonic() + timeout
    # Reconnect at once: a channel whose first connect failed (the server not listening yet)
    # otherwise waits out grpc's reconnect backoff (1 s, then x1.6) before it tries again, and
    # every Check in between fails at once: a start seen up to seconds after it was ready.
    options = (("grpc.enable_http_proxy", 0), ("grpc.initial_reconnect_backoff_ms", 50),
               ("grpc.min_reconnect_backoff_ms", 50), ("grpc.max_reconnect_backoff_ms", 100))
    async with aio_channel(address, options, tls) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while True:
            if alive is not None and not alive():
                raise RuntimeError(f"server at {address} exited before serving")
            try:
                r = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"server at {address} not serving within {timeout}s")
            await asyncio.sleep(0.05)


class CoordinatorProcess:
    """A coordinator subprocess. ``log_path`` holds its stdout and stderr."""

    def __init__(self, env: dict[str, str], port: int, log_path: pathlib.Path) -> None:
        self.env = env
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def _spawn(self) -> subprocess.Popen[bytes]:
        # A fork/exec and a local log file: quick, like the other launchers' _spawn.
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "coordinator"], env=self.env, stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        return self.proc

    async def start(self, timeout: float = 60.0) -> None:
        """Start (or restart) on the same port; returns once it reports SERVING."""
        if self.proc is not None and self.proc.poll() is None:
            return
        proc = self._spawn()
        try:
            await wait_serving(self.address, timeout, alive=lambda: proc.poll() is None, tls=tls_from_env(self.env))
        except (RuntimeError, TimeoutError) as exc:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            await self.kill()
            raise RuntimeError(f"{exc}\n--- coordinator log ---\n{tail}") from exc

    async def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (graceful shutdown), then SIGKILL after ``timeout`` seconds."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(self.proc.wait, timeout)
        except subprocess.TimeoutExpired:
            await self.kill()

    async def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.kill()
        await asyncio.to_thread(self.proc.wait)

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    def pause(self) -> None:
        """SIGSTOP (a frozen process: its sockets stay open, nothing answers)."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)

    async def __aenter__(self) -> "CoordinatorProcess":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class InProcessCoordinator:
    """A coordinator inside this event loop (faster to start; no process boundary)."""

    def __init__(self, config: Any, **server_kwargs: Any) -> None:
        self.config = config
        self.server_kwargs = server_kwargs
        self.server: Any = None
        self.address = config.listen

    async def start(self) -> None:
        from coordinator import CoordinatorServer

        if self.server is not None:
            return
        self.server = CoordinatorServer(self.config, **self.server_kwargs)
        await self.server.start()
        await wait_serving(self.address, 10.0)

    async def stop(self) -> None:
        if self.server is not None:
            server, self.server = self.server, None
            await server.shutdown()

    async def kill(self) -> None:
        """As close to a crash as in-process allows: no grace period."""
        if self.server is not None:
            server, self.server = self.server, None
            await server.shutdown(grace=0)

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def __aenter__(self) -> "InProcessCoordinator":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def start_coordinator(etcd_endpoint: str, prefix: str, *, in_process: bool = False,
                            log_dir: str | os.PathLike[str] | None = None,
                            repo: str | os.PathLike[str] | None = None,
                            **settings: Any) -> CoordinatorProcess | InProcessCoordinator:
    """Start a coordinator on a free loopback port against ``etcd_endpoint``.

    Args:
        etcd_endpoint: ``host:port`` of etcd (comma-separated for several).
        prefix: etcd key prefix (use a unique one per test).
        in_process: run inside this event loop instead of a subprocess.
        log_dir: where the subprocess log goes (default: a temp dir).
        repo: the source tree the subprocess imports (default: this checkout; a bench
            runs another revision's processes side by side with it).
        **settings: CoordinatorConfig fields (``detached_run_ttl=5``, ``election_ttl=2``,
            ``replica_id="a"``...) or raw ``BATON_*`` names; for ``in_process`` also
            CoordinatorServer keyword arguments (``leader_tasks``, ``reaper``, ``store``).

    Returns:
        A started handle (``.address``, ``await .stop()/.kill()/.restart()``).
    """
    port = free_port()
    if in_process:
        from coordinator import CoordinatorConfig

        server_kwargs = {k: settings.pop(k) for k in ("leader_tasks", "reaper", "store") if k in settings}
        # No metrics listener unless asked (metrics_listen="127.0.0.1:0"): the default port
        # would collide between coordinators of concurrent tests.
        settings.setdefault("metrics_listen", "")
        cfg = CoordinatorConfig.from_env(env_without_proxy()).with_overrides(
            listen=f"127.0.0.1:{port}", etcd_endpoints=tuple(etcd_endpoint.split(",")), prefix=prefix,
            replica_id=settings.pop("replica_id", None) or f"inproc-{port}", **settings)
        h: CoordinatorProcess | InProcessCoordinator = InProcessCoordinator(cfg, **server_kwargs)
        await h.start()
        return h
    env = env_without_proxy()
    env.update({
        "BATON_COORDINATOR_LISTEN": f"127.0.0.1:{port}",
        "BATON_ETCD_ENDPOINTS": etcd_endpoint,
        "BATON_ETCD_PREFIX": prefix,
        "BATON_COORDINATOR_ID": f"coordinator-{port}",
        # Any free port unless a test names one (the default would collide between tests).
        "BATON_COORDINATOR_METRICS_LISTEN": "127.0.0.1:0",
        "PYTHONUNBUFFERED": "1",
    })
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo or _REPO), env.get("PYTHONPATH", "")) if p)
    for k, v in settings.items():
        env[k if k.startswith("BATON_") else _ENV_NAMES.get(k, f"BATON_{k.upper()}")] = str(v)
    d = pathlib.Path(log_dir) if log_dir is not None else pathlib.Path(tempfile.mkdtemp(prefix="baton-coord-"))
    d.mkdir(parents=True, exist_ok=True)
    proc = CoordinatorProcess(env, port, d / f"coordinator-{port}.log")
    await proc.start()
    return proc


# --- sandbox hosts -------------------------------------------------------------------------


class _ServiceProcess:
    """What the host and gateway subprocess handles share: spawn, signals, log, context."""

    module = ""

    def __init__(self, env: dict[str, str], port: int, log_path: pathlib.Path) -> None:
        self.env = env
        self.port = port
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _spawn(self) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module], env=self.env, stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        return self.proc

    async def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (a graceful shutdown), then SIGKILL after ``timeout`` seconds."""
        if not self.alive:
            return
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)  # a paused process cannot shut down
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(self.proc.wait, timeout)
        except subprocess.TimeoutExpired:
            await self.kill()

    async def kill(self) -> None:
        """SIGKILL, as a crash."""
        if not self.alive:
            return
        assert self.proc is not None
        self.proc.kill()
        await asyncio.to_thread(self.proc.wait)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    async def __aenter__(self) -> "_ServiceProcess":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class HostProcess(_ServiceProcess):
    """A sandbox host subprocess (``python -m sandbox_host``). ``log_path`` holds its output.

    Attributes:
        address: ``127.0.0.1:<port>`` of its ``baton.v1.SandboxHost`` service.
        host_id: its host id.
        pid: the process id (``None`` before :meth:`start`).
    """

    module = "sandbox_host"

    def __init__(self, env: dict[str, str], port: int, host_id: str, log_path: pathlib.Path) -> None:
        super().__init__(env, port, log_path)
        self.address = f"127.0.0.1:{port}"
        self.host_id = host_id

    async def start(self, timeout: float = 60.0) -> None:
        """Start (or restart, same port and id); returns once it reports SERVING."""
        if self.alive:
            return
        proc = self._spawn()
        try:
            await wait_serving(self.address, timeout, alive=lambda: proc.poll() is None, tls=tls_from_env(self.env))
        except (RuntimeError, TimeoutError) as exc:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            await self.kill()
            raise RuntimeError(f"{exc}\n--- host log ---\n{tail}") from exc

    async def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (drain: hand every run over), then SIGKILL after ``timeout`` seconds.

        A SIGKILL leaves the host's agents alive: they run in their own sessions."""
        await super().stop(timeout)

    def kill_now(self) -> None:
        """SIGKILL and reap at once (for kill points inside a tight read loop: no await)."""
        if self.alive:
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()  # a SIGKILLed process is gone within milliseconds

    def sigstop(self) -> None:
        """SIGSTOP: frozen, sockets open, session keep-alives stop."""
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGSTOP)

    def sigcont(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)



async def start_together(starts: Sequence[Awaitable[HostProcess]]) -> list[HostProcess]:
    """Await host starts at once; the hosts in the order given.

    Raises:
        The first start's error; the hosts that did start are killed first (none is left
        running for nobody).
    """
    started = await asyncio.gather(*starts, return_exceptions=True)
    failed = [r for r in started if isinstance(r, BaseException)]
    if failed:
        await asyncio.gather(*(r.kill() for r in started if isinstance(r, HostProcess)))
        raise failed[0]
    return [r for r in started if isinstance(r, HostProcess)]


async def start_host(coordinator: str, nats_url: str, *, host_id: str | None = None,
                     log_dir: str | os.PathLike[str] | None = None,
                     repo: str | os.PathLike[str] | None = None, **settings: Any) -> HostProcess:
    """Start a sandbox host subprocess on a free loopback port.

    Args:
        coordinator: coordinator address(es), comma-separated.
        nats_url: NATS URL.
        host_id: the host id (default ``host-<port>``).
        log_dir: where the host log goes (default: a temp dir).
        repo: the source tree the subprocess imports (default: this checkout).
        **settings: ``BATON_*`` variables (``BATON_RUNS_STREAM="S1"``...) or their short
            lower-case names (``runs_stream="S1"``, ``session_ttl=2``, ``journal_dir=...``).

    Returns:
        A started :class:`HostProcess` (``.address``, ``.host_id``, ``.pid``, ``.kill()``,
        ``.stop()``, ``.sigstop()`` / ``.sigcont()``).
    """
    port = free_port()
    hid = host_id or f"host-{port}"
    env = env_without_proxy()
    env.update({
        "BATON_COORDINATOR": coordinator,
        "BATON_NATS_URL": nats_url,
        "BATON_HOST_LISTEN": f"127.0.0.1:{port}",
        "BATON_HOST_ADVERTISE": f"127.0.0.1:{port}",
        "BATON_HOST_ID": hid,
        "BATON_HOST_METRICS_LISTEN": "127.0.0.1:0",  # any free port unless a test names one
        "PYTHONUNBUFFERED": "1",
    })
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo or _REPO), env.get("PYTHONPATH", "")) if p)
    for k, v in settings.items():
        env[k if k.startswith("BATON_") else f"BATON_{k.upper()}"] = str(v)
    d = pathlib.Path(log_dir) if log_dir is not None else pathlib.Path(tempfile.mkdtemp(prefix="baton-host-"))
    d.mkdir(parents=True, exist_ok=True)
    h = HostProcess(env, port, hid, d / f"{hid}.log")
    await h.start()
    return h


# --- gateway -------------------------------------------------------------------------------


class GatewayProcess(_ServiceProcess):
    """A gateway subprocess (``python -m gateway``). ``log_path`` holds its output.

    Attributes:
        url: ``http://127.0.0.1:<port>`` (``https://`` with ``BATON_GATEWAY_TLS_CERT``).
        port: its HTTP port.
        pid: the process id (``None`` before :meth:`start`).
    """

    module = "gateway"

    def __init__(self, env: dict[str, str], port: int, log_path: pathlib.Path) -> None:
        super().__init__(env, port, log_path)
        self.url = f"{'https' if env.get('BATON_GATEWAY_TLS_CERT') else 'http'}://127.0.0.1:{port}"

    async def start(self, timeout: float = 30.0) -> None:
        """Start (or restart, same port); returns once ``/readyz`` answers 200 (it holds its
        session and listens)."""
        import httpx

        if self.alive:
            return
        proc = self._spawn()
        deadline = time.monotonic() + timeout
        # An HTTPS gateway's certificate is the test's to check: this only waits for it.
        async with httpx.AsyncClient(trust_env=False, timeout=1.0, verify=False) as http:
            while True:
                if not self.alive:
                    tail = self.log_path.read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"gateway exited with {proc.returncode}\n--- gateway log ---\n{tail}")
                try:
                    if (await http.get(f"{self.url}/readyz")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    tail = self.log_path.read_text(errors="replace")[-3000:]
                    await self.kill()
                    raise RuntimeError(f"gateway not ready within {timeout}s\n--- gateway log ---\n{tail}")
                await asyncio.sleep(0.05)



async def start_gateway(coordinator: str, nats_url: str, *, port: int | None = None,
                        log_dir: str | os.PathLike[str] | None = None, start_timeout: float = 30.0,
                        **settings: Any) -> GatewayProcess:
    """Start a gateway subprocess on a free loopback port (or ``port``).

    Args:
        coordinator: coordinator address(es), comma-separated.
        nats_url: NATS URL.
        port: the HTTP port (default: a free one).
        log_dir: where the gateway log goes (default: a temp dir).
        start_timeout: seconds it may take to answer ``/readyz`` (then it is killed).
        **settings: ``BATON_*`` variables or their short lower-case names
            (``sse_keepalive=0.5``, ``api_keys="k=tenant"``, ``replay_dirs=...``,
            ``runs_stream="S1"``).

    Returns:
        A started :class:`GatewayProcess` (``.url``, ``.stop()``, ``.kill()``).
    """
    port = port or free_port()
    env = env_without_proxy()
    env.update({
        "BATON_COORDINATOR": coordinator,
        "BATON_NATS_URL": nats_url,
        "BATON_GATEWAY_LISTEN": f"127.0.0.1:{port}",
        # Any free port for the gRPC API unless a test names one: the default (8081) would
        # collide between gateways of concurrent tests and suites.
        "BATON_GATEWAY_GRPC_LISTEN": "127.0.0.1:0",
        "BATON_GATEWAY_METRICS_LISTEN": "127.0.0.1:0",  # the same for the metrics listener
        "PYTHONUNBUFFERED": "1",
    })
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO), env.get("PYTHONPATH", "")) if p)
    for k, v in settings.items():
        env[k if k.startswith("BATON_") else f"BATON_{k.upper()}"] = str(v)
    d = pathlib.Path(log_dir) if log_dir is not None else pathlib.Path(tempfile.mkdtemp(prefix="baton-gateway-"))
    d.mkdir(parents=True, exist_ok=True)
    g = GatewayProcess(env, port, d / f"gateway-{port}.log")
    await g.start(start_timeout)
    return g
