"""Found by the breaker: two POSTs racing on one new run id must never serve one caller the
other's run (another tenant's log, or a run of another thread).

Gateway + real coordinator + a real sandbox host running the replay agent.
"""
from __future__ import annotations

import asyncio
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

        results = await asyncio.wait_for(
            asyncio.gather(*(post(key, thread) for key, thread in callers * 2)), 60)
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
