"""Three-node etcd and three-node nats-server (JetStream clustered) on loopback.

For the fault suite's "replicated engines lose their leaders" case: each node is a
:class:`~baton_tools.testing.servers.EtcdServer` / ``NatsServer`` of its own (kill, start,
signals on ``.proc``), started together; :meth:`EtcdCluster.leader` and
:meth:`NatsCluster.stream_leader` name the node to SIGKILL.
"""
from __future__ import annotations

import asyncio
import json
import pathlib
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Coroutine

from baton_tools.testing.servers import EtcdServer, NatsServer, find_binary, free_port


@dataclass
class _EtcdMember(EtcdServer):
    member: str = ""
    initial_cluster: str = ""

    def _argv(self) -> list[str]:
        argv = super()._argv()
        argv[argv.index("--name") + 1] = self.member
        argv[argv.index("--initial-cluster") + 1] = self.initial_cluster
        return argv + ["--initial-cluster-state", "new", "--initial-cluster-token", "baton-test"]


class EtcdCluster:
    """Three etcd members. ``endpoints`` is the comma-separated client list."""

    def __init__(self, data_dir: pathlib.Path, size: int = 3, *, ports: list[int] | None = None,
                 peer_ports: list[int] | None = None) -> None:
        """``ports`` / ``peer_ports``: client and peer port of each member (free ones if
        omitted). A restart on the same data directory must reuse the peer ports: etcd
        keeps its members' peer URLs in its data."""
        peers = peer_ports or [free_port() for _ in range(size)]
        clients = ports or [free_port() for _ in range(size)]
        cluster = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, p in enumerate(peers))
        self.members = [_EtcdMember(data_dir / f"m{i}", port=c, peer_port=p, member=f"m{i}", initial_cluster=cluster)
                        for i, (c, p) in enumerate(zip(clients, peers))]

    @property
    def endpoints(self) -> str:
        return ",".join(m.endpoint for m in self.members)

    def start(self) -> None:
        """Start every member (together: each waits for a quorum before it is healthy)."""
        errors: list[BaseException] = []

        def go(m: EtcdServer) -> None:
            try:
                m.start()
            except BaseException as exc:  # noqa: BLE001 - re-raised below, in this thread
                errors.append(exc)

        threads = [threading.Thread(target=go, args=(m,)) for m in self.members]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            self.kill()
            raise errors[0]

    def leader(self, timeout: float = 10.0) -> EtcdServer:
        """The member that leads now (asked over the v3 JSON gateway)."""
        deadline = time.monotonic() + timeout
        while True:
            for m in self.members:
                if m.proc is None or m.proc.poll() is not None:
                    continue
                try:
                    req = urllib.request.Request(f"http://{m.endpoint}/v3/maintenance/status", data=b"{}",
                                                 headers={"Content-Type": "application/json"})
                    with urllib.request.urlopen(req, timeout=1) as r:
                        st = json.loads(r.read())
                except OSError:
                    continue
                if st.get("leader") and st.get("leader") == st.get("header", {}).get("member_id"):
                    return m
            if time.monotonic() > deadline:
                raise TimeoutError("no etcd leader")
            time.sleep(0.1)

    def kill(self) -> None:
        for m in self.members:
            m.kill()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every member."""
        for m in self.members:
            m.stop(timeout)


def _run(coro: "Coroutine[Any, Any, None]") -> BaseException | None:
    try:
        asyncio.run(coro)
    except BaseException as exc:  # noqa: BLE001 - handed to the calling thread, which raises it
        return exc
    return None


@dataclass
class _NatsNode(NatsServer):
    node: str = ""
    cluster_port: int = field(default_factory=free_port)
    routes: str = ""

    def _argv(self) -> list[str]:
        return [
            find_binary("nats-server"), "-a", "127.0.0.1", "-p", str(self.port), "-js",
            "-sd", str(self.data_dir / "jetstream"), "--server_name", self.node,
            "--cluster_name", "baton-test", "--cluster", f"nats://127.0.0.1:{self.cluster_port}",
            "--routes", self.routes,
        ]


class NatsCluster:
    """Three nats-servers forming one JetStream cluster. ``url`` lists every node."""

    def __init__(self, data_dir: pathlib.Path, size: int = 3, *, ports: list[int] | None = None,
                 cluster_ports: list[int] | None = None) -> None:
        """``ports`` / ``cluster_ports``: client and route port of each node (free ones if
        omitted)."""
        cports = cluster_ports or [free_port() for _ in range(size)]
        clients = ports or [free_port() for _ in range(size)]
        routes = ",".join(f"nats://127.0.0.1:{p}" for p in cports)
        self.nodes = [_NatsNode(data_dir / f"n{i}", port=c, node=f"n{i}", cluster_port=p, routes=routes)
                      for i, (c, p) in enumerate(zip(clients, cports))]

    @property
    def url(self) -> str:
        return ",".join(n.url for n in self.nodes)

    def start(self) -> None:
        """Start every node; returns once JetStream has a meta leader (an R3 stream can be
        created: until then every JetStream request is refused)."""
        for n in self.nodes:
            n.start()
        self.wait_jetstream()

    def wait_jetstream(self, timeout: float = 60.0) -> None:
        """Block until JetStream answers ``account_info`` through any node.

        Raises:
            TimeoutError: not within ``timeout`` seconds.
        """
        result: list[BaseException | None] = []
        # Its own event loop in its own thread: callable from sync code and from a running loop.
        thread = threading.Thread(target=lambda: result.append(_run(self._jetstream_ready(timeout))))
        thread.start()
        thread.join()
        if result and result[0] is not None:
            raise result[0]

    async def _jetstream_ready(self, timeout: float) -> None:  # noqa: ASYNC109 - a polling budget
        import nats

        deadline = time.monotonic() + timeout
        nc = await nats.connect(self.url.split(","), max_reconnect_attempts=-1, reconnect_time_wait=0.1)
        try:
            while True:
                try:
                    await nc.jetstream().account_info()
                    return
                except Exception as exc:  # noqa: BLE001 - not ready yet, whatever the reason
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"JetStream cluster not ready within {timeout}s: {exc!r}") from exc
                await asyncio.sleep(0.1)
        finally:
            await nc.close()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every node (each steps down its leaderships first)."""
        for n in self.nodes:
            n.stop(timeout)

    def node(self, name: str) -> NatsServer:
        return next(n for n in self.nodes if n.node == name)

    def kill(self) -> None:
        for n in self.nodes:
            n.kill()
