"""The chat page and the operator view show until when a client asked to keep its run
(tests/node/page_keep.mjs)."""
from __future__ import annotations

import time

import httpx
import pytest

from baton.coordinator_client import CoordinatorClient
from baton.log import DeliveryLog
from baton.v1 import runs_pb2
from sandbox_host.machine import accepted_chunk
from tests.conftest import unique
from tests.gateway.conftest import GatewayFactory
from tests.gateway.test_pages import KEYS, A, need_browser, run_page_script


@pytest.mark.browser
@pytest.mark.timeout(200)
async def test_the_page_says_until_when_a_kept_run_is_kept(make_gateway: GatewayFactory, cc: CoordinatorClient,
                                                           dlog: DeliveryLog) -> None:
    node = need_browser()
    gw = await make_gateway(keepalive=0.5, api_keys=KEYS)
    run, thread, host = unique("run-"), unique("thread-"), unique("host-")
    # A running run a live session drives (so joining it starts no takeover), detached, then kept.
    await cc.create_or_resume_run(runs_pb2.RunRecord(run_id=run, thread_id=thread, tenant=KEYS["key-a"],
                                                     agent=runs_pb2.AgentSpec(kind="replay")))
    session = await cc.open_session(10.0, owner=host)
    try:
        epoch, _ = await cc.claim_run(run, session, host)
        writer = dlog.writer(run, epoch)
        await writer.fence()
        mid = f"{run}-m"
        await writer.append([{"type": "RUN_STARTED", "threadId": thread, "runId": run},
                             accepted_chunk(run, thread, "replay", [{"id": "u", "role": "user", "content": "keep me"}]),
                             {"type": "TEXT_MESSAGE_START", "messageId": mid, "role": "assistant"},
                             {"type": "TEXT_MESSAGE_CONTENT", "messageId": mid, "delta": "working"}], origin="host")
        await cc.update_run(run, runs_pb2.RunRecord(detached_since=time.time()), ["detached_since"])
        async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
            r = await http.post(f"{gw.url}/api/runs/{run}/keep", json={"ttlSeconds": 4 * 3600}, headers=A)
            assert r.status_code == 200, r.text
            kept_until = r.json()["keptUntil"]
        result = await run_page_script(node, "page_keep.mjs", gw, timeout=180,
                                       env={"BATON_THREAD": thread, "BATON_RUN": run,
                                            "BATON_KEPT_UNTIL": repr(kept_until)})
        assert "kept until" in result["info"] and "kept until" in result["opsRow"][6]
        await writer.close("aborted", finished_at=time.time())
        await cc.update_run(run, runs_pb2.RunRecord(status=runs_pb2.RUN_STATUS_ABORTED, finished_at=time.time()),
                            ["status", "finished_at"], epoch=epoch, session_id=session)
    finally:
        await session.close()
