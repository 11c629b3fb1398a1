"""The gateway's takeover trigger end to end: a detached run whose host died is taken over
by a live host when readers come back (docs/design.md §6), exactly once.

The coordinator here runs in-process with no leader tasks, so its proactive failover does
not race the gateway: the takeover under test is the one a join triggers.
"""
from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import httpx

from baton.coordinator_client import CoordinatorClient
from baton.log import LogConfig
from baton_tools.testing.cluster import start_coordinator, start_host
from tests.conftest import assert_eventually, unique
from tests.gateway.conftest import SLOW_TEXT, host_settings, metric, read_stream


async def test_two_readers_join_an_orphaned_detached_run_one_takeover_same_sequence(
        etcd: Any, nats: Any, log_cfg: LogConfig, replay_dir: pathlib.Path, tmp_path: pathlib.Path,
        make_gateway: Any, http: httpx.AsyncClient) -> None:
    coord = await start_coordinator(etcd.endpoint, f"/{unique('tk')}/", in_process=True)
    hosts: list[Any] = []
    try:
        settings = host_settings(log_cfg, replay_dir, tmp_path)
        host_a = await start_host(coord.address, nats.url, log_dir=tmp_path, **settings)
        hosts.append(host_a)
        gw = await make_gateway(coordinator=(coord.address,))
        thread, run = unique("th"), unique("run")
        body = {"threadId": thread, "runId": run, "messages": [{"id": "u", "role": "user", "content": "go"}],
                "agent": {"kind": "replay", "journal": "claude-stream-json/slow.jsonl", "speed": 1, "delay": 0.08}}
        first = await read_stream(http, "POST", f"{gw.url}/api/chat", json=body, stop_after=4)
        assert len(first.events) == 4  # then the client leaves: the run is detached

        await host_a.kill()  # the driver dies; its agent lives on in its own session
        async with CoordinatorClient(coord.address) as cc:
            async def orphaned() -> bool:
                view = await cc.get_run(run)
                return view.claim is None and view.record.status == 1  # RUNNING, no live claim
            await assert_eventually(orphaned, timeout=15)
            host_b = await start_host(coord.address, nats.url, log_dir=tmp_path, **settings)
            hosts.append(host_b)

            # Two readers at the same moment.
            url = f"{gw.url}/api/chat"
            async with asyncio.timeout(60):
                r1, r2 = await asyncio.gather(
                    read_stream(http, "GET", url, params={"runId": run, "offset": "-1"}),
                    read_stream(http, "GET", url, params={"runId": run, "offset": "-1"}))

            assert r1.events == r2.events
            offsets = [o for o, _ in r1.events]
            assert len(set(offsets)) == len(offsets)
            assert r1.events[:4] == first.events
            assert "".join(c["delta"] for _, c in r1.events if c["type"] == "TEXT_MESSAGE_CONTENT") == SLOW_TEXT
            assert r1.events[-1][1]["type"] == "RUN_FINISHED" and r1.ended and r2.ended

            # What a client asks once its stream ended: the run view, settled by the close
            # record (the host closes the log one etcd write before the record turns
            # terminal: docs/design.md §5.5, the window CI once caught here).
            assert (await http.get(f"{gw.url}/api/runs/{run}")).json()["status"] == "completed"

            async def recorded_completed() -> bool:
                return (await cc.get_run(run)).record.status == 3  # COMPLETED
            await assert_eventually(recorded_completed, timeout=15)
            view = await cc.get_run(run)
            assert view.record.driver_epoch == 2  # one takeover, no more
            assert view.record.driver_host == host_b.host_id

        text = (await http.get(f"{gw.url}/metrics")).text
        assert metric(text, "baton_gateway_takeover_decisions_total", decision="takeover") == 1
        assert (metric(text, "baton_gateway_takeover_decisions_total", decision="in-flight")
                + metric(text, "baton_gateway_takeover_decisions_total", decision="claimed")) == 1
        assert metric(text, "baton_gateway_takeovers_total", outcome="attached") == 1
    finally:
        for h in hosts:
            await h.stop()
        await coord.stop()
