"""A Stop racing the start: a cancel before, with or just after the POST is never lost."""
from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.conftest import assert_eventually, unique
from tests.gateway.conftest import Gateway, read_stream

SLOW = {"kind": "replay", "journal": "claude-stream-json/slow.jsonl", "speed": 1}


async def _cancel(http: httpx.AsyncClient, url: str, run_id: str) -> httpx.Response:
    return await http.post(f"{url}/api/chat/cancel", json={"runId": run_id}, timeout=30)


@pytest.mark.parametrize("delay_ms", [None, 0, 5, 50], ids=["before", "at-0ms", "at-5ms", "at-50ms"])
async def test_a_stop_racing_the_start_is_never_lost(host: Any, gateway: Gateway, http: httpx.AsyncClient,
                                                      delay_ms: int | None) -> None:
    run_id, thread = unique("run"), unique("th")
    body = {"threadId": thread, "messages": [{"id": "u1", "role": "user", "content": "hi"}], "agent": SLOW}
    if delay_ms is None:
        cancelled = await _cancel(http, gateway.url, run_id)
        assert cancelled.status_code == 202, cancelled.text
    post = asyncio.create_task(read_stream(http, "POST", f"{gateway.url}/api/chat", json=body,
                                           headers={"X-Run-Id": run_id}))
    if delay_ms is not None:
        await asyncio.sleep(delay_ms / 1000)  # the race itself: the Stop lands this long after the POST left
        cancelled = await _cancel(http, gateway.url, run_id)
        assert cancelled.status_code == 202, cancelled.text
    async with asyncio.timeout(60):
        got = await post
    assert got.status == 200 and got.ended
    types = [c["type"] for _o, c in got.events]
    assert types[-1] == "RUN_ERROR" and got.events[-1][1].get("code") == "cancelled", types
    assert "RUN_FINISHED" not in types
    if delay_ms is None:
        # Born cancelled: no agent ever ran, so nothing of its output exists.
        assert not any(t.startswith("TEXT_MESSAGE") for t in types), types
    run = (await http.get(f"{gateway.url}/api/runs/{run_id}")).json()
    assert run["status"] == "aborted" and run["cancelRequested"] is True


async def test_an_intent_of_another_tenant_does_not_stop_the_run(host: Any, make_gateway: Any,
                                                                 http: httpx.AsyncClient) -> None:
    gw = await make_gateway(keepalive=0.5, api_keys={"k1": "tenant-a", "k2": "tenant-b"})
    run_id, thread = unique("run"), unique("th")
    other = await http.post(f"{gw.url}/api/chat/cancel", json={"runId": run_id},
                            headers={"Authorization": "Bearer k2"})
    assert other.status_code == 202
    body = {"threadId": thread, "messages": [{"id": "u1", "role": "user", "content": "hi"}],
            "agent": {"kind": "replay", "journal": "claude-stream-json/hello.jsonl"}}
    async with asyncio.timeout(60):
        got = await read_stream(http, "POST", f"{gw.url}/api/chat", json=body,
                                                 headers={"X-Run-Id": run_id, "Authorization": "Bearer k1"})
    assert [c["type"] for _o, c in got.events][-1] == "RUN_FINISHED"
    # And tenant-b still cannot see (nor cancel) tenant-a's run.
    again = await http.post(f"{gw.url}/api/chat/cancel", json={"runId": run_id},
                            headers={"Authorization": "Bearer k2"})
    assert again.status_code == 404


async def test_another_tenants_cancel_does_not_undo_an_intent(host: Any, make_gateway: Any,
                                                              http: httpx.AsyncClient) -> None:
    # tenant-a stops its own run id before the start; tenant-b then cancels the same id: b's
    # intent must not replace a's (b could otherwise undo a's Stop of a's run).
    gw = await make_gateway(keepalive=0.5, api_keys={"k1": "tenant-a", "k2": "tenant-b"})
    run_id, thread = unique("run"), unique("th")
    for key in ("k1", "k2"):
        r = await http.post(f"{gw.url}/api/chat/cancel", json={"runId": run_id},
                            headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 202, r.text
    body = {"threadId": thread, "messages": [{"id": "u1", "role": "user", "content": "hi"}], "agent": SLOW}
    async with asyncio.timeout(60):
        got = await read_stream(http, "POST", f"{gw.url}/api/chat", json=body,
                                                 headers={"X-Run-Id": run_id, "Authorization": "Bearer k1"})
    types = [c["type"] for _o, c in got.events]
    assert types[-1] == "RUN_ERROR" and got.events[-1][1].get("code") == "cancelled", types
    assert not any(t.startswith("TEXT_MESSAGE") for t in types), types
    run = (await http.get(f"{gw.url}/api/runs/{run_id}", headers={"Authorization": "Bearer k1"})).json()
    assert run["status"] == "aborted" and run["cancelRequested"] is True


async def test_with_auth_a_join_before_the_start_waits_for_the_run(host: Any, make_gateway: Any,
                                                                   http: httpx.AsyncClient) -> None:
    # The join wait (a client that mints run ids joins before its POST landed) with API keys
    # on: it answered 404 at once. Another tenant's join of the run still gets 404.
    gw = await make_gateway(keepalive=0.5, api_keys={"k1": "tenant-a", "k2": "tenant-b"})
    run_id, thread = unique("run"), unique("th")
    a, b = {"Authorization": "Bearer k1"}, {"Authorization": "Bearer k2"}
    join = asyncio.create_task(read_stream(http, "GET", f"{gw.url}/api/chat",
                                           params={"runId": run_id, "offset": "-1"}, headers=a))
    # With API keys the public /metrics is not a tenant's: read the gateway's own gauge.
    await assert_eventually(
        lambda: gw.state.metrics.registry.get_sample_value("baton_gateway_joins_waiting_for_run") == 1, timeout=15)
    body = {"threadId": thread, "messages": [{"id": "u1", "role": "user", "content": "hi"}],
            "agent": {"kind": "replay", "journal": "claude-stream-json/hello.jsonl"}}
    async with asyncio.timeout(60):
        started = await read_stream(http, "POST", f"{gw.url}/api/chat", json=body,
                                                     headers={"X-Run-Id": run_id, **a})
    async with asyncio.timeout(60):
        joined = await join
    assert joined.status == 200 and joined.events == started.events
    assert started.events[-1][1]["type"] == "RUN_FINISHED"
    other = await http.get(f"{gw.url}/api/chat", params={"runId": run_id, "offset": "-1"}, headers=b, timeout=30)
    assert other.status_code == 404 and other.json()["reason"] == "UNKNOWN_RUN"
