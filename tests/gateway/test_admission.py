"""Admission control at the gateway (docs/operating.md "Overload"): a burst of starts gets a
slot, a turn in the queue, or ``429 TOO_MANY_STARTS`` with ``Retry-After``; a refused start
created nothing, and every accepted run runs to its end."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from baton import errors as e
from baton.coordinator_client import CoordinatorClient
from gateway._admission import AdmissionLimits
from tests.conftest import unique
from baton.sse import Comment, aiter_sse
from tests.gateway.test_e2e import replay_body

pytestmark = pytest.mark.timeout(180)


async def test_a_burst_of_starts_is_admitted_queued_or_told_when_to_retry(
        host: Any, make_gateway: Any, http: httpx.AsyncClient, cc: CoordinatorClient) -> None:
    gw = await make_gateway(admission=AdmissionLimits(per_tenant=0, per_host=1, queue=1, wait=30))
    runs = [unique("adm-run") for _ in range(20)]

    async def start(run_id: str) -> tuple[int, Any, Any]:
        """(status, headers, the error body or the run's chunks to its end)."""
        body = replay_body(unique("adm-th"), run_id)
        async with http.stream("POST", f"{gw.url}/api/chat", json=body) as resp:
            if resp.status_code != 200:
                return resp.status_code, resp.headers, json.loads(await resp.aread())
            chunks = [json.loads(item.data) async for item in aiter_sse(resp.aiter_bytes())
                      if not isinstance(item, Comment)]
            return 200, resp.headers, chunks

    results = await asyncio.gather(*(start(r) for r in runs))
    accepted = [(r, got) for r, (status, _, got) in zip(runs, results) if status == 200]
    refused = [(r, status, headers, got) for r, (status, headers, got) in zip(runs, results) if status != 200]
    assert accepted and refused, [s for s, _, _ in results]
    for run_id, status, headers, got in refused:
        assert status == 429 and got["reason"] == "TOO_MANY_STARTS", (status, got)
        assert int(headers["retry-after"]) >= 1 and got["retry_after"] == headers["retry-after"]
        with pytest.raises(e.UnknownRun):  # nothing was created
            await cc.get_run(run_id)
    for run_id, chunks in accepted:
        assert chunks[-1]["type"] == "RUN_FINISHED", (run_id, chunks[-1:])
    assert gw.app.state.gateway.admission.in_flight == 0
