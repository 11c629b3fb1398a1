"""Hosts whose wall clocks disagree: the runs of a thread keep the order in
which they were created, so the later run's transcript is saved. Real coordinator, host
processes (one with its clock ten minutes ahead), etcd and NATS.
"""
from __future__ import annotations

import pathlib
import time
from typing import AsyncIterator

import pytest

from baton_tools.testing.servers import EtcdServer, NatsServer
from tests.conftest import unique
from tests.driver.conftest import Cluster, make_cluster

JOURNAL = "claude-stream-json/partial-messages-bash-exit-128.jsonl"
SKEW = 600.0

SKEWED_CLOCK = f"""
import time as _time
_real = _time.time
_time.time = lambda: _real() + {SKEW}
"""


@pytest.fixture
async def skewed(etcd: EtcdServer, nats: NatsServer, tmp_path: pathlib.Path,
                 monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cluster]:
    """hosts[0]'s clock runs SKEW seconds ahead (a sitecustomize in its PYTHONPATH); hosts[1]'s is right."""
    c = await make_cluster(etcd, nats, tmp_path, hosts=0)
    try:
        shim = tmp_path / "skew"
        shim.mkdir()
        (shim / "sitecustomize.py").write_text(SKEWED_CLOCK)
        with monkeypatch.context() as m:
            m.setenv("PYTHONPATH", str(shim))
            await c.add_host()
        await c.add_host()
        yield c
    finally:
        await c.close()


@pytest.mark.timeout(120)
async def test_a_later_run_on_a_host_with_a_slower_clock_still_saves_its_transcript(skewed: Cluster) -> None:
    fast, right = skewed.hosts
    thread = unique("thr-")
    first_in = [{"id": "u1", "role": "user", "content": "first"}]
    a = await skewed.start_run(fast, JOURNAL, thread_id=thread, messages=first_in)
    await skewed.wait_status(a.record.run_id, "completed")
    second_in = [*first_in, {"id": "u2", "role": "user", "content": "second"}]
    b = await skewed.start_run(right, JOURNAL, thread_id=thread, messages=second_in)
    await skewed.wait_status(b.record.run_id, "completed")
    ra, rb = await skewed.record(a.record.run_id), await skewed.record(b.record.run_id)
    # Stamped by the coordinator's clock, not by the host's (ten minutes ahead).
    assert ra.started_at <= time.time()
    # The run created later is later, whatever the clock of the host that started it.
    assert (ra.started_at, ra.run_id) < (rb.started_at, rb.run_id)
    msgs, _ = await skewed.transcripts.load(thread)
    # The thread's transcript is the later run's: its input (both user turns) comes first.
    assert [m["id"] for m in msgs[:2]] == ["u1", "u2"]
