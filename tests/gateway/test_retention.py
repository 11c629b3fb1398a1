"""A transcript outlives its run records (retention, docs/design.md §3.5): the thread stays
its tenant's, so the saved transcript is still served to it, and to nobody else."""
from __future__ import annotations

from typing import Any

import httpx

from baton.coordinator_client import CoordinatorClient
from baton.log import DeliveryLog, TranscriptStore
from baton.v1.runs_pb2 import RunRecord, RunStatus
from coordinator import retention
from coordinator._etcd import Etcd
from coordinator._store import RunStore
from tests.conftest import unique
from tests.gateway.conftest import Gateway

OLD = 1000.0  # Unix seconds: far older than anything other tests write to this prefix


async def test_a_thread_whose_records_retention_deleted_keeps_its_transcript_and_owner(
        coordinator: Any, etcd: Any, cc: CoordinatorClient, dlog: DeliveryLog, make_gateway: Any,
        http: httpx.AsyncClient) -> None:
    gw: Gateway = await make_gateway(api_keys={"key-a": "tenant-a", "key-b": "tenant-b"})
    a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    run_id, thread = unique("run-"), unique("th-")
    await cc.create_or_resume_run(RunRecord(run_id=run_id, thread_id=thread, tenant="tenant-a"))
    await cc.update_run(run_id, RunRecord(status=RunStatus.RUN_STATUS_COMPLETED, finished_at=OLD),
                        ["status", "finished_at"])
    msgs = [{"id": "u1", "role": "user", "content": "hi"}, {"id": "a1", "role": "assistant", "content": "yo"}]
    await TranscriptStore(dlog.nc, dlog.cfg).save(thread, msgs)

    store = RunStore(Etcd([etcd.endpoint]), coordinator.env["BATON_ETCD_PREFIX"], cache_size=0)
    try:
        assert await retention.expire(store, OLD + 1, timeout=5) >= 1
    finally:
        await store.etcd.close()

    assert (await http.get(f"{gw.url}/api/runs/{run_id}", headers=a)).status_code == 404
    r = await http.get(f"{gw.url}/api/threads/{thread}/messages", headers=a)
    assert r.status_code == 200 and r.json()["messages"] == msgs
    r = await http.get(f"{gw.url}/api/chat", params={"threadId": thread}, headers=a)
    # The TanStack hydration shape: UI messages with parts.
    ui = [{"id": "u1", "role": "user", "parts": [{"type": "text", "content": "hi"}]},
          {"id": "a1", "role": "assistant", "parts": [{"type": "text", "content": "yo"}]}]
    assert r.status_code == 200 and r.json() == {"messages": ui, "activeRun": None, "page": {"truncated": False}}
    # Another tenant still cannot read it, nor take the thread over.
    assert (await http.get(f"{gw.url}/api/threads/{thread}/messages", headers=b)).status_code == 404
    assert (await http.get(f"{gw.url}/api/chat", params={"threadId": thread}, headers=b)).status_code == 404
