"""A successor's replay lets its event loop run: the host's keep-alive is never starved.

A replay over a stored prefix appends nothing, so nothing in it awaits: the journal's first
read (up to 1 MiB) used to be translated and aligned in one step of the event loop. With a
dead host's runs taken over at once, those steps held the successor's loop for seconds on a
loaded machine, its own session expired, and every run moved again.

Here the first host (a real process) drives a long journal and is SIGKILLed; its agent keeps
writing. The successor is a driver in this process, with a ticker task that counts the
loop's turns; its translator notes the count at every journal line. No clock is involved:
between two turns of the loop the successor translates at most ``replay_yield_lines`` lines,
and the reader still gets the run's exact chunk sequence, the successor's session intact.
"""
from __future__ import annotations

import asyncio
import itertools
from typing import Any, AsyncIterator

import pytest

from baton.errors import RunClaimNotAcquired
from baton.v1 import runs_pb2
from sandbox_host.deps import HostDeps, HostSettings
from sandbox_host.driver import RunDriver
from sandbox_host.providers import provider_for
from sandbox_host.translate import translate_bytes
from tests.conftest import assert_eventually
from tests.driver.conftest import CORPUS, Cluster, make_cluster

LONG = "claude-stream-json/partial-messages-parallel-bash-denied.jsonl"  # 273 lines
KILL_AT = 120  # chunks a reader has seen when the first host dies


class _Counted:
    """A translator that notes, for every line fed while ``turns`` counts (``turns[1]``),
    how many turns the loop had made (``turns[0]``)."""

    def __init__(self, inner: Any, turns: list[int], fed: list[int]) -> None:
        self._inner, self._turns, self._fed = inner, turns, fed

    def feed(self, line: bytes) -> Any:
        if self._turns[1]:
            self._fed.append(self._turns[0])
        return self._inner.feed(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _CountingDeps(HostDeps):
    def __init__(self, turns: list[int], fed: list[int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._turns, self._fed = turns, fed

    def translator(self, record: runs_pb2.RunRecord, run_id: str) -> Any:
        return _Counted(super().translator(record, run_id), self._turns, self._fed)


@pytest.fixture
async def one_host(etcd: Any, nats: Any, tmp_path: Any) -> AsyncIterator[Cluster]:
    c = await make_cluster(etcd, nats, tmp_path, hosts=1)
    try:
        yield c
    finally:
        await c.close()


@pytest.mark.timeout(120)
async def test_a_successor_replaying_a_long_prefix_yields_to_the_loop_every_few_lines(one_host: Cluster) -> None:
    c = one_host
    first = c.hosts[0]
    started = await c.start_run(first, LONG, delay=0.02)
    run_id, thread_id = started.record.run_id, started.record.thread_id
    got: list[dict[str, Any]] = []
    reading = asyncio.Event()

    async def read() -> None:
        async with c.log.read(run_id) as r:
            async for _, chunk in r:
                got.append(chunk)
                if len(got) >= KILL_AT:
                    reading.set()

    reader = asyncio.create_task(read())
    async with asyncio.timeout(60):
        await reading.wait()
    first.kill_now()  # its agent keeps writing the journal in its sandbox
    c.hosts.remove(first)  # no host left: the leader's failover hands the run to nobody

    settings = HostSettings(cancel_grace=1.0)
    session = await c.cc.open_session(ttl=2, owner="successor")
    turns, fed = [0, 1], []
    deps = _CountingDeps(turns, fed, host_id="successor", cc=c.cc, session=session, log=c.log,
                         transcripts=c.transcripts, providers={"local": provider_for("local")}, settings=settings)

    async def claim() -> tuple[int, runs_pb2.RunRecord]:
        try:
            return await c.cc.claim_run(run_id, session, "successor", purpose="drive")
        except RunClaimNotAcquired as held:
            raise AssertionError(f"not yet: {held}") from None

    epoch, rec = await assert_eventually(claim, timeout=30)  # once the dead host's lease is gone
    driver = RunDriver(deps, rec, epoch, "attach", c.log.writer(run_id, epoch))

    async def tick() -> None:
        # Counts turns of the loop until the replay reached what clients do not have yet.
        while driver.stats.first_append_at is None and not driver.done.is_set():
            await asyncio.sleep(0)
            turns[0] += 1
        turns[1] = 0

    ticker = asyncio.create_task(tick())
    try:
        async with asyncio.timeout(90):
            await driver.run()
        async with asyncio.timeout(30):
            await reader
    finally:
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
        lost = session.lost.is_set()
        await session.close()
        await first.stop()

    assert driver.stats.first_append_at is not None, "the successor appended nothing"
    # Journal lines translated within one turn of the loop, up to the first append (the
    # stored prefix and a little more).
    runs = [len(list(g)) for _, g in itertools.groupby(fed)]
    assert len(fed) > 2 * settings.replay_yield_lines, f"too short a stored prefix to tell: {runs}"
    assert max(runs) <= settings.replay_yield_lines, runs
    assert not lost
    want = translate_bytes("claude-stream-json", (CORPUS / LONG).read_bytes(), run_id, thread_id)
    assert got[1]["name"] == "run.accepted"
    assert [got[0], *got[2:]] == want
    done = await c.wait_status(run_id, "completed")
    assert done.driver_epoch == epoch == 2
