"""What a run leaves is freed when its last reference goes, not at the collector's next full
collection: every service runs the collector with a high threshold (baton/gc_tuning.py), so
an object in a reference cycle can wait minutes. Each test turns the collector off, does
what a service does, and checks with a weak reference that the object went at once."""
from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any, Iterator

import pytest

from baton import errors
from baton.log._consumer import OrderedConsumer
from sandbox_host.deps import HostDeps, HostSettings
from sandbox_host.driver import RunDriver
from sandbox_host.providers.local import LocalProvider
from tests.conftest import unique
from tests.driver.conftest import Cluster
from tests.driver.test_finalize_inputs import _orphan

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def no_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class Held:
    """Stands for what a caller's frame holds (a start's request and its 200 KB message)."""


async def test_a_coordinator_error_does_not_keep_its_callers_frames(hostless: Cluster, no_collector: None) -> None:
    """A start looks its new run up and expects UnknownRun: the error's traceback runs
    through the caller's frame, which holds the request."""
    async def caller(held: Held) -> None:
        try:
            await hostless.cc.get_run(unique("no-such-run-"))
        except errors.UnknownRun:
            pass

    held = Held()
    ref = weakref.ref(held)
    await caller(held)
    del held
    assert ref() is None, gc.get_referrers(ref())


async def test_a_closed_log_consumer_frees_its_subscription(hostless: Cluster, no_collector: None) -> None:
    run_id = unique("run")
    w = hostless.log.writer(run_id, 1)
    await w.fence()
    offsets = await w.append([{"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "x"}], origin="journal")
    dlog = hostless.log
    async with OrderedConsumer(dlog.nc, dlog.cfg.stream, dlog.cfg.subject(run_id), int(offsets[0])) as c:
        await c.next_raw()
        assert c._sub is not None
        sub = weakref.ref(c._sub)
    del c
    await asyncio.sleep(0)  # (one turn: nats-py's unsubscribe bookkeeping)
    assert sub() is None, [type(r) for r in gc.get_referrers(sub())]


async def test_a_driven_run_is_freed_when_its_driver_goes(hostless: Cluster, tmp_path: Any,
                                                         no_collector: None) -> None:
    c = hostless
    run_id, _thread_id = await _orphan(c)
    session = await c.cc.open_session(ttl=5, owner="successor")
    provider = LocalProvider(str(tmp_path / "sandboxes"), str(tmp_path / "journals"))
    try:
        deps = HostDeps(host_id="successor", cc=c.cc, session=session, log=c.log,
                        transcripts=c.transcripts, providers={"local": provider},
                        settings=HostSettings(cancel_grace=1.0, provider="local"))
        epoch, rec = await c.cc.claim_run(run_id, session, "successor", purpose="drive")
        driver = RunDriver(deps, rec, epoch, "attach", c.log.writer(run_id, epoch))
        async with asyncio.timeout(90):
            await driver.run()
        assert driver.stats.outcome == "completed"
        ref = weakref.ref(driver)
        del driver
        assert ref() is None, [type(r) for r in gc.get_referrers(ref())]
    finally:
        await session.close()
