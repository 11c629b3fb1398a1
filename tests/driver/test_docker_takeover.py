"""Docker variants: kill points and cancel with the ``docker`` provider (real engine).

Skipped (failed under ``CI=true``) unless ``BATON_TEST_DOCKER=1`` (``scripts/docker_setup.sh`` provides the engine and
the ``baton-sandbox`` image). Any host that reaches the same engine takes the run over.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import pytest

from tests.driver.conftest import Cluster, make_cluster
from tests.driver.test_kill_points import run_kill_point, uninterrupted

from tests.docker.conftest import DOCKER_MARKS

pytestmark = DOCKER_MARKS

LONG = "claude-stream-json/partial-messages-parallel-bash-denied.jsonl"


@pytest.fixture(scope="module")
async def dcluster(etcd: Any, nats: Any, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    c = await make_cluster(etcd, nats, tmp_path_factory.mktemp("docker"), hosts=2, BATON_PROVIDER="docker")
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture(scope="module")
async def dbaseline(dcluster: Cluster) -> dict[str, Any]:
    return await uninterrupted(dcluster)


@pytest.mark.parametrize("point", ["start", "nth:TOOL_CALL_ARGS:2", "nth-last:TEXT_MESSAGE_CONTENT:2"])
async def test_docker_kill_point(dcluster: Cluster, dbaseline: dict[str, Any], point: str) -> None:
    await run_kill_point(dcluster, dbaseline, point)


async def test_docker_cancel_destroys_the_container(dcluster: Cluster) -> None:
    import docker

    started = await dcluster.start_run(dcluster.hosts[1], LONG, delay=0.05, keep_sandbox=True)
    run_id = started.record.run_id
    got: list[dict[str, Any]] = []
    async with dcluster.log.read(run_id) as reader:
        async for _, chunk in reader:
            got.append(chunk)
            if len(got) == 10:
                await dcluster.cc.request_run_cancel(run_id, reason="user")
    assert got[-2]["value"] == {"reason": "user", "processGone": True, "sandboxDestroyed": True}
    assert got[-1]["code"] == "cancelled"
    await dcluster.wait_status(run_id, "aborted")
    client = docker.from_env()
    try:
        left = await asyncio.to_thread(client.containers.list, all=True, sparse=True,
                                       filters={"label": f"baton.run_id={run_id}"})
        assert left == []
    finally:
        client.close()
