"""A StartRun that meets a cancel and then another finalizer's claim joins the run.

The start's drive claim is refused ``cancel_requested`` (a cancel landed between its create
and its claim), so it claims to finalize; another claimant got there first (the gateway's
cancel handed the run to a host to finalize), so that claim is refused ``held``. The start
follows the run as for a drive claim refused ``held`` and joins it. It raised
``RunClaimNotAcquired`` (found by a breaker), and the client's ``POST /api/chat`` got 409.
"""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.conftest import unique
from tests.driver.conftest import Cluster
from tests.driver.test_session_lost_mid_run import TTL, _Host, _start_request, host  # noqa: F401 - the fixture

pytestmark = pytest.mark.servers


@pytest.mark.timeout(120)
async def test_a_start_that_meets_a_cancel_and_another_finalizer_follows_it(host: tuple[Cluster, _Host]) -> None:
    c, h = host
    run_id, thread_id = unique("run-"), unique("thr-")
    other = await c.cc.open_session(ttl=TTL, owner="other-host")
    real_claim = h.coordinator.claim_run
    calls: list[str] = []
    closing: list[asyncio.Task[None]] = []

    async def claim_run(rid: str, session: Any, host_id: str, **kw: Any) -> Any:
        purpose = kw.get("purpose", "drive")
        calls.append(purpose)
        if purpose == "drive" and len(calls) == 1:
            await c.cc.request_run_cancel(rid, "user")  # the user cancels while it starts
        if purpose == "finalize" and calls.count("finalize") == 1:
            # The gateway's cancel found no claim and handed the run to another host to
            # finalize: its claim lands first. That host then dies (its session closes,
            # its claim goes) while the start follows the run.
            await c.cc.claim_run(rid, other, "other-host", purpose="finalize")
            try:
                return await real_claim(rid, session, host_id, **kw)
            finally:
                closing.append(asyncio.create_task(other.close()))
        return await real_claim(rid, session, host_id, **kw)

    h.coordinator.claim_run = claim_run  # type: ignore[method-assign]
    try:
        async with asyncio.timeout(60):
            record, created = await h.manager.start_run(_start_request(run_id, thread_id))
        # Followed, not refused: once the other claim went, the start finalized the run itself.
        assert calls == ["drive", "finalize", "finalize"]
        assert created and record.run_id == run_id
        final = await c.wait_status(run_id, "aborted", timeout=30)
        assert final.cancel_reason == "user"
    finally:
        await asyncio.gather(*closing)
        await other.close()
