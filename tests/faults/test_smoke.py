"""The harness itself: with no fault, every run equals its uninterrupted replay."""
from __future__ import annotations

import pytest

from tests.faults.conftest import ClusterFactory
from tests.faults.harness import CODEX, SHORT

# Every case starts its own etcd, NATS and service processes (never `unit`).
pytestmark = pytest.mark.servers


@pytest.mark.faults_slow
@pytest.mark.timeout(120)
async def test_no_fault_every_run_equals_the_uninterrupted_replay(fault_cluster: ClusterFactory) -> None:
    c = await fault_cluster(hosts=3)
    await c.start_runs(3, seconds=4, detached=1)
    await c.start_runs(1, SHORT, seconds=3)
    await c.start_runs(1, CODEX, seconds=3)
    await c.finish()
    await c.check()
