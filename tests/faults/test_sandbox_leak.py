"""A sandbox whose host lost its session before the sandbox's registration landed is not left
behind (found by a breaker: a host SIGSTOPped during a burst of starts left 1–3 sandboxes
in 5 of 7 runs). Its host destroys it; only a sandbox whose "launched" registration went
out is left to the successor (which follows it, or destroys it as never launched)."""
from __future__ import annotations

import pytest

from baton_tools.testing.proxy import TcpProxy
from tests.faults.conftest import ClusterFactory
from tests.faults.harness import CODEX, eventually

pytestmark = pytest.mark.servers


@pytest.mark.faults_slow
@pytest.mark.timeout(180)
async def test_sandbox_whose_registration_never_landed_is_not_left_behind(fault_cluster: ClusterFactory) -> None:
    c = await fault_cluster(hosts=0)
    assert c.coordinator is not None
    link = await TcpProxy(int(c.coordinator.address.rsplit(":", 1)[1])).start()
    try:
        await c.add_host(coordinator=link.endpoint)
        # A slow link: the registry write is held long enough to cut it off before it lands.
        link.latency = 0.5
        [run] = await c.start_runs(1, CODEX, seconds=4, wait_started=False)

        def sandbox_made() -> bool:
            return c.sandbox_dir.exists() and any(c.sandbox_dir.iterdir())
        await eventually(sandbox_made, 30, interval=0.005)
        async with c.fault("host's coordinator link cut after its sandbox was made, before it was registered"):
            link.down = True
            link.cut()
            await c.add_host()  # the successor
            await eventually(lambda: "lost; stopping drivers" in c.hosts[0].log_text(), 30)
            link.down = False
            link.latency = 0.0
        await c.finish(timeout=90)
        await c.check()  # check_nothing_left: no sandbox, no agent process left
    finally:
        await link.close()
