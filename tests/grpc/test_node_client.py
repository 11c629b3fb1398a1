"""The Node.js example client (examples/node/runs_client.mjs) against a real cluster: it
streams a run, breaks its stream and resumes after its last offset, streams on through a
SIGKILL of the host driving the run, reads the transcript, cancels a run with wait; every
chunk once, in order, byte-equal to the SSE stream."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import uuid
from typing import Any

import httpx
import pytest

from baton.v1 import runs_pb2
from tests.conftest import REPO, unique
from baton_tools.testing.cluster import start_host
from tests.gateway.conftest import SLOW_TEXT, host_settings
from tests.grpc.conftest import kill_driver_mid_run, sse_chunks

NODE_DIR = REPO / "tests" / "node"
EXAMPLE = REPO / "examples" / "node" / "runs_client.mjs"


def need_node() -> str:
    """node and the npm packages; under CI=true their absence fails instead of skipping."""
    node = shutil.which("node")
    missing = "node is not installed" if node is None else next(
        (f"npm package {p} missing (make node-deps)" for p in ("@grpc/grpc-js", "@grpc/proto-loader")
         if not (NODE_DIR / "node_modules" / p).is_dir()), None)
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {missing}")
        pytest.skip(missing)
    assert node is not None
    return node


@pytest.mark.node
async def test_node_client(host: Any, grpc_gateway: Any, http: httpx.AsyncClient, coordinator: Any, nats: Any,
                           cc: Any, dlog: Any, log_cfg: Any, replay_dir: Any, tmp_path: Any) -> None:
    node = need_node()
    # A second host, so the run lives on when its driver is SIGKILLed mid-stream.
    other = await start_host(coordinator.address, nats.url, log_dir=tmp_path,
                             **host_settings(log_cfg, replay_dir, tmp_path))
    # Run a copy beside tests/node/node_modules (ES modules resolve packages from their own path).
    script = NODE_DIR / f".runs-client-{uuid.uuid4().hex}.mjs"
    shutil.copyfile(EXAMPLE, script)
    thread, run, thread2, run2 = unique("th"), unique("run"), unique("th"), unique("run")
    proc = None
    try:
        proc = await asyncio.create_subprocess_exec(
            node, str(script), f"127.0.0.1:{grpc_gateway.state.grpc_port}", thread, run,
            "claude-stream-json/slow.jsonl", thread2, run2, cwd=NODE_DIR,
            env={**os.environ, "BATON_PROTOS": str(REPO / "protos"), "BATON_REPLAY_DELAY": "0.15"},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        killed = await kill_driver_mid_run(cc, dlog, [host, other], run, after_chunks=10)
        async with asyncio.timeout(120):
            out, err = await proc.communicate()
    finally:
        if proc is not None and proc.returncode is None:  # the test failed meanwhile
            proc.kill()
            await proc.wait()
        script.unlink(missing_ok=True)
        await other.stop()
    lines = [ln for ln in out.decode().splitlines() if ln.startswith("{")]
    assert lines and proc.returncode == 0, f"stdout: {out.decode()[-2000:]}\nstderr: {err.decode()[-2000:]}"
    result = json.loads(lines[-1])
    assert result["ok"], result
    assert killed  # the driver died while the client streamed; it saw nothing of it but the end

    chunks = [(o, j.encode()) for o, j in result["chunks"]]
    assert result["status"] == "completed" and result["resumedAt"] == 3
    offsets = [int(o) for o, _ in chunks]
    assert offsets == sorted(set(offsets))
    sse, ended = await sse_chunks(http, grpc_gateway.url, run)
    assert ended and sse == chunks
    assert "".join(json.loads(j).get("delta", "") for _, j in chunks) == SLOW_TEXT
    assert "".join(m["content"] for m in result["transcript"] if m["role"] == "assistant") == SLOW_TEXT

    assert result["cancelStatus"] == runs_pb2.RunStatus.Name(runs_pb2.RUN_STATUS_ABORTED)
    assert result["cancelLogStatus"] == "aborted"
    sse2, _ = await sse_chunks(http, grpc_gateway.url, run2)
    assert sse2 == [(o, j.encode()) for o, j in result["cancelChunks"]]
    assert result["unknownCode"] == 5  # NOT_FOUND
    assert result["unknownInfo"] == {"reason": "UNKNOWN_RUN", "domain": "baton.dev",
                                     "metadata": {"run_id": f"no-such-run-{run}"}}
