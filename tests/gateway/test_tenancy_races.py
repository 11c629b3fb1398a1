"""Two POSTs racing on one new run id must never serve one caller the
other's run (another tenant's log, or a run of another thread).

Gateway + real coordinator + a real sandbox host running the replay agent.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from tests.conftest import unique
from tests.gateway.conftest import Gateway, read_stream
from tests.gateway.test_e2e import replay_body


async def test_racing_posts_of_one_run_id_never_cross_tenants_or_threads(
        host: Any, make_gateway: Any, http: httpx.AsyncClient) -> None:
    gw: Gateway = await make_gateway(api_keys={"key-a": "tenant-a", "key-b": "tenant-b"})
    for _round in range(6):
        run = unique("race")
        callers = [("key-a", unique("th-a")), ("key-b", unique("th-b")), ("key-a", unique("th-a2"))]

        async def post(key: str, thread: str) -> tuple[str, Any]:
            got = await read_stream(http, "POST", f"{gw.url}/api/chat", json=replay_body(thread, run),
                                    headers={"X-Run-Id": run, "Authorization": f"Bearer {key}"}, stop_after=2)
            return thread, got

        async with asyncio.timeout(60):
            results = await asyncio.gather(*(post(key, thread) for key, thread in callers * 2))
        served = {thread for thread, got in results if got.status == 200}
        # Exactly one caller's run exists; everyone else is refused (404 another tenant's
        # run, 400 another thread's), never streamed the winner's log.
        assert len(served) == 1, [(t, g.status) for t, g in results]
        for thread, got in results:
            if got.status == 200:
                started = got.events[0][1]
                assert started["type"] == "RUN_STARTED" and started["threadId"] == thread
            else:
                assert got.status in (400, 404), got.status


async def test_racing_first_runs_of_two_tenants_on_one_thread_never_disclose_or_share_it(
        host: Any, make_gateway: Any, http: httpx.AsyncClient, cc: Any) -> None:
    """The thread goes to one tenant; the other gets 404 UNKNOWN_THREAD, never 409 with the
    winner's run id, never a run on the winner's thread, never a cancel of the winner's run."""
    gw: Gateway = await make_gateway(api_keys={"key-a": "tenant-a", "key-b": "tenant-b"})
    for _round in range(6):
        thread = unique("th-shared")
        runs = {"key-a": unique("run-a"), "key-b": unique("run-b")}

        async def post(key: str) -> tuple[str, int, dict[str, Any]]:
            body = {**replay_body(thread, runs[key]), "interruptActive": True}
            async with httpx.AsyncClient(trust_env=False, timeout=http.timeout) as own:
                async with own.stream("POST", f"{gw.url}/api/chat", json=body,
                                      headers={"Authorization": f"Bearer {key}"}) as resp:
                    if resp.status_code == 200:
                        return key, 200, {}
                    await resp.aread()
                    return key, resp.status_code, resp.json()

        async with asyncio.timeout(60):
            results = await asyncio.gather(post("key-a"), post("key-b"))
        winners = [key for key, status, _ in results if status == 200]
        assert len(winners) == 1, results
        winner = winners[0]
        for key, status, body in results:
            if key != winner:
                assert status == 404 and body["reason"] == "UNKNOWN_THREAD", body
                assert runs[winner] not in str(body)
        # Only the winner's run is on the thread, and it was not cancelled by the loser.
        on_thread = await cc.list_runs(thread)
        assert [r.run_id for r in on_thread] == [runs[winner]]
        assert on_thread[0].tenant == {"key-a": "tenant-a", "key-b": "tenant-b"}[winner]
        assert on_thread[0].cancel_reason != "interrupted-by-new-run"


async def test_another_tenants_id_tells_only_that_it_is_taken(
        host: Any, make_gateway: Any, http: httpx.AsyncClient) -> None:
    """Ids are one namespace for the cluster (docs/api.md "What a tenant may learn"): a start
    on another tenant's run or thread id is refused where a fresh id would start, and the
    refusal is word for word the one an id nobody uses gets from a read: nothing about the
    other tenant's run or thread comes with it."""
    gw: Gateway = await make_gateway(api_keys={"key-a": "tenant-a", "key-b": "tenant-b"})
    a_run, a_thread = unique("run-a"), unique("th-a")
    got = await read_stream(http, "POST", f"{gw.url}/api/chat", json=replay_body(a_thread, a_run),
                            headers={"Authorization": "Bearer key-a"})
    assert got.status == 200 and got.ended
    b = {"Authorization": "Bearer key-b"}
    nobody_run, nobody_thread = unique("run-none"), unique("th-none")

    def same_but_id(taken: dict[str, Any], unused: dict[str, Any], taken_id: str, unused_id: str) -> None:
        assert json.loads(json.dumps(taken).replace(taken_id, unused_id)) == unused

    r = await http.post(f"{gw.url}/api/chat", json=replay_body(unique("th-b"), a_run), headers=b)
    unused = await http.get(f"{gw.url}/api/runs/{nobody_run}", headers=b)
    assert r.status_code == unused.status_code == 404
    same_but_id(r.json(), unused.json(), a_run, nobody_run)
    r = await http.post(f"{gw.url}/api/chat", json=replay_body(a_thread, unique("run-b")), headers=b)
    unused = await http.get(f"{gw.url}/api/threads/{nobody_thread}/messages", headers=b)
    assert r.status_code == unused.status_code == 404 and r.json()["reason"] == "UNKNOWN_THREAD"
    same_but_id(r.json(), unused.json(), a_thread, nobody_thread)
