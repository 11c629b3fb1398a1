"""A full JetStream store as a browser sees it: a new run is refused with
``503 LOG_STORAGE_FULL`` at once (not a 200 that never streams), an open stream gets a
notice naming the cause instead of bare keep-alives, and once nats-server stores again
(restarted with free space) the stream goes on and ends with every chunk once."""
from __future__ import annotations

import asyncio
import json
import pathlib

import httpx
import pytest

from baton.errors import LogStorageFull
from baton.log import DeliveryLog
from baton_tools.testing.servers import NatsServer
from tests.conftest import assert_eventually, unique
from tests.gateway.conftest import GatewayFactory, read_stream
from tests.gateway.test_e2e import replay_body
from tests.log.conftest import chunk, unique_cfg
from tests.log.test_storage_full import fill, small_nats, tmpfs_dir  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(240)


async def first_notice(http: httpx.AsyncClient, url: str, *, ndjson: bool) -> str:
    """Open a stream and return its first notice line (SSE comment or NDJSON object)."""
    headers = {"Accept": "application/x-ndjson"} if ndjson else {}
    async with http.stream("GET", url, headers=headers) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if ndjson and line.strip() and "notice" in json.loads(line):
                return line
            if not ndjson and line.startswith(": notice"):
                return line
    raise AssertionError("the stream ended without a notice")


async def test_full_store_refuses_new_runs_and_notices_streams(
    small_nats: NatsServer, tmpfs_dir: pathlib.Path, make_gateway: GatewayFactory, http: httpx.AsyncClient
) -> None:
    cfg = unique_cfg()
    log = await DeliveryLog.connect(small_nats.url, cfg)
    try:
        await log.provision()
        gw = await make_gateway(nats_url=small_nats.url, log_config=cfg, keepalive=0.3)
        run_id = unique("disk-run-")
        w = log.writer(run_id, 1, publish_timeout=0.5)
        await w.fence()
        expected = [chunk(i) for i in range(6)]
        await w.append(expected[:3])

        filler = fill(tmpfs_dir)

        async def not_storing() -> bool:
            try:
                await log.probe_storage("test", timeout=2.0)
            except LogStorageFull:
                return True
            return False

        await assert_eventually(not_storing, timeout=90, interval=0.5)

        # A new run: 503 naming the cause, at once, and nothing started.
        thread = unique("t-")
        new_run = unique("r-")
        r = await http.post(f"{gw.url}/api/chat", json=replay_body(thread, new_run), timeout=30)
        assert r.status_code == 503
        body = r.json()
        assert body["reason"] == "LOG_STORAGE_FULL"
        assert "storage full" in body["error"]
        r = await http.get(f"{gw.url}/api/runs/{new_run}")
        assert r.status_code == 404

        # Open streams: a notice (not log data) naming the cause, SSE and NDJSON.
        url = f"{gw.url}/api/chat?runId={run_id}&offset=-1"
        async with asyncio.timeout(30):
            line = await first_notice(http, url, ndjson=False)
        assert line.startswith(": notice LOG_STORAGE_FULL ") and "storage full" in line
        async with asyncio.timeout(30):
            line = await first_notice(http, url, ndjson=True)
        assert json.loads(line)["notice"]["reason"] == "LOG_STORAGE_FULL"

        # Storage back (freed, then nats-server restarted: 2.15 needs it): the run goes on.
        filler.unlink()
        small_nats.restart()

        async def stores() -> bool:
            return await gw.state.log_health.problem() is None

        await assert_eventually(stores, timeout=30, interval=0.5)
        await w.append(expected[3:])
        assert await w.close("completed")
        got = await read_stream(http, "GET", url)
        assert got.ended
        assert [c for _, c in got.events] == expected
    finally:
        await log.close()
