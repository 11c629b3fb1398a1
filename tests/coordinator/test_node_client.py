"""From another language: a Node.js grpc-js client reading our .proto files (tests/node)."""
from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from baton.coordinator_client import CoordinatorClient
from baton_tools.testing.cluster import InProcessCoordinator
from baton_tools.testing.servers import env_without_proxy
from tests.conftest import REPO, unique

NODE_DIR = REPO / "tests" / "node"
SCRIPT = NODE_DIR / "coordinator_client.mjs"

pytestmark = [
    pytest.mark.node,
    pytest.mark.requires(shutil.which("node") is not None, reason="node is not installed"),
    pytest.mark.requires((NODE_DIR / "node_modules" / "@grpc" / "grpc-js").exists(),
                         reason="npm package @grpc/grpc-js missing (make node-deps)"),
]


async def test_node_client_creates_claims_and_reads_a_run(coord: InProcessCoordinator, cc: CoordinatorClient) -> None:
    run_id, thread_id = unique("node-run-"), unique("node-th-")
    proc = await asyncio.create_subprocess_exec(
        "node", str(SCRIPT), coord.address, run_id, thread_id, cwd=str(NODE_DIR), env=env_without_proxy(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    got = json.loads(out)
    assert got["created"] is True and got["status"] == "RUN_STATUS_RUNNING"
    assert got["epoch"] == "1"
    assert got["record"] == {"run_id": run_id, "thread_id": thread_id, "driver_epoch": "1",
                             "driver_host": "node-host", "agent": "replay"}
    assert got["claim"] == {"epoch": "1", "host_id": "node-host", "session_id": got["session_id"]}
    # The refused second claim: FAILED_PRECONDITION (9) with ErrorInfo a Node client can branch on.
    assert got["refused"] == {"code": 9, "info": {"reason": "RUN_CLAIM_NOT_ACQUIRED", "domain": "baton.dev",
                                                  "metadata": {"run_id": run_id, "refusal": "held"}}}
    assert got["claim_after_close"] is None
    # And Python sees the same run.
    view = await cc.get_run(run_id)
    assert view.record.driver_host == "node-host" and view.record.driver_epoch == 1 and view.claim is None
