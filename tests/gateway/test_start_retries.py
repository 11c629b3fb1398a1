"""Retried and cancelled starts with real processes: a coordinator, a host, a
gateway, and a nats-server of the test's own paused (SIGSTOP) while the first POST arrives.
"""
from __future__ import annotations

import asyncio
import signal
from typing import Any

import httpx
import pytest

from baton.coordinator_client import CoordinatorClient
from baton.runs import RUN_ACCEPTED, status_name
from tests.conftest import assert_eventually, freeze, unique
from tests.gateway.conftest import read_stream
from tests.gateway.test_start_atomicity import assert_started_with_input, chat_body, log_chunks, plane  # noqa: F401


async def _failed_start(http: httpx.AsyncClient, gw: Any, own_nats: Any, run_id: str, thread_id: str) -> None:
    """A POST that got past the gateway's log probe (answered just before NATS paused) and
    failed half-way: the run exists, still ``starting``."""
    assert await gw.app.state.gateway.log_health.problem() is None  # cached for 3 s
    await freeze(own_nats.proc)
    try:
        r = await http.post(f"{gw.url}/api/chat", json=chat_body(run_id, thread_id, "first"))
    finally:
        own_nats.proc.send_signal(signal.SIGCONT)
    assert r.status_code == 503, r.text
    assert r.json()["reason"] == "LOG_UNAVAILABLE" and r.json()["runExists"] is True


@pytest.mark.timeout(180)
async def test_five_clients_retrying_a_failed_start_at_once_start_it_once(
        plane: dict[str, Any], own_nats: Any, make_gateway: Any) -> None:  # noqa: F811
    p = plane
    cc: CoordinatorClient = p["cc"]
    gw = await make_gateway(coordinator=(p["coord"].address,), nats_url=own_nats.url)
    run_id, thread_id = unique("run-"), unique("thr-")
    async with httpx.AsyncClient(trust_env=False, timeout=60) as http:
        await _failed_start(http, gw, own_nats, run_id, thread_id)
        epoch = (await cc.get_run(run_id)).record.driver_epoch
        streams = await asyncio.gather(*(
            read_stream(http, "POST", f"{gw.url}/api/chat", json=chat_body(run_id, thread_id, "first"))
            for _ in range(5)))
    for s in streams:
        assert s.status == 200 and s.ended
        assert s.events == streams[0].events  # every client reads the one run, from its start
    assert streams[0].events[0][1]["type"] == "RUN_STARTED"
    assert streams[0].events[1][1]["name"] == RUN_ACCEPTED
    await assert_started_with_input(p, run_id, thread_id, "first")
    assert (await cc.get_run(run_id)).record.driver_epoch == epoch + 1  # one start, one agent


@pytest.mark.timeout(180)
async def test_cancelling_a_failed_start_ends_it_aborted_without_an_agent(
        plane: dict[str, Any], own_nats: Any, make_gateway: Any) -> None:  # noqa: F811
    p = plane
    cc: CoordinatorClient = p["cc"]
    gw = await make_gateway(coordinator=(p["coord"].address,), nats_url=own_nats.url)
    run_id, thread_id = unique("run-"), unique("thr-")
    async with httpx.AsyncClient(trust_env=False, timeout=60) as http:
        await _failed_start(http, gw, own_nats, run_id, thread_id)
        assert (await cc.get_run(run_id)).record.starting
        r = await http.post(f"{gw.url}/api/chat/cancel?wait=true&timeout=30", json={"runId": run_id})
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "aborted"
        # A retried POST now serves the ended run: nothing is started.
        again = await read_stream(http, "POST", f"{gw.url}/api/chat", json=chat_body(run_id, thread_id, "first"))
        assert again.status == 200 and again.ended
    rec = (await cc.get_run(run_id)).record
    assert status_name(rec.status) == "aborted"
    assert await cc.get_sandbox(run_id) is None
    async with asyncio.timeout(30):
        chunks = await log_chunks(p["log"], run_id)
    assert not any(c["type"].startswith(("TEXT_MESSAGE", "TOOL_CALL")) for c in chunks), chunks

    async def no_agent() -> bool:
        assert await cc.get_sandbox(run_id) is None
        return True

    await assert_eventually(no_agent, timeout=5, interval=0.1)
