"""Keeping a detached run longer than the default TTL (docs/api.md "Keeping a detached run").

Real etcd, NATS, coordinator and gateway. The reaper is driven through the coordinator's
``Reap`` RPC with an explicit ``now``, so "an hour later" needs no waiting.
"""
from __future__ import annotations

import time
from typing import Any

import grpc
import httpx
import pytest

from baton.coordinator_client import CoordinatorClient
from baton.v1 import runs_service_pb2 as rpb, runs_service_pb2_grpc as rpbg
from baton.v1.runs_pb2 import RunRecord
from tests.conftest import unique
from tests.gateway.conftest import Gateway

pytestmark = pytest.mark.timeout(120)

KEYS = {"key-alpha": "alpha", "key-beta": "beta"}
ALPHA = {"Authorization": "Bearer key-alpha"}
BETA = {"Authorization": "Bearer key-beta"}
DEFAULT_TTL = 3600.0  # the gateway tests' coordinator (tests/gateway/conftest.py)


async def _detached_run(cc: CoordinatorClient, tenant: str = "alpha") -> RunRecord:
    """A running run of ``tenant`` nobody drives or reads, detached now."""
    rec, created = await cc.create_or_resume_run(RunRecord(run_id=unique("run-"), thread_id=unique("th-"),
                                                           tenant=tenant))
    assert created
    _, rec2 = await cc.update_run(rec.run_id, RunRecord(detached_since=time.time()), ["detached_since"])
    assert rec2 is not None
    return rec2


async def test_kept_run_outlives_the_default_ttl_and_is_reaped_after_the_grant(
        make_gateway: Any, cc: CoordinatorClient) -> None:
    gw: Gateway = await make_gateway(api_keys=KEYS)
    rec = await _detached_run(cc)
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        r = await http.post(f"{gw.url}/api/runs/{rec.run_id}/keep", json={"ttlSeconds": 7200}, headers=ALPHA)
        assert r.status_code == 200, r.text
        kept = r.json()
        assert kept["runId"] == rec.run_id and kept["requestedSeconds"] == 7200 and kept["grantedSeconds"] == 7200
        until = kept["keptUntil"]
        assert until >= rec.detached_since + 7200 - 60
        view = (await http.get(f"{gw.url}/api/runs/{rec.run_id}", headers=ALPHA)).json()
        assert view["keptUntil"] == until and view["reapAt"] == until  # the reaper acts then, not at the TTL
        # A shorter keep-alive never shortens what was granted.
        r = await http.post(f"{gw.url}/api/runs/{rec.run_id}/keep", json={"ttlSeconds": 10}, headers=ALPHA)
        assert r.status_code == 200 and r.json()["keptUntil"] == until and r.json()["grantedSeconds"] == 10

    # Past the default TTL, before the grant: the reaper leaves it running.
    await cc.reap(now=rec.detached_since + DEFAULT_TTL + 60)
    after = (await cc.get_run(rec.run_id)).record
    assert not after.cancel_requested and after.kept_until == until
    # Past the grant: reaped.
    await cc.reap(now=until + 1)
    after = (await cc.get_run(rec.run_id)).record
    assert after.cancel_requested and after.cancel_reason == "reaped"


async def test_a_run_without_a_keep_is_reaped_at_the_default_ttl(cc: CoordinatorClient) -> None:
    rec = await _detached_run(cc)
    await cc.reap(now=rec.detached_since + DEFAULT_TTL)  # inclusive
    after = (await cc.get_run(rec.run_id)).record
    assert after.cancel_requested and after.cancel_reason == "reaped"


async def test_a_request_above_the_maximum_is_clamped(make_gateway: Any, cc: CoordinatorClient) -> None:
    gw: Gateway = await make_gateway(api_keys=KEYS, detached_ttl_max=5000.0)
    rec = await _detached_run(cc)
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        before = time.time()
        r = await http.post(f"{gw.url}/api/runs/{rec.run_id}/keep", json={"ttlSeconds": 1e6}, headers=ALPHA)
        assert r.status_code == 200, r.text
        assert r.json()["requestedSeconds"] == 1e6 and r.json()["grantedSeconds"] == 5000
        assert before + 5000 <= r.json()["keptUntil"] <= time.time() + 5000
    assert (await cc.get_run(rec.run_id)).record.kept_until == r.json()["keptUntil"]


async def test_bad_values_are_refused_and_change_nothing(make_gateway: Any, cc: CoordinatorClient) -> None:
    gw: Gateway = await make_gateway(api_keys=KEYS)
    rec = await _detached_run(cc)
    url = f"{gw.url}/api/runs/{rec.run_id}/keep"
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        for body in ({"ttlSeconds": 0}, {"ttlSeconds": -5}, {"ttlSeconds": "an hour"}, {"ttlSeconds": True},
                     {}, {"ttlSeconds": 60, "extra": 1}):
            r = await http.post(url, json=body, headers=ALPHA)
            assert r.status_code == 400 and r.json()["reason"] == "INVALID_ARGUMENT", (body, r.text)
        for raw in ("NaN", "Infinity"):
            r = await http.post(url, content='{"ttlSeconds": %s}' % raw, headers={**ALPHA, "Content-Type": "application/json"})
            assert r.status_code == 400, (raw, r.text)
        for q in ("abc", "-1", "inf", "nan"):
            r = await http.get(f"{gw.url}/api/chat", params={"runId": rec.run_id, "offset": "-1", "keepTtl": q},
                               headers=ALPHA)
            assert r.status_code == 400 and r.json()["field"] == "keepTtl", (q, r.text)
    assert not (await cc.get_run(rec.run_id)).record.HasField("kept_until")


async def test_another_tenant_cannot_keep_the_run(make_gateway: Any, cc: CoordinatorClient) -> None:
    gw: Gateway = await make_gateway(api_keys=KEYS, grpc_listen="127.0.0.1:0")
    rec = await _detached_run(cc)
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        r = await http.post(f"{gw.url}/api/runs/{rec.run_id}/keep", json={"ttlSeconds": 600}, headers=BETA)
        assert r.status_code == 404 and r.json()["reason"] == "UNKNOWN_RUN", r.text
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.state.grpc_port}") as ch:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await rpbg.RunsStub(ch).KeepRun(rpb.RunKeepRequest(run_id=rec.run_id, ttl_seconds=600),
                                            metadata=[("authorization", "Bearer key-beta")], timeout=30)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert not (await cc.get_run(rec.run_id)).record.HasField("kept_until")


async def test_grpc_keep_run_and_join_with_a_keep(make_gateway: Any, cc: CoordinatorClient) -> None:
    gw: Gateway = await make_gateway(api_keys=KEYS, grpc_listen="127.0.0.1:0", detached_ttl_max=9000.0)
    rec = await _detached_run(cc)
    md = [("authorization", "Bearer key-alpha")]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.state.grpc_port}") as ch:
        stub = rpbg.RunsStub(ch)
        resp = await stub.KeepRun(rpb.RunKeepRequest(run_id=rec.run_id, ttl_seconds=20000), metadata=md, timeout=30)
        assert resp.granted_seconds == 9000 and resp.requested_seconds == 20000
        assert resp.run.kept_until == resp.kept_until and resp.run.run_id == rec.run_id
        for bad in (0.0, -1.0, float("nan"), float("inf")):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.KeepRun(rpb.RunKeepRequest(run_id=rec.run_id, ttl_seconds=bad), metadata=md, timeout=30)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
        bad_join = stub.JoinRun(rpb.RunJoinRequest(run_id=rec.run_id, from_start=True, keep_ttl_seconds=-3),
                                metadata=md, timeout=30)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ev in bad_join:
                pass
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    # A join over HTTP with keepTtl keeps the run too (granted before the stream starts).
    other = await _detached_run(cc)
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        before = time.time()
        async with http.stream("GET", f"{gw.url}/api/chat", headers=ALPHA,
                               params={"runId": other.run_id, "offset": "-1", "keepTtl": "50000"}) as r:
            assert r.status_code == 200
        kept = (await cc.get_run(other.run_id)).record.kept_until
        assert before + 9000 <= kept <= time.time() + 9000  # clamped to the maximum


async def test_an_ended_run_cannot_be_kept(make_gateway: Any, cc: CoordinatorClient) -> None:
    from baton.v1.runs_pb2 import RunStatus
    gw: Gateway = await make_gateway(api_keys=KEYS)
    rec = await _detached_run(cc)
    await cc.update_run(rec.run_id, RunRecord(status=RunStatus.RUN_STATUS_COMPLETED, finished_at=time.time()),
                        ["status", "finished_at"])
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        r = await http.post(f"{gw.url}/api/runs/{rec.run_id}/keep", json={"ttlSeconds": 600}, headers=ALPHA)
        assert r.status_code == 409 and r.json()["reason"] == "RUN_ENDED", r.text


async def test_a_ds_read_with_keep_ttl_keeps_the_run_and_a_bad_one_is_refused(
        make_gateway: Any, cc: CoordinatorClient) -> None:
    gw: Gateway = await make_gateway(api_keys=KEYS)
    rec = await _detached_run(cc)
    url = f"{gw.url}/ds/runs/{rec.run_id}"
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        for q in ("0", "-5", "nan", "inf", "soon", ""):
            r = await http.get(url, params={"offset": "-1", "keepTtl": q}, headers=ALPHA)
            assert r.status_code == 400 and "keepTtl" in r.text, (q, r.status_code, r.text)
        assert not (await cc.get_run(rec.run_id)).record.HasField("kept_until")  # nothing granted
        # Another tenant's run is unknown, and nothing is kept for it.
        r = await http.get(url, params={"offset": "-1", "keepTtl": "600"}, headers=BETA)
        assert r.status_code == 404, r.text
        assert not (await cc.get_run(rec.run_id)).record.HasField("kept_until")
        before = time.time()
        r = await http.get(url, params={"offset": "-1", "keepTtl": "7200"}, headers=ALPHA)
        assert r.status_code == 200, r.text
    kept = (await cc.get_run(rec.run_id)).record.kept_until
    assert before + 7200 <= kept <= time.time() + 7200
