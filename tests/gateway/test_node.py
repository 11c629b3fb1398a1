"""Real clients: the TanStack AI client (Node.js). The web pages' browser tests are in test_pages.py."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
from typing import Any

import pytest

from tests.conftest import REPO, require
from tests.gateway.conftest import SLOW_TEXT, Gateway

NODE_DIR = REPO / "tests" / "node"


def need_node(*packages: str) -> str:
    node = shutil.which("node")
    require(node is not None, "node is not installed")
    assert node is not None
    for p in packages:
        require((NODE_DIR / "node_modules" / p).is_dir(), f"npm package {p} missing (make node-deps)")
    return node


async def run_node(node: str, script: str, env: dict[str, str], timeout: float = 90) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        node, script, cwd=NODE_DIR, env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    lines = [ln for ln in out.decode().splitlines() if ln.startswith("{")]
    assert lines, f"no result from {script} (rc={proc.returncode})\nstdout: {out.decode()[-3000:]}\nstderr: {err.decode()[-3000:]}"
    result = json.loads(lines[-1])
    assert proc.returncode == 0 and result.get("ok"), f"{script} failed: {result}\nstderr: {err.decode()[-3000:]}"
    return result  # type: ignore[no-any-return]


@pytest.mark.node
async def test_tanstack_client_streams_reconnects_and_joins(host: Any, gateway: Gateway) -> None:
    node = need_node("@tanstack/ai-client")
    result = await run_node(node, "tanstack_client.mjs", {
        "BATON_GATEWAY_URL": gateway.url, "BATON_JOURNAL": "claude-stream-json/slow.jsonl",
        "BATON_REPLAY_DELAY": "0.05"})
    assert result["calls"] >= 2
    assert result["streamed"] == result["joined"] == result["log"]
    assert result["text"] == SLOW_TEXT

