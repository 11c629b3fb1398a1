"""An ``AttachRun`` whose caller gives up after the host's claim landed.

Under load (200 runs, 2 cores at load 20) the coordinator's failover gave a host its 5 s
for ``AttachRun`` and the host answered later: the call was cancelled on the host with the
claim already in etcd and no driver to hold it. Every other host was then refused
``held``, the failover took that as "someone drives it", and the run never finished (the
unfinished runs of ``bench/scale_runs.py``). Here the host's link to the coordinator holds
every byte 1 s each way, and the test's own ``AttachRun`` gives up after 1.5 s: the claim
reaches etcd at about 1 s, its answer the host at about 2 s.
"""
from __future__ import annotations

import json
import pathlib
from typing import Any, AsyncIterator

import grpc
import pytest

from baton.v1 import runs_pb2, sandbox_host_pb2
from baton_tools.testing.proxy import TcpProxy
from baton_tools.testing.servers import EtcdServer, NatsServer
from sandbox_host.translate import translate_bytes
from tests.conftest import assert_eventually, unique
from tests.driver.conftest import CORPUS, Cluster, make_cluster

SHORT = "codex-exec-json/zsh-commands-and-file-change.jsonl"


@pytest.fixture
async def slow_cluster(etcd: EtcdServer, nats: NatsServer, tmp_path: pathlib.Path) -> AsyncIterator[tuple[Cluster, Any, TcpProxy]]:
    c = await make_cluster(etcd, nats, tmp_path, hosts=0)
    proxy = await TcpProxy(int(c.coordinator.address.rsplit(":", 1)[1])).start()
    try:
        # A TTL that outlasts the slow link's 2 s round trips (its refresh every 2 s).
        host = await start_slow_host(c, proxy)
        yield c, host, proxy
    finally:
        await c.close()
        await proxy.close()


async def start_slow_host(c: Cluster, proxy: TcpProxy) -> Any:
    from baton_tools.testing.cluster import start_host

    h = await start_host(proxy.endpoint, c.env["BATON_NATS_URL"], log_dir=c.tmp / "logs",
                         host_id=unique("slow-"), **{**c.env, "BATON_SESSION_TTL": "6"})
    c.hosts.append(h)
    return h


@pytest.mark.timeout(120)
async def test_a_claim_whose_attach_caller_gave_up_is_driven(slow_cluster: tuple[Cluster, Any, TcpProxy]) -> None:
    cluster, host, proxy = slow_cluster
    opts = {"journal": str(CORPUS / SHORT), "speed": 0, "delay": 0}
    # Never claimed (driver_epoch 0): the leader's failover leaves it to this test.
    rec, created = await cluster.cc.create_or_resume_run(runs_pb2.RunRecord(
        run_id=unique("run-"), thread_id=unique("thr-"), status=runs_pb2.RUN_STATUS_RUNNING,
        agent=runs_pb2.AgentSpec(kind="replay", options_json=json.dumps(opts))))
    assert created and rec.driver_epoch == 0
    proxy.latency = 1.0
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await cluster.stub(host).AttachRun(sandbox_host_pb2.AttachRunRequest(run_id=rec.run_id), timeout=1.5,
                                           wait_for_ready=True)
    assert ei.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

    async def claimed() -> Any:
        view = await cluster.cc.get_run(rec.run_id)
        assert view.claim is not None and view.claim.host_id == host.host_id
        return view.claim
    claim = await assert_eventually(claimed, timeout=15)
    assert claim.epoch == 1
    proxy.latency = 0.0
    # The claim is held by a driver: the run is driven to its end, each chunk once.
    chunks = [c for _, c in await cluster.read_all(rec.run_id, timeout=60)]
    assert chunks == translate_bytes("codex-exec-json", (CORPUS / SHORT).read_bytes(), rec.run_id, rec.thread_id)
    done = await cluster.wait_status(rec.run_id, "completed")
    # Driven by the host (on a loaded machine its claim may go and come back: epoch 2).
    assert done.driver_epoch >= 1 and done.driver_host == host.host_id
