"""``@durable-streams/client`` reads a live baton run through its host's SIGKILL: every chunk
once, in order, and the stream closes when the run ends."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
from typing import Any

import pytest

from tests.conftest import REPO, require
from tests.faults.conftest import ClusterFactory

NODE_DIR = REPO / "tests" / "node"
pytestmark = pytest.mark.servers


@pytest.mark.node
@pytest.mark.timeout(300)
@pytest.mark.parametrize("live", ["sse", pytest.param("long-poll", marks=pytest.mark.faults_slow)])
async def test_ds_client_reads_a_run_through_a_host_sigkill(fault_cluster: ClusterFactory, live: str) -> None:
    node = shutil.which("node")
    require(node is not None and (NODE_DIR / "node_modules" / "@durable-streams" / "client").is_dir(),
            "node and @durable-streams/client are needed (make node-deps)")
    assert node is not None
    c = await fault_cluster(hosts=2)
    (run,) = await c.start_runs(1, seconds=10, detached=1)  # the starting POST leaves; the run goes on
    proc = await asyncio.create_subprocess_exec(
        node, "ds/run_reader.mjs", cwd=NODE_DIR, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "BATON_DS_URL": f"{c.url}/ds/runs/{run.run_id}", "BATON_DS_LIVE": live})
    assert proc.stdout is not None
    try:
        result: dict[str, Any] = {}
        killed = False
        async with asyncio.timeout(240):
            async for raw in proc.stdout:
                line = json.loads(raw)
                if "progress" in line and line["progress"] >= 5 and not killed:
                    driver = (await c.drivers([run]))[run.run_id]
                    async with c.fault(f"host {driver} SIGKILL while a Durable Streams client reads"):
                        c.host(driver).kill_now()
                    killed = True
                if "ok" in line:
                    result = line
        await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert killed and result.get("ok"), result
    await c.finish()
    stored = [chunk for _, chunk in await c.fresh_read(run.run_id)]
    assert result["items"] == stored  # every chunk once, in order
    assert result["closed"] is True  # closed because the run ended
    assert stored[-1]["type"] in ("RUN_FINISHED", "RUN_ERROR")
    await c.check()
