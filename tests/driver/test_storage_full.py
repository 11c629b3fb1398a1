"""A full JetStream store mid-run, with real hosts, coordinator, etcd and a
nats-server whose store is a 64 MB tmpfs that the test fills and frees.

The host keeps its claim and retries instead of handing the run around (the epoch stays
1), the agent runs on meanwhile, and after nats-server is restarted with free space the
run ends with exactly the chunks an undisturbed run of the same journal gives, once each,
in order, and one close record.
"""
from __future__ import annotations

import pathlib
from typing import AsyncIterator

import pytest

from baton.errors import LogStorageFull
from baton_tools.testing.servers import EtcdServer, NatsServer
from tests.conftest import assert_eventually, assert_throughout
from tests.driver.conftest import CORPUS, Cluster, make_cluster, normalize, status_of
from tests.log.test_storage_full import fill, small_nats, tmpfs_dir  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(300)

JOURNAL = "claude-stream-json/partial-messages-bash-exit-128.jsonl"
# Long enough to cover the seconds nats-server still acknowledges after the disk filled
# and a good part of the fault itself (122 lines).
DELAY = 0.15
# Two of an append's publish budgets (5 tries x 2 s, baton/log/_writer.py): a host that gave
# the run up when its appends kept failing (it once did after ~22 s of 4 x 5 s) shows in it.
HOLD = 20.0


@pytest.fixture
async def disk_cluster(etcd: EtcdServer, small_nats: NatsServer, tmp_path: pathlib.Path) -> AsyncIterator[Cluster]:
    # Sessions of 10 s: a lease lost to a loaded machine would hand the run over and hide
    # what this test watches (that a full store alone never does).
    c = await make_cluster(etcd, small_nats, tmp_path / "cluster", hosts=2, BATON_SESSION_TTL="10")
    try:
        yield c
    finally:
        await c.close()


async def test_full_store_mid_run_keeps_the_claim_and_loses_nothing(
    disk_cluster: Cluster, small_nats: NatsServer, tmpfs_dir: pathlib.Path
) -> None:
    c = disk_cluster
    started = await c.start_run(c.hosts[0], JOURNAL, speed=1.0, delay=DELAY)
    run_id, thread_id = started.record.run_id, started.record.thread_id
    filler = fill(tmpfs_dir)

    async def not_storing() -> bool:
        try:
            await c.log.probe_storage("test", timeout=2.0)
        except LogStorageFull:
            return True
        return False

    await assert_eventually(not_storing, timeout=90, interval=0.5)

    # The agent finishes its journal while nothing can be stored.
    journal = c.tmp / "journals" / f"{run_id}.ndjson"
    source_size = (CORPUS / JOURNAL).stat().st_size
    await assert_eventually(lambda: journal.exists() and journal.stat().st_size >= source_size, timeout=60)

    # No failover while full: the same host holds epoch 1 the whole time.
    async def held_by_the_first_host() -> None:
        view = await c.cc.get_run(run_id)
        assert view.claim is not None and view.claim.host_id == c.hosts[0].host_id
        assert view.claim.epoch == 1 and view.record.driver_epoch == 1
        assert status_of(view.record) == "running"
    await assert_throughout(held_by_the_first_host, HOLD, interval=0.5)

    # Storage back: free the disk, restart nats-server (2.15 needs it), the run goes on.
    filler.unlink()
    small_nats.restart()
    rec = await c.wait_status(run_id, "completed", timeout=120)
    assert rec.driver_epoch == 1
    items = await c.read_all(run_id)

    # The same journal, undisturbed.
    ref = await c.start_run(c.hosts[1], JOURNAL, speed=0)
    ref_items = await c.read_all(ref.record.run_id)
    await c.wait_status(ref.record.run_id, "completed")

    assert normalize([ch for _, ch in items], run_id, thread_id) == \
        normalize([ch for _, ch in ref_items], ref.record.run_id, ref.record.thread_id)
    offsets = [int(o) for o, _ in items]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    headers = await c.log.stored_headers(run_id)
    assert [h.kind for h in headers].count("close") == 1
    assert [h.kind for h in headers].count("fence") == 1
    assert {h.epoch for h in headers} == {1}
