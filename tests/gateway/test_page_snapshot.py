"""The chat page joins a live run from its snapshot's newest messages and loads the older
ones on scroll (Chromium, tests/node/page_snapshot.mjs): a real host drives a replayed run
whose log gets snapshots often (``BATON_SNAPSHOT_CHUNKS=20``); the page is opened (a reload)
mid-run, after a snapshot of more messages than a join asks for; it shows the newest
messages, then the older ones as the reader scrolls up, follows the run to its end, and
ends up showing what a page that read the run's whole log from the start shows.
"""
from __future__ import annotations

import json
import pathlib
from typing import Any, AsyncIterator

import httpx
import pytest

from baton.log import DeliveryLog, LogConfig, latest_snapshot
from tests.conftest import assert_eventually, unique
from tests.gateway.conftest import Gateway, GatewayFactory, host_settings
from tests.gateway.test_pages import KEYS, A, need_browser, run_page_script

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

MESSAGES = 300  # assistant turns of the replayed run (every third with a tool call)


def _journal(n: int) -> str:
    """A Claude stream-json journal of ``n`` turns: text, and every third a Read and its result."""
    lines: list[dict[str, Any]] = [
        {"type": "system", "subtype": "init", "session_id": "s1", "model": "m", "tools": [], "cwd": "/tmp"}]
    for i in range(n):
        content: list[dict[str, Any]] = [{"type": "text", "text": f"Step {i}: **looking** at file {i}."}]
        if i % 3 == 0:
            content.append({"type": "tool_use", "id": f"toolu_{i}", "name": "Read", "input": {"path": f"/src/f{i}.py"}})
        lines.append({"type": "assistant", "session_id": "s1", "parent_tool_use_id": None,
                      "message": {"id": f"msg_{i}", "type": "message", "role": "assistant", "model": "m",
                                  "content": content, "stop_reason": None,
                                  "usage": {"input_tokens": 1, "output_tokens": 1}}})
        if i % 3 == 0:
            lines.append({"type": "user", "session_id": "s1", "parent_tool_use_id": None, "message": {
                "role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}",
                                             "content": f"x = {i}\ny = {i * 2}\n"}]}})
    lines.append({"type": "result", "subtype": "success", "is_error": False, "result": "done",
                  "session_id": "s1", "num_turns": n, "duration_ms": 1, "total_cost_usd": 0.0,
                  "usage": {"input_tokens": 1, "output_tokens": 1}})
    return "".join(json.dumps(x) + "\n" for x in lines)


@pytest.fixture(scope="module")
def snap_replay(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    d = tmp_path_factory.mktemp("snap-replay")
    (d / "claude-stream-json").mkdir()
    (d / "claude-stream-json" / "long.jsonl").write_text(_journal(MESSAGES))
    return d


@pytest.fixture(scope="module")
async def snap_host(coordinator: Any, nats: Any, log_cfg: LogConfig, snap_replay: pathlib.Path,
                    tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Any]:
    """One host whose runs' logs get a snapshot every 20 chunks (at a quiet point)."""
    from baton_tools.testing.cluster import start_host

    tmp = tmp_path_factory.mktemp("snap-host")
    h = await start_host(coordinator.address, nats.url, log_dir=tmp,
                         **{**host_settings(log_cfg, snap_replay, tmp), "BATON_SESSION_TTL": "5",
                            "BATON_SNAPSHOT_CHUNKS": "20"})
    yield h
    await h.stop()


async def test_a_page_reloaded_mid_run_shows_the_newest_messages_then_the_older_ones_on_scroll(
        make_gateway: GatewayFactory, snap_host: Any, snap_replay: pathlib.Path, cc: Any, dlog: DeliveryLog,
        http: httpx.AsyncClient) -> None:
    node = need_browser()
    gw: Gateway = await make_gateway(keepalive=0.5, api_keys=KEYS, replay_dirs=(snap_replay,))

    async def registered() -> bool:
        return snap_host.host_id in {h.host_id for h in await cc.list_hosts()}
    await assert_eventually(registered, timeout=20)
    thread, run = unique("snap-th-"), unique("snap-run-")
    body = {"threadId": thread, "runId": run, "messages": [{"id": "u", "role": "user", "content": "read them all"}],
            "agent": {"kind": "replay", "journal": "claude-stream-json/long.jsonl", "speed": 1, "delay": 0.3}}
    async with http.stream("POST", f"{gw.url}/api/chat", json=body, headers=A, timeout=60) as resp:
        assert resp.status_code == 200
        async for _ in resp.aiter_bytes():
            break  # the run started; it goes on detached

    async def snapshot_of_many() -> bool:
        found = await latest_snapshot(dlog.nc, dlog.cfg, run)
        return found is not None and len(found[0].messages) > 60
    await assert_eventually(snapshot_of_many, timeout=300)
    status = (await http.get(f"{gw.url}/api/runs/{run}", headers=A)).json()["status"]
    assert status == "running"  # the page opens while the run goes on
    result = await run_page_script(node, "page_snapshot.mjs", gw, timeout=240,
                                   env={"BATON_THREAD": thread, "BATON_RUN": run})
    assert result["window"]["messagesOmitted"] > 0
    assert result["firstShown"] <= 50 + result["window"]["messagesOmitted"]
    assert result["items"] == result["fromStart"] and len(result["items"]) > MESSAGES
