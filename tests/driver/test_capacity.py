"""Host capacity (``BATON_HOST_CAPACITY``): a full host refuses new work with
``HOST_AT_CAPACITY``, publishes its load in the registry, and the coordinator's failover
hands a dead host's run to a host with room, never to a full one."""
from __future__ import annotations

import json
from typing import Any, AsyncIterator

import grpc
import pytest

from baton.errors import HostAtCapacity, UnknownRun
from baton.grpc_errors import from_rpc_error
from baton_tools.testing.cluster import HostProcess
from baton_tools.testing.servers import EtcdServer, NatsServer
from baton.v1 import runs_pb2, sandbox_host_pb2
from tests.conftest import assert_eventually, unique
from tests.driver.conftest import CORPUS, Cluster, make_cluster, status_of

LONG = "claude-stream-json/partial-messages-parallel-bash-denied.jsonl"
SLOW = 0.05  # seconds per line: ~14 s for the whole journal, so runs are mid-way when we act


@pytest.fixture(scope="module")
async def cluster(etcd: EtcdServer, nats: NatsServer, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    c = await make_cluster(etcd, nats, tmp_path_factory.mktemp("capacity"), hosts=0)
    try:
        yield c
    finally:
        await c.close()


async def _load_of(cluster: Cluster, host: HostProcess) -> int | None:
    for h in await cluster.cc.list_hosts():
        if h.host_id == host.host_id:
            return h.load
    return None


async def _refusal(call: Any) -> BaseException:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    return from_rpc_error(err.value)


async def test_full_host_refuses_start_and_attach_and_publishes_its_load(cluster: Cluster) -> None:
    host = await cluster.add_host(BATON_HOST_CAPACITY="1")
    first = await cluster.start_run(host, LONG, delay=SLOW)
    run_id = first.record.run_id
    await assert_eventually(lambda: _load_of(cluster, host), timeout=10)   # load 1 published

    later = unique("run-")
    refused = await _refusal(cluster.start_run(host, LONG, run_id=later))
    assert isinstance(refused, HostAtCapacity) and refused.host_id == host.host_id and refused.capacity == 1
    with pytest.raises(UnknownRun):                          # refused before any record was made
        await cluster.cc.get_run(later)
    # The gateway's retry of the start it drives (the first answer came late under load) needs
    # no slot: it joins the run, as it would on a host with room.
    retried = await cluster.start_run(host, LONG, delay=SLOW, run_id=run_id, thread_id=first.record.thread_id)
    assert not retried.created and retried.record.run_id == run_id
    assert (await cluster.record(run_id)).driver_epoch == first.record.driver_epoch  # not started again

    opts = {"journal": str(CORPUS / LONG), "speed": 0, "delay": 0}
    seeded, _ = await cluster.cc.create_or_resume_run(runs_pb2.RunRecord(
        run_id=unique("run-"), thread_id=unique("thr-"),
        agent=runs_pb2.AgentSpec(kind="replay", options_json=json.dumps(opts))))
    refused = await _refusal(cluster.stub(host).AttachRun(
        sandbox_host_pb2.AttachRunRequest(run_id=seeded.run_id), timeout=10))
    assert isinstance(refused, HostAtCapacity)
    assert (await cluster.cc.get_run(seeded.run_id)).claim is None

    # Once the run ends, the slot is free again.
    await cluster.cc.request_run_cancel(run_id, "user")
    await cluster.wait_status(run_id, "aborted")
    async def idle() -> bool:
        return await _load_of(cluster, host) == 0

    await assert_eventually(idle, timeout=10)
    again = await cluster.start_run(host, LONG, run_id=later, speed=0)
    assert again.created
    await cluster.wait_status(later, "completed")


async def test_failover_hands_the_run_to_a_host_with_room_not_to_a_full_one(cluster: Cluster) -> None:
    for h in cluster.hosts:                                  # only the hosts below take part
        await h.stop()
    full = await cluster.add_host(BATON_HOST_CAPACITY="1")
    roomy = await cluster.add_host(BATON_HOST_CAPACITY="4")
    victim = await cluster.add_host()
    # The full host holds fewer runs than the roomy one: "least loaded first" alone would
    # pick it.
    held = (await cluster.start_run(full, LONG, delay=SLOW)).record.run_id
    others = [(await cluster.start_run(roomy, LONG, delay=SLOW)).record.run_id for _ in range(2)]
    orphan = (await cluster.start_run(victim, LONG, delay=SLOW)).record.run_id
    victim.kill_now()                                        # its claim goes with its lease

    async def driven_by() -> str | None:
        view = await cluster.cc.get_run(orphan)
        return view.claim.host_id if view.claim is not None and view.claim.host_id != victim.host_id else None

    assert await assert_eventually(driven_by, timeout=20) == roomy.host_id
    assert (await cluster.cc.get_run(held)).claim.host_id == full.host_id  # type: ignore[union-attr]
    rec = await cluster.wait_status(orphan, "completed", timeout=60)
    assert status_of(rec) == "completed"
    for run_id in [held, *others]:
        await cluster.cc.request_run_cancel(run_id, "user")
