"""A store outage while a fresh run launches its agent (docs/design.md §5.5, §4.1).

The coordinator dies right when the driving host builds the sandbox and launches the agent:
the host's registration of the launched agent fails, its session lapses and another host
takes the run over. The first agent may already run in the first sandbox while the
registry does not say so; the successor must neither launch a second agent into that
sandbox (two writers of one journal) nor leave it running beside its own. A reader
connected the whole time receives exactly the chunk sequence of an uninterrupted run, the
record ends ``completed`` and the saved transcript equals the uninterrupted one.
"""
from __future__ import annotations

import asyncio
import os
from typing import Any, AsyncIterator, Callable

import pytest

from baton.ids import file_stem
from baton_tools.testing.servers import EtcdServer, NatsServer
from baton.transcript import TranscriptBuilder
from coordinator._etcd import Etcd
from coordinator._store import RunStore
from sandbox_host.providers.local import group_alive
from sandbox_host.translate import translate_bytes
from tests.conftest import assert_eventually
from tests.driver.conftest import CORPUS, Cluster, make_cluster, status_of

LONG = "claude-stream-json/partial-messages-parallel-bash-denied.jsonl"
DELAY = 0.05  # seconds per journal line (~14 s): the first agent still runs at the takeover
MESSAGES = [{"id": "u1", "role": "user", "content": "replay it"}]


@pytest.fixture(scope="module")
async def cluster(etcd: EtcdServer, nats: NatsServer, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    c = await make_cluster(etcd, nats, tmp_path_factory.mktemp("store-outage"), hosts=2)
    try:
        yield c
    finally:
        await c.close()


def _quietly(read: Callable[[], int]) -> int | None:
    try:
        return read()
    except (FileNotFoundError, ValueError):
        return None


@pytest.mark.timeout(180)
async def test_coordinator_down_while_the_agent_launches_gives_each_chunk_once(cluster: Cluster) -> None:
    a = cluster.hosts[0]
    started = await cluster.start_run(a, LONG, delay=DELAY, messages=MESSAGES)
    run_id, thread_id = started.record.run_id, started.record.thread_id
    sandboxes = str(cluster.tmp / "sandboxes")
    wrapper = os.path.join(sandboxes, file_stem(run_id), ".baton", "wrapper.sh")
    got: list[dict[str, Any]] = []

    async def read() -> None:  # a reader connected the whole time
        async with cluster.log.read(run_id, after="-1") as r:
            async for _off, chunk in r:
                got.append(chunk)

    reader = asyncio.create_task(read())
    try:
        # The wrapper is written inside `launch`, after the sandbox was registered and
        # right before the agent starts: the registration of the launched agent is next.
        await assert_eventually(lambda: os.path.exists(wrapper), timeout=10, interval=0.001)
        await cluster.coordinator.kill()

        def first_agent() -> int:  # the launcher records the agent's process group
            with open(os.path.join(os.path.dirname(wrapper), "pgid")) as f:
                return int(f.read())

        pgid = await assert_eventually(lambda: _quietly(first_agent), timeout=10, interval=0.005)
        store = RunStore(Etcd([cluster.etcd_endpoint]), cluster.prefix)
        try:
            async def claim_gone() -> bool:  # the first host's lease lapsed with the store down
                _rec, claim = await store.get_run(run_id, timeout=5)
                assert claim is None
                return True

            await assert_eventually(claim_gone, timeout=15)
        finally:
            await store.etcd.close()
        await cluster.coordinator.start()
        rec = await cluster.wait_status(run_id, "completed", timeout=90)
        async with asyncio.timeout(30):
            await reader
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)

    assert rec.driver_epoch >= 2 and status_of(rec) == "completed"
    # The outage hit before the launch was marked: the successor built its own sandbox, and
    # the first agent did not outlive its host's claim.
    assert rec.sandbox_key == f"{run_id}#{rec.driver_epoch}"
    assert not group_alive(pgid)
    expected = translate_bytes("claude-stream-json", (CORPUS / LONG).read_bytes(), run_id, thread_id)
    assert got[1]["name"] == "run.accepted"
    assert [got[0], *got[2:]] == expected  # each chunk once, in order
    builder = TranscriptBuilder(MESSAGES)
    builder.feed_all(expected)
    msgs, _ = await cluster.transcripts.load(thread_id)
    assert msgs == builder.messages()


@pytest.mark.timeout(180)
async def test_host_killed_right_after_launching_leaves_one_agent(cluster: Cluster) -> None:
    """The same window with the host SIGKILLed: it cannot clean up, so the successor must
    stop the agent the registry may not know about before it runs one of its own."""
    a = cluster.hosts[0]
    started = await cluster.start_run(a, LONG, delay=DELAY, messages=MESSAGES)
    run_id, thread_id = started.record.run_id, started.record.thread_id
    meta = os.path.join(str(cluster.tmp / "sandboxes"), file_stem(run_id), ".baton")
    got: list[dict[str, Any]] = []
    first_alive_at_successor: list[bool] = []

    async def read() -> None:
        async with cluster.log.read(run_id, after="-1") as r:
            async for _off, chunk in r:
                got.append(chunk)
                if len(got) == 3:  # the first chunk of the successor's agent
                    first_alive_at_successor.append(group_alive(pgid))

    def first_agent() -> int:
        with open(os.path.join(meta, "pgid")) as f:
            return int(f.read())

    pgid = await assert_eventually(lambda: _quietly(first_agent), timeout=10, interval=0.001)
    reader = asyncio.create_task(read())
    try:
        a.kill_now()
        restart = asyncio.create_task(a.start())
        rec = await cluster.wait_status(run_id, "completed", timeout=90)
        async with asyncio.timeout(30):
            await reader
        await restart
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)

    assert rec.driver_epoch >= 2
    expected = translate_bytes("claude-stream-json", (CORPUS / LONG).read_bytes(), run_id, thread_id)
    assert got[1]["name"] == "run.accepted"
    assert [got[0], *got[2:]] == expected
    builder = TranscriptBuilder(MESSAGES)
    builder.feed_all(expected)
    msgs, _ = await cluster.transcripts.load(thread_id)
    assert msgs == builder.messages()
    if rec.sandbox_key == f"{run_id}#{rec.driver_epoch}":
        # The successor did not know the first agent was launched: it stopped it before
        # running its own, so one agent ran at a time.
        assert first_alive_at_successor == [False]
    assert not group_alive(pgid)
