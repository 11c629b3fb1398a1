"""A cancel that lands while the agent still streams is carried out even when neither of its
paths reaches the driver in time (docs/design.md §5.5, "A cancel against the run's own end").

The nemesis saw an acknowledged cancel end ``completed`` while a coordinator's link to an
etcd member was resetting (its ``WatchRun`` being re-made) and the fast path missing. Here the
driver's ``WatchRun`` never reports the flag and no fast path is sent: the flag is written
before the driver starts, so it lands long before the agent's terminal chunk is stored. The
driver reads the record after it stored that chunk and must end the run ``aborted``. etcd,
NATS, the coordinator and the local provider are real; only the flag's delivery is withheld.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import pytest

from sandbox_host.deps import HostDeps, HostSettings
from sandbox_host.driver import RunDriver
from sandbox_host.providers.local import LocalProvider
from tests.driver.conftest import Cluster
from tests.driver.test_finalize_inputs import _orphan

pytestmark = pytest.mark.timeout(120)


class _WatchWithoutCancel:
    """The coordinator client, whose ``WatchRun`` never shows the cancel flag (a watch
    being re-made for as long as the run lasts)."""

    def __init__(self, cc: Any) -> None:
        self._cc = cc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cc, name)

    async def watch_run(self, run_id: str) -> AsyncIterator[Any]:
        async for ev in self._cc.watch_run(run_id):
            if ev.record is not None and ev.record.cancel_requested:
                continue
            yield ev


async def test_a_cancel_that_never_reaches_the_streaming_driver_still_aborts_the_run(
        hostless: Cluster, tmp_path: Any) -> None:
    c = hostless
    run_id, _thread_id = await _orphan(c)
    session = await c.cc.open_session(ttl=5, owner="successor")
    provider = LocalProvider(str(tmp_path / "sandboxes"), str(tmp_path / "journals"))
    try:
        deps = HostDeps(host_id="successor", cc=_WatchWithoutCancel(c.cc), session=session, log=c.log,
                        transcripts=c.transcripts, providers={"local": provider},
                        settings=HostSettings(cancel_grace=1.0, provider="local"))
        epoch2, rec2 = await c.cc.claim_run(run_id, session, "successor", purpose="drive")
        assert not rec2.cancel_requested
        await c.cc.request_run_cancel(run_id, reason="user")  # landed: the agent has not even started
        driver = RunDriver(deps, rec2, epoch2, "attach", c.log.writer(run_id, epoch2))
        async with asyncio.timeout(90):
            await driver.run()
    finally:
        await session.close()
    assert driver.stats.outcome == "aborted"
    chunks = [ch for _, ch in await c.read_all(run_id, timeout=30)]
    assert chunks[-1]["type"] in ("RUN_FINISHED", "RUN_ERROR")
    assert sum(ch["type"] in ("RUN_FINISHED", "RUN_ERROR") for ch in chunks) == 1  # nothing after the end
    done = await c.wait_status(run_id, "aborted")
    assert done.driver_epoch == epoch2 and done.cancel_reason == "user"
