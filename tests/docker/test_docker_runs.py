"""Whole runs on the docker provider: real coordinator, host processes, etcd, NATS, engine.

A fresh run and a run whose host is SIGKILLed mid-stream (another host process, with its
own SDK client, attaches to the same container and finishes it) must both deliver exactly
the chunks of the recorded journal, end ``completed`` and leave no container behind.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import pytest

from baton.v1 import sandbox_host_pb2
from sandbox_host.providers.docker import DockerProvider
from sandbox_host.translate import translate_bytes
from tests.conftest import assert_eventually
from tests.docker.conftest import DOCKER_MARKS
from tests.driver.conftest import CORPUS, Cluster, make_cluster

pytestmark = DOCKER_MARKS

JOURNAL = "claude-stream-json/partial-messages-bash-exit-128.jsonl"


@pytest.fixture(scope="module")
async def dcluster(etcd: Any, nats: Any, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    c = await make_cluster(etcd, nats, tmp_path_factory.mktemp("docker-runs"), hosts=2, BATON_PROVIDER="docker")
    try:
        yield c
    finally:
        await c.close()


def expected_chunks(run_id: str, thread_id: str) -> list[dict[str, Any]]:
    """The recorded journal translated directly (what an uninterrupted run must deliver)."""
    return translate_bytes("claude-stream-json", (CORPUS / JOURNAL).read_bytes(), run_id, thread_id, exit_code=0)


async def containers_of(run_id: str) -> list[str]:
    provider = DockerProvider()
    try:
        return await provider.find(run_id)
    finally:
        provider.close()


async def test_fresh_docker_run(dcluster: Cluster) -> None:
    started = await dcluster.start_run(dcluster.hosts[0], JOURNAL)
    run_id, thread_id = started.record.run_id, started.record.thread_id
    chunks = [c for _, c in await dcluster.read_all(run_id)]
    assert chunks[1]["type"] == "CUSTOM" and chunks[1]["name"] == "run.accepted"
    assert [chunks[0], *chunks[2:]] == expected_chunks(run_id, thread_id)
    rec = await dcluster.wait_status(run_id, "completed")
    assert rec.driver_epoch == 1
    await assert_eventually(lambda: _none(containers_of(run_id)), timeout=15)


async def test_docker_run_survives_its_host_being_killed(dcluster: Cluster) -> None:
    victim = dcluster.hosts[0]
    started = await dcluster.start_run(victim, JOURNAL, delay=0.01)
    run_id, thread_id = started.record.run_id, started.record.thread_id
    got: list[dict[str, Any]] = []
    killed = False
    async with dcluster.log.read(run_id) as reader:
        async for _, chunk in reader:
            got.append(chunk)
            if len(got) == 12 and not killed:
                killed = True
                cids = await containers_of(run_id)
                assert len(cids) == 1  # the agent runs in its container while its host dies
                victim.kill_now()
    assert killed
    assert got[1]["name"] == "run.accepted"
    assert [got[0], *got[2:]] == expected_chunks(run_id, thread_id)  # no gap, no duplicate, same order
    rec = await dcluster.wait_status(run_id, "completed")
    assert rec.driver_epoch >= 2 and rec.driver_host != victim.host_id
    await assert_eventually(lambda: _none(containers_of(run_id)), timeout=15)
    await victim.start()


async def _none(aw: Any) -> bool:
    return not await aw


async def test_a_finished_run_leaves_no_container_of_a_host_that_died_mid_build(dcluster: Cluster) -> None:
    """A host SIGKILLed between creating a container and registering it leaves one no registry
    knows; once the run is final, every container labelled with its run id is removed."""
    from sandbox_host.providers import SandboxSpec

    host = dcluster.hosts[0]
    # Paced to outlast the leftover's build (about two minutes): the run ends when cancelled.
    started = await dcluster.start_run(host, JOURNAL, delay=1.0)
    run_id = started.record.run_id
    provider = DockerProvider()
    try:
        # What the dead host left: a container of this run under a key nobody registered.
        leftover = await provider.create(f"{run_id}#dead", SandboxSpec(provider="docker", env={"BATON_RUN_ID": run_id}))
        assert await provider.exists(leftover)
        await dcluster.stub(host).CancelRun(sandbox_host_pb2.CancelRunRequest(run_id=run_id, reason="user"), timeout=5)
        await dcluster.wait_status(run_id, "aborted")

        async def all_gone() -> bool:
            found = await asyncio.to_thread(provider._api.containers, all=True,
                                            filters={"label": f"baton.run_id={run_id}"})
            return not found
        await assert_eventually(all_gone, timeout=15)
    finally:
        provider.close()
