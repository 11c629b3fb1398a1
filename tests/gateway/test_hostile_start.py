"""Hostile run input that reaches a real host: a clear 4xx, never a 500, and no run.

Real coordinator, sandbox host and gateway processes, etcd and NATS.
"""
from __future__ import annotations

from typing import Any

import httpx
import pytest

from baton import errors as e
from baton.coordinator_client import CoordinatorClient
from tests.conftest import unique
from tests.gateway.conftest import Gateway


@pytest.mark.parametrize("content,journal", [
    ("a\\ud800b", "claude-stream-json/hello.jsonl"),
    ("hi", "claude-stream-json/hel\\udc80lo.jsonl"),
], ids=["message", "journal"])
async def test_a_lone_surrogate_in_the_input_is_a_400_and_no_run(gateway: Gateway, host: Any,
                                                                  http: httpx.AsyncClient, cc: CoordinatorClient,
                                                                  content: str, journal: str) -> None:
    run_id, thread_id = unique("run-"), unique("thr-")
    # Valid JSON ("\\ud800" is an escape JSON allows) that no UTF-8 encoder can write.
    body = ('{"threadId":"%s","runId":"%s","messages":[{"id":"u1","role":"user","content":"%s"}],'
            '"agent":{"kind":"replay","journal":"%s"}}' % (thread_id, run_id, content, journal))
    r = await http.post(f"{gateway.url}/api/chat", content=body.encode(),
                        headers={"Content-Type": "application/json"})
    assert r.status_code == 400, (r.status_code, r.text)
    assert r.json()["reason"] == "INVALID_ARGUMENT"
    try:
        await cc.get_run(run_id)
    except e.UnknownRun:
        pass
    else:
        raise AssertionError("a run was created for refused input")
