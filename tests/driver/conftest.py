"""Driver test fixtures: a real coordinator subprocess, real host subprocesses, real
etcd and nats-server (the session's shared ones), each cluster isolated by a unique etcd
prefix, stream, subject prefix and transcripts bucket.
"""
from __future__ import annotations

import asyncio
import json
import pathlib
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import grpc
import pytest

from baton.coordinator_client import CoordinatorClient
from baton.log import DeliveryLog, LogConfig, TranscriptStore
from baton_tools.testing.cluster import HostProcess, start_coordinator, start_host, start_together
from baton_tools.testing.servers import EtcdServer, NatsServer
from baton.v1 import runs_pb2, sandbox_host_pb2, sandbox_host_pb2_grpc
from tests.conftest import REPO, assert_eventually, unique

CORPUS = REPO / "corpus"  # the repository's own recorded journals
GRPC_OPTIONS = [("grpc.enable_http_proxy", 0)]
STATUS = {v: k for k, v in runs_pb2.RunStatus.items()}


def status_of(rec: runs_pb2.RunRecord) -> str:
    return STATUS[rec.status].removeprefix("RUN_STATUS_").lower()


@dataclass
class Cluster:
    """One isolated baton control + data plane for a test module."""

    tmp: pathlib.Path
    coordinator: Any
    cc: CoordinatorClient
    log: DeliveryLog
    transcripts: TranscriptStore
    cfg: LogConfig
    env: dict[str, str]
    hosts: list[HostProcess] = field(default_factory=list)
    prefix: str = ""
    etcd_endpoint: str = ""
    _channels: dict[str, grpc.aio.Channel] = field(default_factory=dict)

    def stub(self, host: HostProcess | str) -> sandbox_host_pb2_grpc.SandboxHostStub:
        addr = host if isinstance(host, str) else host.address
        ch = self._channels.get(addr)
        if ch is None:
            ch = self._channels[addr] = grpc.aio.insecure_channel(addr, options=GRPC_OPTIONS)
        return sandbox_host_pb2_grpc.SandboxHostStub(ch)

    async def add_host(self, **settings: Any) -> HostProcess:
        h = await self._start_host(len(self.hosts) + 1, **settings)
        self.hosts.append(h)
        return h

    async def add_hosts(self, n: int) -> None:
        """Start ``n`` hosts at once (``h<i>-…`` in order); none is left running on a failure."""
        first = len(self.hosts) + 1
        self.hosts += await start_together([self._start_host(first + i) for i in range(n)])

    async def _start_host(self, number: int, **settings: Any) -> HostProcess:
        return await start_host(self.coordinator.address, self.env["BATON_NATS_URL"], log_dir=self.tmp / "logs",
                                host_id=f"h{number}-{uuid.uuid4().hex[:4]}", **{**self.env, **settings})

    async def start_run(self, host: HostProcess, journal: str, *, speed: float = 1.0, delay: float = 0.0,
                        run_id: str | None = None, thread_id: str | None = None, messages: list[Any] | None = None,
                        cancel_on_disconnect: bool = False, keep_sandbox: bool = False,
                        extra: dict[str, Any] | None = None) -> sandbox_host_pb2.StartRunResponse:
        opts = {"journal": str(CORPUS / journal), "speed": speed, "delay": delay, **(extra or {})}
        req = sandbox_host_pb2.StartRunRequest(
            run_id=run_id or unique("run-"), thread_id=thread_id or unique("thr-"),
            agent=runs_pb2.AgentSpec(kind="replay", options_json=json.dumps(opts)),
            messages_json=json.dumps(messages if messages is not None else
                                     [{"id": "u1", "role": "user", "content": "replay it"}]),
            cancel_on_disconnect=cancel_on_disconnect, keep_sandbox=keep_sandbox)
        return await self.stub(host).StartRun(req, timeout=15, wait_for_ready=True)

    async def record(self, run_id: str) -> runs_pb2.RunRecord:
        return (await self.cc.get_run(run_id)).record

    async def wait_status(self, run_id: str, status: str, timeout: float = 30.0) -> runs_pb2.RunRecord:
        async def check() -> runs_pb2.RunRecord:
            rec = await self.record(run_id)
            assert status_of(rec) == status, (f"status {status_of(rec)}, want {status} (error "
                                              f"{rec.error.code or '-'}: {rec.error.message or '-'}, "
                                              f"epoch {rec.driver_epoch} on {rec.driver_host or '-'})")
            return rec

        return await assert_eventually(check, timeout=timeout, interval=0.05)

    async def read_all(self, run_id: str, after: str = "-1", timeout: float = 60.0) -> list[tuple[str, dict[str, Any]]]:
        """Every chunk until the log closes (a reader connected the whole time)."""
        out: list[tuple[str, dict[str, Any]]] = []

        async def go() -> None:
            async with self.log.read(run_id, after=after) as r:
                async for off, chunk in r:
                    out.append((off, chunk))

        async with asyncio.timeout(timeout):
            await go()
        return out

    async def close(self) -> None:
        for h in self.hosts:
            h.sigcont()
        await asyncio.gather(*(h.stop(timeout=10) for h in self.hosts), return_exceptions=True)
        for ch in self._channels.values():
            await ch.close()
        await self.cc.close()
        await self.log.close()
        await self.coordinator.stop()


async def make_cluster(etcd: EtcdServer, nats: NatsServer, tmp: pathlib.Path, *, hosts: int = 2,
                       **settings: Any) -> Cluster:
    tag = unique("d")
    env = {
        "BATON_NATS_URL": nats.url,
        "BATON_RUNS_STREAM": f"RUNS_{tag}",
        "BATON_SUBJECT_PREFIX": f"baton.{tag}",
        "BATON_THREADS_BUCKET": f"threads-{tag}",
        "BATON_JOURNAL_DIR": str(tmp / "journals"),
        "BATON_SANDBOX_DIR": str(tmp / "sandboxes"),
        "BATON_REPLAY_DIRS": str(CORPUS),
        "BATON_SESSION_TTL": "2",
        "BATON_ATTACH_WAIT": "3",
        "BATON_CANCEL_GRACE": "2",
        "BATON_LOG_LEVEL": "INFO",
    }
    env.update({k: str(v) for k, v in settings.items()})
    cfg = LogConfig.from_env(env)
    coord = await start_coordinator(etcd.endpoint, f"/{tag}/", log_dir=tmp / "logs",
                                    BATON_SESSION_TTL="2", BATON_REAPER_INTERVAL="0",
                                    BATON_ELECTION_TTL="2")
    cc = CoordinatorClient(coord.address)
    dlog = await DeliveryLog.connect(nats.url, cfg)
    await dlog.provision()
    c = Cluster(tmp, coord, cc, dlog, TranscriptStore(dlog.nc, cfg), cfg, env, prefix=f"/{tag}/",
                etcd_endpoint=etcd.endpoint)
    await c.add_hosts(hosts)
    return c


@pytest.fixture(scope="module")
async def cluster(etcd: EtcdServer, nats: NatsServer, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    """Coordinator + two hosts, shared by a test module."""
    c = await make_cluster(etcd, nats, tmp_path_factory.mktemp("cluster"))
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
async def hostless(etcd: EtcdServer, nats: NatsServer, tmp_path: pathlib.Path) -> AsyncIterator[Cluster]:
    """Coordinator, log and transcripts with no host: the test drives its runs itself."""
    c = await make_cluster(etcd, nats, tmp_path, hosts=0)
    try:
        yield c
    finally:
        await c.close()


def normalize(chunks: list[dict[str, Any]], run_id: str, thread_id: str) -> list[str]:
    """Chunks as canonical JSON with this run's ids replaced (to compare two runs)."""
    out = []
    for c in chunks:
        s = json.dumps(c, sort_keys=True, ensure_ascii=False)
        out.append(s.replace(run_id, "<run>").replace(thread_id, "<thread>"))
    return out


def normalize_obj(value: Any, run_id: str, thread_id: str) -> Any:
    s = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return json.loads(s.replace(run_id, "<run>").replace(thread_id, "<thread>"))
