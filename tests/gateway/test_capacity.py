"""A full sandbox host (``BATON_HOST_CAPACITY``) as a browser sees it: ``POST /api/chat``
answers 503 ``HOST_AT_CAPACITY`` and starts nothing; once a run ends, a start works again."""
from __future__ import annotations

import pathlib
from typing import Any, AsyncIterator

import httpx
import pytest

from baton import errors as e
from baton.coordinator_client import CoordinatorClient
from baton.log import LogConfig
from tests.conftest import assert_eventually, unique
from tests.gateway.conftest import Gateway, host_settings, read_stream
from tests.gateway.test_e2e import SLOW, replay_body


@pytest.fixture(scope="module")
async def full_host(coordinator: Any, nats: Any, log_cfg: LogConfig, replay_dir: pathlib.Path,
                    tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Any]:
    """The only sandbox host of this module, with room for one run."""
    from baton_tools.testing.cluster import start_host

    tmp = tmp_path_factory.mktemp("full-host")
    h = await start_host(coordinator.address, nats.url, log_dir=tmp,
                         **host_settings(log_cfg, replay_dir, tmp), BATON_HOST_CAPACITY="1")
    yield h
    await h.stop()


async def test_start_on_a_full_host_is_503_host_at_capacity(
        full_host: Any, gateway: Gateway, http: httpx.AsyncClient, cc: CoordinatorClient) -> None:
    hosts = await cc.list_hosts()
    if [h.host_id for h in hosts] != [full_host.host_id]:
        pytest.skip("other hosts are registered in this coordinator")
    busy = unique("run")
    got = await read_stream(http, "POST", f"{gateway.url}/api/chat", stop_after=2,
                            json=replay_body(unique("th"), busy, SLOW, speed=1, delay=0.3))
    assert len(got.events) == 2                               # the run goes on, detached

    later, thread = unique("run"), unique("th")
    r = await http.post(f"{gateway.url}/api/chat", json=replay_body(thread, later))
    assert r.status_code == 503
    body = r.json()
    assert body["reason"] == "HOST_AT_CAPACITY" and body["host_id"] == full_host.host_id and body["capacity"] == "1"
    assert r.headers["Retry-After"] == "5"  # every host is full: when to try again
    with pytest.raises(e.UnknownRun):                         # nothing was started
        await cc.get_run(later)

    r = await http.post(f"{gateway.url}/api/chat/cancel", params={"wait": "true"}, json={"runId": busy})
    assert r.status_code == 200

    async def started() -> bool:
        resp = await http.post(f"{gateway.url}/api/chat", json=replay_body(thread, later),
                               headers={"X-Run-Id": later})
        return resp.status_code == 200

    await assert_eventually(started, timeout=10)
