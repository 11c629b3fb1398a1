"""A tenant-wide ``ListRuns`` is served page by page from the coordinator's started index
(docs/design.md §3.5): real gateway, coordinator and etcd; the records seeded into etcd."""
from __future__ import annotations

import time
from typing import Any

import grpc
import httpx
import pytest

from baton.coordinator_client import CoordinatorClient
from baton.v1 import runs_service_pb2 as pb, runs_service_pb2_grpc as pbg
from baton.v1.runs_pb2 import RunRecord
from baton_tools.testing.seed import seed, terminal_record
from coordinator import _etcd as E
from tests.conftest import unique
from tests.grpc.conftest import CHANNEL_OPTIONS, error_info

SEEDED = 23
PAGE = 5


@pytest.mark.timeout(120)
async def test_pages_concatenate_to_the_tenants_runs_in_order_under_concurrent_inserts(
        etcd: Any, coordinator: Any, cc: CoordinatorClient, make_gateway: Any) -> None:
    tenant, other = unique("ten"), unique("oth")
    tag = unique("lp")
    now = time.time()
    mine = [terminal_record(i, tag=tag, finished_at=now - 1000 + i, tenant=tenant) for i in range(SEEDED)]
    theirs = [terminal_record(100 + i, tag=tag, finished_at=now - 1000 + i, tenant=other) for i in range(4)]
    raw = E.Etcd([etcd.endpoint])
    try:
        await seed(raw, coordinator.env["BATON_ETCD_PREFIX"], [*mine, *theirs])
    finally:
        await raw.close()
    gw = await make_gateway(grpc_listen="127.0.0.1:0", api_keys={"k": tenant})
    meta = [("authorization", "Bearer k")]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.state.grpc_port}", options=CHANNEL_OPTIONS) as ch:
        runs = pbg.RunsStub(ch)
        seen: list[str] = []
        token, pages = "", 0
        while True:
            page = await runs.ListRuns(pb.RunListRequest(page_size=PAGE, page_token=token), metadata=meta)
            assert len(page.runs) <= PAGE
            seen += [r.run_id for r in page.runs]
            pages += 1
            if pages == 2:
                # Inserted mid-walk: one that sorts before the walk's position (not returned)
                # and one started now, after every seeded run (returned on a later page).
                early = RunRecord(run_id=unique("early"), thread_id=unique("th"), tenant=tenant, started_at=now - 5000)
                late = RunRecord(run_id=unique("late"), thread_id=unique("th"), tenant=tenant)
                for rec in (early, late):
                    assert (await cc.create_or_resume_run(rec))[1]
            token = page.next_page_token
            if not token:
                break
        assert len(seen) == len(set(seen))
        assert seen == [r.run_id for r in mine] + [late.run_id]
        assert pages == (SEEDED + 1 + PAGE - 1) // PAGE

        # A token this API did not make: INVALID_ARGUMENT, with the field.
        for bad in ("garbage!", "MDAw", "x" * 40):
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await runs.ListRuns(pb.RunListRequest(page_size=PAGE, page_token=bad), metadata=meta)
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            info = error_info(ei.value)
            assert info.reason == "INVALID_ARGUMENT" and info.metadata["field"] == "page_token"

    # The web pages' thread list: the tenant's newest runs first, from one bounded read.
    async with httpx.AsyncClient(headers={"authorization": "Bearer k"}) as http:
        threads = (await http.get(f"{gw.url}/api/threads")).json()["threads"]
    assert [t["lastRunId"] for t in threads][:3] == [late.run_id, mine[-1].run_id, mine[-2].run_id]
    assert early.run_id in [t["lastRunId"] for t in threads]
    assert not {t["lastRunId"] for t in threads} & {r.run_id for r in theirs}
