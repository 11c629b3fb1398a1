"""Per-tenant agent credentials (BATON_TENANT_SECRETS_DIR, sandbox_host/tenant_secrets.py):
a tenant's run gets its own key, another tenant's run the host's shared one, and neither
value reaches a log, a record, a transcript or a file the host writes.

A real host (subprocess) runs the real ``claude-code`` launch code against the stand-in CLI;
the run's prompt makes the agent print the SHA-256 of the ``ANTHROPIC_API_KEY`` it got, so
the test sees which key each run had without the key itself ever being printed.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import uuid
from typing import Any, AsyncIterator

import httpx
import pytest

from baton.log import LogConfig
from baton_tools.standins import STANDINS_DIR
from tests.conftest import unique
from tests.gateway.conftest import Gateway, host_settings, read_stream
from tests.sessions_support import terminal, texts

pytestmark = pytest.mark.timeout(120)

ACME_KEY = f"sk-ant-acme-{uuid.uuid4().hex}"
SHARED_KEY = f"sk-ant-shared-{uuid.uuid4().hex}"
API_KEYS = {"key-of-acme-7f3a": "acme", "key-of-globex-91c2": "globex"}
PROMPT = 'run printf %s "$ANTHROPIC_API_KEY" | sha256sum'


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@pytest.fixture(scope="module")
async def host_dir(coordinator: Any, nats: Any, log_cfg: LogConfig, replay_dir: pathlib.Path,
                   tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[pathlib.Path]:
    """One host: the shared key in its environment, acme's own in the tenants' directory."""
    from baton_tools.testing.cluster import start_host

    tmp = tmp_path_factory.mktemp("tenant-secrets")
    secrets = tmp_path_factory.mktemp("tenant-secrets-dir")
    (secrets / "acme").mkdir()
    (secrets / "acme" / "ANTHROPIC_API_KEY").write_text(ACME_KEY + "\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{STANDINS_DIR}:{os.environ['PATH']}")
        mp.setenv("ANTHROPIC_API_KEY", SHARED_KEY)
        h = await start_host(coordinator.address, nats.url, log_dir=tmp / "logs",
                             **host_settings(log_cfg, replay_dir, tmp), BATON_TENANT_SECRETS_DIR=str(secrets))
    try:
        yield tmp
    finally:
        await h.stop()


async def _run(http: httpx.AsyncClient, gw: Gateway, key: str) -> tuple[str, list[dict[str, Any]]]:
    run_id, thread = unique("run-"), unique("thr-")
    body = {"threadId": thread, "agent": {"kind": "claude-code"},
            "messages": [{"id": unique("u"), "role": "user", "content": PROMPT}]}
    got = await read_stream(http, "POST", f"{gw.url}/api/chat?runId={run_id}", json=body,
                            headers={"Authorization": f"Bearer {key}"})
    assert got.status == 200, got
    chunks = [c for _, c in got.events]
    assert terminal(chunks)["type"] == "RUN_FINISHED", terminal(chunks)
    return run_id, chunks


async def test_a_tenants_run_uses_its_own_key_and_another_tenants_the_shared_one(
        host_dir: pathlib.Path, make_gateway: Any, http: httpx.AsyncClient) -> None:
    gw = await make_gateway(keepalive=0.5, api_keys=API_KEYS)
    acme_run, acme = await _run(http, gw, "key-of-acme-7f3a")
    globex_run, globex = await _run(http, gw, "key-of-globex-91c2")

    assert sha(ACME_KEY) in texts(acme) and sha(SHARED_KEY) not in texts(acme)
    assert sha(SHARED_KEY) in texts(globex) and sha(ACME_KEY) not in texts(globex)

    # Nowhere a user or an operator reads: the records, the saved transcripts, the host's
    # log, journals and sandboxes (every file it wrote).
    for run_id, key in ((acme_run, "key-of-acme-7f3a"), (globex_run, "key-of-globex-91c2")):
        auth = {"Authorization": f"Bearer {key}"}
        record = await http.get(f"{gw.url}/api/runs/{run_id}", headers=auth)
        assert record.status_code == 200
        thread = record.json()["threadId"]
        saved = await http.get(f"{gw.url}/api/threads/{thread}/messages", headers=auth)
        for text in (record.text, saved.text, str(acme), str(globex)):
            assert ACME_KEY not in text and SHARED_KEY not in text
    written = [p for p in host_dir.rglob("*") if p.is_file()]
    assert any(p.suffix == ".log" for p in written)
    for p in written:
        data = p.read_bytes()
        assert ACME_KEY.encode() not in data and SHARED_KEY.encode() not in data, p
