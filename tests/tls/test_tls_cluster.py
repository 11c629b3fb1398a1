"""A whole cluster with TLS on every link, certificates made at test time.

etcd requires client certificates (``--client-cert-auth``), nats-server verifies them
(``--tlsverify``), coordinators and hosts serve mutual TLS (``BATON_TLS_CLIENT_AUTH=1``, no
internal token), and the gateway serves HTTPS and TLS gRPC with a certificate of its own.
A run is read over the gateway while its host is SIGKILLed: another host takes it over and
the reader gets every chunk once. A plaintext client, a client trusting another CA and a
client with another CA's certificate are refused on each port.
"""
from __future__ import annotations

import asyncio
import pathlib
import ssl
import urllib.request
from dataclasses import dataclass
from typing import Any, AsyncIterator

import grpc
import httpx
import nats
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from baton import tls
from baton.coordinator_client import CoordinatorClient
from baton.errors import StoreUnavailable
from baton.grpc_client import RunsClient
from baton_tools.testing.cluster import start_coordinator, start_gateway, start_host, start_together
from baton_tools.testing.servers import EtcdServer, NatsServer, free_port
from coordinator._etcd import Etcd
from coordinator._etcd_auth import EtcdSecurity
from tests.conftest import assert_eventually, eventually, unique
from tests.gateway.conftest import SLOW_TEXT, claude_journal
from tests.tls.pki import CA, Leaf
from tests.tls.test_nats_auth import refused

pytestmark = [pytest.mark.servers, pytest.mark.timeout(120)]


@dataclass
class TlsEtcd(EtcdServer):
    """etcd serving clients over TLS only, requiring a certificate of ``ca``."""

    ca: str = ""
    leaf: Leaf | None = None

    def _argv(self) -> list[str]:
        assert self.leaf is not None
        argv = [a.replace(f"http://127.0.0.1:{self.port}", f"https://127.0.0.1:{self.port}") for a in super()._argv()]
        return [*argv, "--cert-file", self.leaf.cert, "--key-file", self.leaf.key, "--trusted-ca-file", self.ca,
                "--client-cert-auth"]

    def _ready(self) -> None:
        assert self.proc is not None and self.leaf is not None
        ctx = ssl.create_default_context(cafile=self.ca)
        ctx.load_cert_chain(self.leaf.cert, self.leaf.key)

        def healthy() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited: {self.log_path.read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{self.port}/health", timeout=1, context=ctx) as r:
                    return b"true" in r.read()
            except OSError:
                return False
        eventually(healthy, 20, "etcd (TLS) not healthy")


@dataclass
class TlsNats(NatsServer):
    """nats-server with JetStream requiring TLS and a client certificate of ``ca``."""

    ca: str = ""
    leaf: Leaf | None = None

    def _argv(self) -> list[str]:
        assert self.leaf is not None
        return [*super()._argv(), "--tlsverify", "--tlscert", self.leaf.cert, "--tlskey", self.leaf.key,
                "--tlscacert", self.ca]


@dataclass
class Pki:
    ca: CA
    node: Leaf  # every service's certificate (server and client), and etcd's and NATS's
    public: Leaf  # the gateway's public certificate (another CA: what browsers would trust)
    public_ca: CA
    stranger: Leaf  # a certificate of a CA nobody trusts
    stranger_ca: CA


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca, public_ca, stranger_ca = CA(d, "cluster"), CA(d, "public"), CA(d, "stranger")
    return Pki(ca, ca.leaf("node"), public_ca.leaf("gateway"), public_ca, stranger_ca.leaf("mallory"), stranger_ca)


@dataclass
class Cluster:
    etcd: TlsEtcd
    nats: TlsNats
    coordinator: Any
    hosts: list[Any]
    gateway: Any
    grpc_port: int
    internal: tls.GrpcTls  # what a service of the cluster dials with


@pytest.fixture(scope="module")
async def cluster(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    tmp = tmp_path_factory.mktemp("tls-cluster")
    etcd = TlsEtcd(tmp / "etcd", ca=pki.ca.cert, leaf=pki.node)
    nats_server = TlsNats(tmp / "nats", ca=pki.ca.cert, leaf=pki.node)
    await asyncio.gather(asyncio.to_thread(etcd.start), asyncio.to_thread(nats_server.start))
    replay = tmp / "replay" / "claude-stream-json"
    replay.mkdir(parents=True)
    replay.joinpath("slow.jsonl").write_text(claude_journal([f"part {i}. " for i in range(40)]))
    stream = unique("TLS").upper()
    common = {
        # Mutual TLS and no internal token: the certificates are the cluster's only credential.
        "BATON_INTERNAL_TOKEN": "", "BATON_TLS_CERT": pki.node.cert, "BATON_TLS_KEY": pki.node.key,
        "BATON_TLS_CA": pki.ca.cert, "BATON_TLS_CLIENT_AUTH": "1",
        "BATON_NATS_CA": pki.ca.cert, "BATON_NATS_CERT": pki.node.cert, "BATON_NATS_KEY": pki.node.key,
        "BATON_RUNS_STREAM": stream, "BATON_SUBJECT_PREFIX": f"{stream.lower()}.runs",
        "BATON_THREADS_BUCKET": f"{stream.lower()}-threads", "BATON_REPLAY_DIRS": str(replay.parent),
        "BATON_SESSION_TTL": "3",
    }
    started: list[Any] = []
    try:
        coord = await start_coordinator(
            etcd.endpoint, f"/{unique('tls')}/", log_dir=tmp, BATON_ETCD_CA=pki.ca.cert,
            BATON_ETCD_CERT=pki.node.cert, BATON_ETCD_KEY=pki.node.key, **common)
        started.append(coord)
        hosts = await start_together([
            start_host(coord.address, nats_server.url, log_dir=tmp, host_id=f"tls-host-{i}",
                       BATON_JOURNAL_DIR=str(tmp / f"journals-{i}"), BATON_SANDBOX_DIR=str(tmp / f"sandboxes-{i}"),
                       **common)
            for i in (1, 2)])
        started += hosts
        grpc_port = free_port()
        gw = await start_gateway(coord.address, nats_server.url, log_dir=tmp, **common,
                                 BATON_GATEWAY_GRPC_LISTEN=f"127.0.0.1:{grpc_port}",
                                 BATON_GATEWAY_TLS_CERT=pki.public.cert, BATON_GATEWAY_TLS_KEY=pki.public.key)
        started.append(gw)
        yield Cluster(etcd, nats_server, coord, hosts, gw, grpc_port, tls.from_env(common))
    finally:
        for proc in reversed(started):
            await proc.stop()
        await asyncio.gather(asyncio.to_thread(etcd.stop), asyncio.to_thread(nats_server.stop))
    # Nothing of a key reached a log.
    key_body = "".join(pathlib.Path(pki.node.key).read_text().splitlines()[1:-1])
    for f in tmp.rglob("*.log"):
        assert key_body[:24] not in f.read_text(errors="replace"), f


async def test_a_run_read_over_tls_survives_its_host(cluster: Cluster, pki: Pki) -> None:
    run, thread = unique("run"), unique("th")
    target = f"127.0.0.1:{cluster.grpc_port}"
    async with RunsClient(target, ca_file=pki.public_ca.cert) as runs, \
            CoordinatorClient(cluster.coordinator.address, token="", tls=cluster.internal) as cc:
        stream = runs.start(run, thread, [{"id": "m1", "role": "user", "content": "go"}],
                            agent={"kind": "replay", "journal": "claude-stream-json/slow.jsonl", "delay": 0.1})
        chunks = []
        killed = None
        async with asyncio.timeout(60):
            async for chunk in stream:
                chunks.append(chunk)
                if killed is None and len(chunks) == 6:
                    driver = (await cc.get_run(run)).record.driver_host
                    killed = next(h for h in cluster.hosts if h.host_id == driver)
                    await killed.kill()  # SIGKILL, mid-run
        assert killed is not None
        offsets = [c.offset for c in chunks]
        assert len(set(offsets)) == len(offsets) == len(chunks)
        text = "".join(c.event.get("delta", "") for c in chunks if c.event["type"] == "TEXT_MESSAGE_CONTENT")
        assert text == SLOW_TEXT
        assert chunks[-1].event["type"] == "RUN_FINISHED"

        async def taken_over() -> bool:
            view = await cc.get_run(run)
            return view.record.status == 3 and view.record.driver_epoch >= 2  # COMPLETED, by a successor
        await assert_eventually(taken_over, timeout=20)
        survivor = (await cc.get_run(run)).record.driver_host
        assert survivor != killed.host_id and survivor in {h.host_id for h in cluster.hosts}

    # The same chunks over HTTPS (SSE), checked against the gateway's public CA.
    ctx = ssl.create_default_context(cafile=pki.public_ca.cert)
    async with httpx.AsyncClient(trust_env=False, verify=ctx, timeout=30) as http:
        assert cluster.gateway.url.startswith("https://")
        body = (await http.get(f"{cluster.gateway.url}/api/chat", params={"runId": run, "offset": "-1"})).text
        assert [line[4:] for line in body.splitlines() if line.startswith("id: ")] == offsets
        assert (await http.get(f"{cluster.gateway.url}/api/runs/{run}")).json()["status"] == "completed"


async def _health(address: str, creds: grpc.ChannelCredentials | None) -> grpc.StatusCode | None:
    """``None`` when the health check answers, else the call's error code."""
    opts = [("grpc.enable_http_proxy", 0)]
    ch = grpc.aio.secure_channel(address, creds, options=opts) if creds else grpc.aio.insecure_channel(address, opts)
    async with ch:
        try:
            await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
            return None
        except grpc.aio.AioRpcError as exc:
            return exc.code()


def _pem(path: str) -> bytes:
    return pathlib.Path(path).read_bytes()


async def test_every_port_refuses_plaintext_and_strangers(cluster: Cluster, pki: Pki) -> None:
    ca, node, stranger = _pem(pki.ca.cert), pki.node, pki.stranger
    good = grpc.ssl_channel_credentials(ca, _pem(node.key), _pem(node.cert))
    no_cert = grpc.ssl_channel_credentials(ca)
    stranger_cert = grpc.ssl_channel_credentials(ca, _pem(stranger.key), _pem(stranger.cert))
    wrong_ca = grpc.ssl_channel_credentials(_pem(pki.stranger_ca.cert), _pem(node.key), _pem(node.cert))
    # Coordinator and hosts: mutual TLS. Health answers only a client with a cluster certificate.
    for address in [cluster.coordinator.address, *(h.address for h in cluster.hosts if h.alive)]:
        assert await _health(address, good) is None, address
        for creds in (None, no_cert, stranger_cert, wrong_ca):
            assert await _health(address, creds) == grpc.StatusCode.UNAVAILABLE, address
    # The gateway's gRPC port: TLS with its public certificate; callers need no certificate.
    gw = f"127.0.0.1:{cluster.grpc_port}"
    public = grpc.ssl_channel_credentials(_pem(pki.public_ca.cert))
    assert await _health(gw, public) is None
    for creds in (None, grpc.ssl_channel_credentials(ca)):
        assert await _health(gw, creds) == grpc.StatusCode.UNAVAILABLE
    # The gateway's HTTP port: HTTPS only, and a client trusting another CA refuses it.
    plain_url = cluster.gateway.url.replace("https://", "http://")
    async with httpx.AsyncClient(trust_env=False, timeout=5) as http:
        with pytest.raises(httpx.HTTPError):
            await http.get(f"{plain_url}/healthz")
    async with httpx.AsyncClient(trust_env=False, timeout=5, verify=ssl.create_default_context(cafile=pki.ca.cert)
                                 ) as http:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await http.get(f"{cluster.gateway.url}/healthz")
    # etcd: no plaintext, no client without a certificate of the cluster's CA.
    for security in (EtcdSecurity(), EtcdSecurity(tls=True, ca=ca),
                     EtcdSecurity(tls=True, ca=ca, cert=_pem(stranger.cert), key=_pem(stranger.key))):
        etcd = Etcd([cluster.etcd.endpoint], security=security)
        try:
            with pytest.raises(StoreUnavailable):
                await etcd.range(b"/", timeout=3)
        finally:
            await etcd.close()
    etcd = Etcd([cluster.etcd.endpoint], security=EtcdSecurity(tls=True, ca=ca, cert=_pem(node.cert),
                                                                 key=_pem(node.key)))
    try:
        await etcd.range(b"/", timeout=5)
    finally:
        await etcd.close()
    # NATS: TLS required, and a certificate of the cluster's CA.
    only_ca = tls.client_ssl_context(pki.ca.cert, names=("CA", "CERT", "KEY"))
    strangers = tls.client_ssl_context(pki.ca.cert, stranger.cert, stranger.key, names=("CA", "CERT", "KEY"))
    for opts in ({}, {"tls": only_ca}, {"tls": strangers}):
        await refused(cluster.nats.url, **opts)
    good_ctx = tls.client_ssl_context(pki.ca.cert, node.cert, node.key, names=("CA", "CERT", "KEY"))
    nc = await nats.connect(cluster.nats.url, allow_reconnect=False, connect_timeout=5, tls=good_ctx)
    await nc.close()
