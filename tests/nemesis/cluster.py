"""The nemesis's cluster and its hands: every process of a replicated cluster, every link
through a proxy, and each fault kind of :mod:`tests.nemesis.schedule` applied and healed.

The cluster: a 3-member etcd, a 3-node JetStream cluster (the delivery log at R3), two
coordinators (one leads, the other stands by), three sandbox hosts and a gateway, each a
process of its own (:class:`~tests.faults.harness.FaultCluster`'s launchers). Every link a
client dials (coordinator → each etcd member, host → each coordinator and each NATS node,
gateway → each coordinator and each NATS node) goes through a
:class:`~baton_tools.testing.proxy.TcpProxy` of its own, so a partition between two services
holds that link's bytes, one way or both, and latency and resets apply to one link.

Stand-ins, said plainly (docs/development.md "The nemesis"):

- Partitions, latency and loss are made in the proxies, not with network namespaces and
  ``tc netem``: every service binds loopback, and this machine's kernel has no ``netem``
  qdisc. "Loss" is a link that resets its connections (the loss TCP cannot hide); the
  links a coordinator or gateway dials back to a host (its advertised address), and the
  etcd peer and NATS route links, are not proxied.
- Clock skew is libfaketime (``LD_PRELOAD``) on every coordinator and host: a per-process
  file holds the offset (``FAKETIME_TIMESTAMP_FILE``), read again each second; the
  monotonic clock is left alone (a real skew moves the wall clock).
- A full disk is a small tmpfs under each NATS node's JetStream store, filled by a file
  (root only; without root the kind is not drawn).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import signal
import subprocess
import threading
import urllib.request
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from baton.retry import Deadline, retry
from baton_tools.testing.cluster import CoordinatorProcess, GatewayProcess, HostProcess, start_coordinator, \
    start_gateway
from baton_tools.testing.proxy import TcpProxy
from baton_tools.testing.replicated import EtcdCluster, NatsCluster, _NatsNode
from tests.faults.harness import CORPUS, FaultCluster
from tests.nemesis.schedule import KINDS, Fault, Topology

FAKETIME = pathlib.Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
#: tmpfs size under each NATS node's JetStream store (the disk_full kind fills it).
STORE_MB = 256
SESSION_TTL = 5.0


def available_kinds() -> tuple[str, ...]:
    """The fault kinds this machine can inject: ``skew`` needs libfaketime, ``disk_full``
    root (a tmpfs mount)."""
    kinds = list(KINDS)
    if not FAKETIME.exists():
        kinds.remove("skew")
    if os.geteuid() != 0:
        kinds.remove("disk_full")
    return tuple(kinds)


@dataclass
class _Node(_NatsNode):
    """A JetStream cluster node that does not tell clients about its peers: a client then
    dials only the proxies it was given (never a node's real port, around a partition)."""

    def _argv(self) -> list[str]:
        return [*super()._argv(), "--no_advertise"]


class _Nats(NatsCluster):
    def __init__(self, data_dir: pathlib.Path) -> None:
        super().__init__(data_dir)
        self.nodes = [_Node(n.data_dir, port=n.port, node=n.node, cluster_port=n.cluster_port, routes=n.routes)
                      for n in self.nodes]


class _ProxyLoop:
    """The links' proxies on an event loop of their own thread: the test's loop (readers,
    translations, checks, asyncio's debug mode) must not slow the cluster's own traffic on a
    loaded machine (it did: gRPC connects through the proxies timed out)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="nemesis-proxies", daemon=True)
        self.thread.start()

    async def call(self, coro: Any) -> Any:
        """Run ``coro`` on the proxies' loop; its result."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def hold(self, proxy: TcpProxy, *ways: str) -> None:
        self.loop.call_soon_threadsafe(proxy.hold, *ways)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()


class NemesisCluster(FaultCluster):
    """The whole cluster of the module docstring. :meth:`inject` applies one fault and
    returns once it healed; :meth:`heal_all` ends every fault (the calm tail)."""

    def __init__(self, tmp: pathlib.Path, name: str, topology: Topology) -> None:
        super().__init__(tmp, name)
        self.topology = topology
        self.coordinators: list[CoordinatorProcess] = []
        self.proxies: dict[str, TcpProxy] = {}
        self.px = _ProxyLoop()
        self.clock_files: dict[str, pathlib.Path] = {}
        self.mounts: list[pathlib.Path] = []
        #: Errors of the nemesis itself (a restart that failed and was retried).
        self.trouble: list[str] = []
        #: A replay directory beside the corpus: the journals whose agent asks for approval
        #: (:func:`tests.nemesis.approvals.approval_journal`).
        self.replay_extra = tmp / "approvals"
        self.replay_extra.mkdir(parents=True, exist_ok=True)

    # --- start and stop ---------------------------------------------------------------------

    async def start_all(self) -> "NemesisCluster":
        """Start the engines, the proxies and every service; returns once the gateway is ready."""
        topo = self.topology
        assert topo.etcd == 3 and topo.nats == 3, "the nemesis cluster is 3 etcd members and 3 NATS nodes"
        self.etcd = EtcdCluster(self.tmp / "etcd")  # type: ignore[assignment]
        self.nats = _Nats(self.tmp / "nats")
        if "disk_full" in topo.kinds:
            for n in self.nats.nodes:  # type: ignore[attr-defined]
                store = n.data_dir / "jetstream"
                store.mkdir(parents=True, exist_ok=True)
                subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={STORE_MB}m", "tmpfs", str(store)], check=True)
                self.mounts.append(store)
        await asyncio.gather(asyncio.to_thread(self.etcd.start), asyncio.to_thread(self.nats.start))
        for link in topo.links:  # the engines' links first: a coordinator's port is known once it runs
            if "->coordinator-" not in link:
                self.proxies[link] = await self.px.call(TcpProxy(self._port_of(link.split("->")[1])).start())
        logs = self.tmp / "logs"
        token = f"nemesis-token-{self.tag}"
        self.env = {
            "BATON_INTERNAL_TOKEN": token, "BATON_RUNS_STREAM": f"RUNS_{self.tag}",
            "BATON_SUBJECT_PREFIX": f"baton.{self.tag}", "BATON_THREADS_BUCKET": f"threads-{self.tag}",
            "BATON_REPLAY_DIRS": f"{CORPUS}:{self.replay_extra}", "BATON_SESSION_TTL": str(SESSION_TTL), "BATON_LOG_LEVEL": "INFO",
            "BATON_LOG_REPLICAS": "3",
        }
        await self._jetstream_ready()
        # The coordinators side by side (neither waits for the other to serve): a cluster's
        # start is paid three times per `make test-nemesis`. The gateway after the hosts: on
        # a loaded machine its start beside theirs timed out on NATS.
        self.coordinators = list(await asyncio.gather(*(self._coordinator(i, token) for i in range(topo.coordinators))))
        self.coordinator = self.coordinators[0]
        for link in topo.links:
            if "->coordinator-" in link:
                self.proxies[link] = await self.px.call(TcpProxy(self._port_of(link.split("->")[1])).start())
        self.hosts = list(await asyncio.gather(*(self._host(h) for h in range(topo.hosts))))
        self.gateway = await start_gateway(self._dial("gateway", "coordinator"), self._nats_url("gateway"),
                                           log_dir=logs, **{**self.env, "BATON_SSE_KEEPALIVE": "1"})
        return self

    async def _coordinator(self, i: int, token: str) -> CoordinatorProcess:
        name = f"coordinator-{i}"
        etcd = ",".join(self.proxies[f"{name}->etcd-{e}"].endpoint for e in range(self.topology.etcd))
        settings = {"detached_run_ttl": 3600, "reaper_interval": 5, "session_ttl": SESSION_TTL, "election_ttl": 2,
                    "BATON_INTERNAL_TOKEN": token, "BATON_COORDINATOR_ID": f"{name}-{self.tag[:4]}",
                    **self._clock(name)}
        return await self._first_start(name, lambda: start_coordinator(etcd, f"/{self.tag}/", log_dir=self.tmp / "logs",
                                                                       **settings))

    async def _host(self, h: int) -> HostProcess:
        return await self._first_start(f"host-{h}", lambda: self._host_once(h))

    async def _first_start(self, name: str, start: Callable[[], Awaitable[Any]]) -> Any:
        """``start()`` tried five times: on a loaded machine a process's first dial of
        one that has just started can time out before it serves (not a fault yet)."""
        for attempt in range(5):
            try:
                return await start()
            except RuntimeError as exc:
                self.trouble.append(f"{name}: first start failed: {str(exc)[:300]}")
                if attempt == 4:
                    raise
        raise AssertionError("unreachable")

    async def _host_once(self, h: int) -> HostProcess:
        from baton_tools.testing.cluster import start_host

        name = f"host-{h}"
        return await start_host(self._dial(name, "coordinator"), self._nats_url(name), host_id=f"h{h}-{self.tag[:4]}",
                                log_dir=self.tmp / "logs", **{
                                    **self.env, **self._clock(name),
                                    "BATON_JOURNAL_DIR": str(self.tmp / "journals"),
                                    "BATON_SANDBOX_DIR": str(self.sandbox_dir),
                                    "BATON_ATTACH_WAIT": "3", "BATON_CANCEL_GRACE": "1"})

    def _clock(self, name: str) -> dict[str, str]:
        """The libfaketime settings of process ``name`` (none without libfaketime)."""
        if "skew" not in self.topology.kinds:
            return {}
        f = self.tmp / "clocks" / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("+0\n")
        self.clock_files[name] = f
        return {"LD_PRELOAD": str(FAKETIME), "FAKETIME_TIMESTAMP_FILE": str(f), "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                "FAKETIME_CACHE_DURATION": "1"}

    def _dial(self, client: str, kind: str) -> str:
        return ",".join(p.endpoint for link, p in self.proxies.items()
                        if link.startswith(f"{client}->{kind}-"))

    def _nats_url(self, client: str) -> str:
        return ",".join(f"nats://{ep}" for ep in self._dial(client, "nats").split(","))

    def _port_of(self, server: str) -> int:
        kind, _, i = server.partition("-")
        if kind == "etcd":
            return int(self.etcd.members[int(i)].port)  # type: ignore[attr-defined]
        if kind == "nats":
            return int(self.nats.nodes[int(i)].port)  # type: ignore[attr-defined]
        return self.coordinators[int(i)].port

    async def close(self) -> None:
        """Heal, stop every process and proxy, unmount the stores."""
        with contextlib.suppress(Exception):
            await self.heal_all()
        for c in self.coordinators[1:]:
            c.resume()
            await c.stop(timeout=5)
        await super().close()
        for p in self.proxies.values():
            await self.px.call(p.close())
        self.px.stop()
        for m in self.mounts:
            subprocess.run(["umount", "-l", str(m)], check=False)

    # --- the processes -------------------------------------------------------------------------

    def _proc(self, name: str) -> Any:
        kind, _, i = name.partition("-")
        if kind == "etcd":
            return self.etcd.members[int(i)]  # type: ignore[attr-defined]
        if kind == "nats":
            return self.nats.nodes[int(i)]  # type: ignore[attr-defined]
        if kind == "coordinator":
            return self.coordinators[int(i)]
        if kind == "host":
            return self.hosts[int(i)]
        return self.gateway

    async def _start(self, name: str) -> None:
        """Start process ``name`` again (same ports, data, id); retried for a minute (a
        restart can race a port still held, or a quorum not back yet)."""
        p = self._proc(name)

        async def start() -> None:
            try:
                if isinstance(p, (CoordinatorProcess, HostProcess, GatewayProcess)):
                    await p.start()
                else:
                    await asyncio.to_thread(p.start)
            except Exception as exc:  # noqa: BLE001 - the nemesis's own trouble, kept and retried
                self.trouble.append(f"{name}: start failed: {str(exc)[:300]}")
                raise

        await retry(start, deadline=Deadline.after(60), retry_on=(Exception,), first_pause=0.5, max_pause=2.0)

    async def _kill(self, name: str) -> None:
        p = self._proc(name)
        if isinstance(p, (CoordinatorProcess, HostProcess, GatewayProcess)):
            await p.kill()
        else:
            await asyncio.to_thread(p.kill)

    async def _stop(self, name: str) -> None:
        p = self._proc(name)
        if isinstance(p, (CoordinatorProcess, HostProcess, GatewayProcess)):
            await p.stop()
        else:
            await asyncio.to_thread(p.stop)

    def _signal(self, name: str, sig: int) -> None:
        proc = self._proc(name).proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)

    # --- faults ----------------------------------------------------------------------------------

    async def inject(self, f: Fault) -> None:
        """Apply ``f``, wait its duration, heal it."""
        if f.kind == "kill":
            await self._kill(f.target)
            await asyncio.sleep(f.duration)
            await self._start(f.target)
        elif f.kind == "pause":
            self._signal(f.target, signal.SIGSTOP)
            try:
                await asyncio.sleep(f.duration)
            finally:
                self._signal(f.target, signal.SIGCONT)
        elif f.kind == "restart":
            await self._stop(f.target)
            await self._start(f.target)
        elif f.kind == "partition":
            proxy = self.proxies[f.target]
            self.px.hold(proxy, *{"both": ("up", "down"), "up": ("up",), "down": ("down",)}[f.direction])
            try:
                await asyncio.sleep(f.duration)
            finally:
                self.px.hold(proxy)
        elif f.kind == "latency":
            proxy = self.proxies[f.target]
            proxy.latency = f.param
            try:
                await asyncio.sleep(f.duration)
            finally:
                proxy.latency = 0.0
        elif f.kind == "reset":
            await self.px.call(self.proxies[f.target].blip(f.duration))
        elif f.kind == "skew":
            self.set_clock(f.target, f.param)
            await asyncio.sleep(f.duration)
            if f.direction == "back":
                self.set_clock(f.target, 0.0)
        elif f.kind == "disk_full":
            filler = self._proc(f.target).data_dir / "jetstream" / "nemesis-filler"
            await asyncio.to_thread(_fill, filler)
            try:
                await asyncio.sleep(f.duration)
            finally:
                filler.unlink(missing_ok=True)
            # nats-server disables JetStream on a node after a write error on its store
            # ("JetStream out of resources, will be DISABLED") until it restarts: the
            # operator's part of the heal, room made and the node restarted.
            await self._stop(f.target)
            await self._start(f.target)
        else:
            raise ValueError(f"unknown fault kind {f.kind}")

    def set_clock(self, name: str, offset: float) -> None:
        """Move process ``name``'s wall clock ``offset`` seconds from the real one."""
        self.clock_files[name].write_text(f"{offset:+.0f}\n")

    async def heal_all(self) -> None:
        """End every fault: every process running and resumed, every link clear, every
        clock true, every store with room."""
        for name in self.topology.processes:
            self._signal(name, signal.SIGCONT)
        for p in self.proxies.values():
            self.px.hold(p)
            p.latency = 0.0
            p.down = False
        for name in self.clock_files:
            self.set_clock(name, 0.0)
        for m in self.mounts:
            (m / "nemesis-filler").unlink(missing_ok=True)
        for name in self.topology.processes:
            p = self._proc(name)
            if p is not None and (p.proc is None or p.proc.poll() is not None):
                await self._start(name)

    # --- what is left --------------------------------------------------------------------------

    def claims_left(self) -> list[str]:
        """Run ids with a claim in etcd (read over a member's v3 JSON gateway)."""
        import base64

        prefix = f"/{self.tag}/claims/".encode()
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        body = json.dumps({"key": base64.b64encode(prefix).decode(), "range_end": base64.b64encode(end).decode(),
                           "keys_only": True}).encode()
        for m in self.etcd.members:  # type: ignore[attr-defined]
            try:
                req = urllib.request.Request(f"http://{m.endpoint}/v3/kv/range", data=body,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=3) as r:
                    kvs = json.loads(r.read()).get("kvs", [])
                return [base64.b64decode(kv["key"])[len(prefix):].decode(errors="replace") for kv in kvs]
            except OSError:
                continue
        raise RuntimeError("no etcd member answered")


def _fill(path: pathlib.Path) -> None:
    """Write zeros to ``path`` until its file system is full."""
    block = b"\0" * (1 << 20)
    with contextlib.suppress(OSError), open(path, "wb") as f:
        while True:
            f.write(block)
            f.flush()

