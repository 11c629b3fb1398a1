"""The Node.js example client (examples/node/runs_client.mjs) against a real cluster: it
streams a run, breaks its stream and resumes after its last offset, reads the transcript,
cancels a run with wait; every chunk once, in order, byte-equal to the SSE stream."""
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
from tests.gateway.conftest import SLOW_TEXT
from tests.grpc.conftest import sse_chunks

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
async def test_node_client(host: Any, grpc_gateway: Any, http: httpx.AsyncClient) -> None:
    node = need_node()
    # Run a copy beside tests/node/node_modules (ES modules resolve packages from their own path).
    script = NODE_DIR / f".runs-client-{uuid.uuid4().hex}.mjs"
    shutil.copyfile(EXAMPLE, script)
    thread, run, thread2, run2 = unique("th"), unique("run"), unique("th"), unique("run")
    try:
        proc = await asyncio.create_subprocess_exec(
            node, str(script), f"127.0.0.1:{grpc_gateway.state.grpc_port}", thread, run,
            "claude-stream-json/slow.jsonl", thread2, run2, cwd=NODE_DIR,
            env={**os.environ, "BATON_PROTOS": str(REPO / "protos")},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        script.unlink(missing_ok=True)
    lines = [ln for ln in out.decode().splitlines() if ln.startswith("{")]
    assert lines and proc.returncode == 0, f"stdout: {out.decode()[-2000:]}\nstderr: {err.decode()[-2000:]}"
    result = json.loads(lines[-1])
    assert result["ok"], result

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
