"""A TanStack AI durable chat whose durability log is a Durable Stream on baton's ``/ds``.

tests/node/ds/tanstack_durable_chat.mjs serves a chat with ``@tanstack/ai``'s own durable
responses (``toServerSentEventsResponse(chat(...), { durability })``, resumes with
``resumeServerSentEventsResponse``); the sink is tests/node/ds/ds_durability.mjs, our stand-in
for ``@tanstack/ai-durable-stream`` (not published on npm) with its wire contract: a JSON
stream per run at ``<server>/streams/<prefix>%2F<runId>``, producer appends, a closing POST,
SSE reads. The script asserts what the chat's clients see (every chunk once, in order; a
disconnect then a resume by ``Last-Event-ID`` and by ``?offset=`` gets exactly the rest; the
stream ends closed) and this test reads the stored runs back from baton over the protocol.
The same script runs against the protocol's reference server (``@durable-streams/server``):
the sink is not written for baton.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import httpx
import pytest

from tests.gateway.conftest import Gateway
from tests.gateway.test_node import NODE_DIR, need_node, run_node

SCRIPT = "ds/tanstack_durable_chat.mjs"
PACKAGES = ("@tanstack/ai", "@durable-streams/client")


@pytest.fixture
async def reference_server() -> AsyncIterator[str]:
    """The protocol's reference server (in memory) on a free port: its URL."""
    node = need_node("@durable-streams/server")
    proc = await asyncio.create_subprocess_exec(node, "ds_reference_server.mjs", "0", cwd=NODE_DIR,
                                                stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line.startswith(b"http://"), line
        yield line.decode().strip()
    finally:
        proc.terminate()
        await proc.wait()


@pytest.mark.node
@pytest.mark.timeout(120)
async def test_tanstack_durable_chat_writes_and_reads_its_run_through_baton(gateway: Gateway) -> None:
    node = need_node(*PACKAGES)
    server = f"{gateway.url}/ds"
    result = await run_node(node, SCRIPT, {"DS_SERVER": server}, timeout=60)
    runs: list[dict[str, Any]] = result["runs"]
    assert len(runs) == 2
    async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
        for run in runs:
            # The adapter's stream name: "<prefix>/<runId>" as one percent-encoded segment.
            assert run["url"] == f"{server}/streams/chat%2F{run['runId']}"
            # Read afterwards from the start, through the protocol: closed, the chunks the
            # chat's client got, numbered 1.. once each.
            got = await http.get(run["url"], params={"offset": "-1"})
            assert got.status_code == 200, got.text
            assert got.headers["stream-closed"] == "true"
            records = got.json()
            assert [r["seq"] for r in records] == list(range(1, len(run["chunks"]) + 1))
            assert [r["chunk"] for r in records] == run["chunks"]
            assert run["chunks"][-1]["type"] == "RUN_FINISHED"


@pytest.mark.node
@pytest.mark.timeout(60)
async def test_the_same_chat_runs_against_the_reference_server(reference_server: str) -> None:
    node = need_node(*PACKAGES)
    result = await run_node(node, SCRIPT, {"DS_SERVER": reference_server}, timeout=60)
    assert [r["chunks"][-1]["type"] for r in result["runs"]] == ["RUN_FINISHED", "RUN_FINISHED"]
