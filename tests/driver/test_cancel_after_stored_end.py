"""A cancel that lands after the run's end was stored, but before its log was closed, adds
nothing after that end (AG-UI: no event follows ``RUN_FINISHED`` / ``RUN_ERROR``).

The interleaving: a host stores the agent's ``RUN_FINISHED``, cannot close the log (NATS or
its session went away) and lets the run go; a cancel is then flagged on the record. The
successor's claim carries the flag, so it decides the cancel before its sandbox or replay
has shown it the stored end. It must not append ``run.cancelled`` + ``RUN_ERROR`` after the
stored end: the log closes ``aborted`` (the flag was acknowledged before the end was
*closed*; docs/design.md §5.5) with the stored terminal event as the last chunk, as when the
driver itself finds the flag right after storing the end.

Real etcd, NATS and coordinator; the first host is played by the test's own writer.
"""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sandbox_host.deps import HostDeps, HostSettings
from sandbox_host.driver import RunDriver
from tests.driver.conftest import Cluster
from tests.driver.test_finalize_inputs import _orphan

pytestmark = pytest.mark.timeout(120)



def _answer_and_end(run_id: str, thread_id: str) -> list[dict[str, Any]]:
    """What the first host stored after the opening: the agent's answer and its end."""
    return [{"type": "TEXT_MESSAGE_START", "messageId": "a1", "role": "assistant"},
            {"type": "TEXT_MESSAGE_CONTENT", "messageId": "a1", "delta": "done"},
            {"type": "TEXT_MESSAGE_END", "messageId": "a1"},
            {"type": "RUN_FINISHED", "threadId": thread_id, "runId": run_id}]


@pytest.mark.parametrize("mode", ["attach", "finalize"])
async def test_a_cancel_after_the_stored_end_appends_nothing_after_it(hostless: Cluster, mode: str) -> None:
    c = hostless
    run_id, thread_id = await _orphan(c, tail=_answer_and_end)  # died before its close record
    end = _answer_and_end(run_id, thread_id)[-1]
    await c.cc.request_run_cancel(run_id, reason="user")
    session = await c.cc.open_session(ttl=5, owner="successor")
    try:
        deps = HostDeps(host_id="successor", cc=c.cc, session=session, log=c.log,
                        transcripts=c.transcripts, providers={}, settings=HostSettings(cancel_grace=1.0))
        epoch2, rec2 = await c.cc.claim_run(run_id, session, "successor", purpose="finalize")
        assert rec2.cancel_requested
        driver = RunDriver(deps, rec2, epoch2, mode, c.log.writer(run_id, epoch2))
        async with asyncio.timeout(90):
            await driver.run()
    finally:
        await session.close()
    chunks = [ch for _, ch in await c.read_all(run_id, timeout=30)]
    assert chunks[-1] == end  # the stored end stays the last event
    assert [ch["type"] for ch in chunks].count("RUN_FINISHED") == 1
    assert not any(ch["type"] == "RUN_ERROR" or ch.get("name") == "run.cancelled" for ch in chunks)
    done = await c.wait_status(run_id, "aborted")
    assert done.driver_epoch == epoch2 and done.cancel_reason == "user"
