"""Real clients: the TanStack AI client (Node.js), a React `useChat` page and `xhrHttpStream` in Chromium, and a browser EventSource. The web pages' browser tests are in test_pages.py."""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
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
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate()
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


@pytest.mark.node
async def test_tanstack_unknown_run_persistence_and_ndjson_adapter(host: Any, gateway: Gateway) -> None:
    """With @tanstack/ai-client: an unknown run errors, persistence: true
    hydrates and tails a reloaded run without a duplicated text part, fetchHttpStream needs only a URL."""
    node = need_node("@tanstack/ai-client")
    result = await run_node(node, "tanstack_edges.mjs", {"BATON_GATEWAY_URL": gateway.url}, timeout=150)
    assert "404" in result["unknown_sse"]["error"] and "404" in result["unknown_ndjson"]["error"]
    assert result["ndjson"]["text"] == "hello from the replay"
    plain = result["claude-stream-json/slow.jsonl"]
    assert plain["text"] == SLOW_TEXT and plain["textParts"] == 40 and plain["users"] == 1 and plain["uniqueIds"]
    # A run that starts with reasoning: never a text part twice. @tanstack/ai-client 0.33.2
    # itself drops the reasoning message and the first text part on rejoin (react_chat.mjs).
    thinking = result["claude-stream-json/thinking.jsonl"]
    assert thinking["users"] == 1 and thinking["uniqueIds"] and thinking["text"] == SLOW_TEXT.removeprefix("part 0. ")


@pytest.mark.browser
@pytest.mark.timeout(240)
async def test_react_use_chat_persistence_and_xhr_adapter_in_chromium(host: Any, gateway: Gateway) -> None:
    """In Chromium: ``useChat`` (``@tanstack/ai-react``, ``persistence: true``)
    reloaded mid-run restores the prompt and the answer so far, joins the live run and ends
    with the exact text, each chunk once; a reload after the end shows the transcript once.
    ``xhrHttpStream`` (browser-only) streams and joins a run as the exact chunks of its log.
    A run that starts with reasoning pins @tanstack/ai-client 0.33.2's rejoin bug (see
    react_chat.mjs): the first text part is dropped by the client, nothing is duplicated."""
    node = need_node("playwright-core", "esbuild", "react", "react-dom", "@tanstack/ai-react")
    require(pathlib.Path("/usr/bin/chromium").exists(), "/usr/bin/chromium missing (apt-get install chromium)")
    result = await run_node(node, "react_chat.mjs", {"BATON_GATEWAY_URL": gateway.url}, timeout=220)
    sse, xhr = result["sse"], result["xhrReasoningFirst"]
    assert sse["restored"] >= sse["before"] >= 3 and sse["end"] == 40
    assert xhr["end"] == 39 and xhr["thinkingSaved"] == ["Let me think."]
    assert result["xhr"]["types"][-1] == "RUN_FINISHED"


@pytest.mark.browser
async def test_browser_eventsource_stops_after_the_end(gateway: Gateway, dlog: Any) -> None:
    """After ``: end`` a native EventSource reconnects once, gets 204, and stops; the stream
    came gzip-encoded (the browser asks for it) and the browser decoded every chunk."""
    from tests.conftest import unique
    from tests.gateway.conftest import run_chunks, write_run

    node = need_node("playwright-core")
    require(pathlib.Path("/usr/bin/chromium").exists(), "/usr/bin/chromium missing (apt-get install chromium)")
    run_id = unique("run")
    _, offsets = await write_run(dlog, run_id, run_chunks(run_id, "t", ["a", "b"]))
    result = await run_node(node, "eventsource_end.mjs", {"BATON_GATEWAY_URL": gateway.url, "BATON_RUN_ID": run_id})
    assert result["ids"] == offsets  # every chunk once
    assert result["opens"] == 1 and result["state"] == 2  # CLOSED: no reconnect loop
    assert result["requests"] == [None, offsets[-1]]  # one reconnect, at the last offset, answered 204
    assert result["encodings"] == [[200, "gzip"], [204, None]]
