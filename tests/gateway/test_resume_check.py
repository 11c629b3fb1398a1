"""A resume's offset check begun beside the run's lookup: what the caller gets is the same as
when the check followed the lookup (tenancy first; a run that appears during the join's wait
is checked when the read opens), and a check the caller never gets leaves nothing behind."""
from __future__ import annotations

import asyncio
from typing import Any

import httpx

from baton.coordinator_client import CoordinatorClient
from baton.log import DeliveryLog
from tests.conftest import assert_eventually, unique
from tests.gateway.conftest import Gateway, metric, read_stream, run_chunks, wait_for_metric, write_run
from tests.gateway.test_routes import metrics_text, new_record

JOINS_WAITING = "baton_gateway_joins_waiting_for_run"


def offset_checks(run_id: str) -> list[asyncio.Task[Any]]:
    """The gateway's offset checks of ``run_id`` still running (gateways here share this loop)."""
    return [t for t in asyncio.all_tasks() if t.get_name() == f"offset-check:{run_id}" and not t.done()]


async def test_a_resume_that_waits_for_its_run_gets_exactly_what_follows_its_offset(
        gateway: Gateway, http: httpx.AsyncClient, dlog: DeliveryLog) -> None:
    """The check begun at once found no log; the run appears during the wait: the read checks
    again when it opens and serves every chunk after the offset, then the end."""
    _, before = await write_run(dlog, unique("run"), run_chunks("x", "t", ["older run"]))
    run_id = unique("run")
    chunks = run_chunks(run_id, "t", ["late", " but here"])
    join = asyncio.create_task(read_stream(http, "GET", f"{gateway.url}/api/chat", params={"runId": run_id},
                                           headers={"Last-Event-ID": before[-1]}))
    await wait_for_metric(http, gateway.url, JOINS_WAITING, 1)
    assert not offset_checks(run_id)  # the wait dropped the check begun beside the first lookup
    _, offsets = await write_run(dlog, run_id, chunks)
    async with asyncio.timeout(15):
        got = await join
    assert got.status == 200 and got.events == list(zip(offsets, chunks)) and got.ended


async def test_a_resume_refused_by_tenancy_answers_404_and_leaves_no_check(
        make_gateway: Any, http: httpx.AsyncClient, dlog: DeliveryLog) -> None:
    """With auth a run needs a record of the caller's tenant: a log alone is not enough. The
    offset check begun beside the lookup tells the caller nothing (not the gap its offset
    would get, nor the log's end) and is gone once the answer is."""
    gw = await make_gateway(keepalive=0.5, api_keys={"k1": "tenant-a"})
    run_id = unique("run")
    _, offsets = await write_run(dlog, run_id, run_chunks(run_id, "t", ["not", " yours"]))
    for offset in (offsets[0], offsets[-1], "1"):
        async with asyncio.timeout(20):
            resp = await http.get(f"{gw.url}/api/chat", params={"runId": run_id},
                                  headers={"Last-Event-ID": offset, "Authorization": "Bearer k1",
                                           "Accept": "text/event-stream"})
        assert resp.status_code == 404 and resp.json()["reason"] == "UNKNOWN_RUN"
    await assert_eventually(lambda: not offset_checks(run_id), timeout=10)


async def test_a_resume_whose_client_leaves_during_the_lookup_leaves_no_check(
        gateway: Gateway, http: httpx.AsyncClient) -> None:
    """A client that gives up while the join waits for its run: the check goes with it."""
    run_id = unique("run")
    join = asyncio.create_task(read_stream(http, "GET", f"{gateway.url}/api/chat", params={"runId": run_id},
                                           headers={"Last-Event-ID": "5"}))
    await wait_for_metric(http, gateway.url, JOINS_WAITING, 1)
    join.cancel()
    await asyncio.gather(join, return_exceptions=True)
    await wait_for_metric(http, gateway.url, JOINS_WAITING, 0)
    assert not offset_checks(run_id)


async def test_a_resume_without_auth_is_served_and_still_looks_at_the_run_for_a_takeover(
        gateway: Gateway, http: httpx.AsyncClient, cc: CoordinatorClient, dlog: DeliveryLog) -> None:
    """Without auth a resume of a log with records does not wait for the run's record; the
    record is still read beside it, and a running run nobody holds is taken over as before."""
    orphan = await new_record(cc)
    chunks = run_chunks(orphan.run_id, orphan.thread_id, ["a", "b"])
    _, offsets = await write_run(dlog, orphan.run_id, chunks)
    async with asyncio.timeout(15):
        got = await read_stream(http, "GET", f"{gateway.url}/api/chat", params={"runId": orphan.run_id},
                                headers={"Last-Event-ID": offsets[1]})
    assert got.status == 200 and got.events == list(zip(offsets[2:], chunks[2:])) and got.ended

    async def looked() -> bool:
        return metric(await metrics_text(http, gateway), "baton_gateway_takeover_decisions_total",
                      decision="takeover") == 1
    await assert_eventually(looked, timeout=15)
