"""A coordinator whose clock is stepped back between two turns of a thread (libfaketime on
the real coordinator process): the second turn is still the later run, so its transcript
replaces the first's (docs/design.md §3.1, "Order of a thread's runs").

Ordered by the coordinator's clock, the second run was stamped an hour before the first,
the transcript fence took it for an earlier run of the thread, refused every save of its
transcript, and the thread kept showing the first turn. Two replicas whose clocks differ
do the same (tests/coordinator/test_thread_order.py, with injected clocks).
"""
from __future__ import annotations

import pathlib
from typing import Any

import pytest

from baton.client import GatewayClient
from baton.coordinator_client import CoordinatorClient
from baton.errors import StoreUnavailable
from baton.retry import Deadline, retry
from tests.faults.conftest import ClusterFactory
from tests.faults.harness import CORPUS, SHORT, eventually

pytestmark = pytest.mark.servers

LIBFAKETIME = pathlib.Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


async def _turn(gw: GatewayClient, run_id: str, thread_id: str, messages: list[dict[str, Any]]) -> None:
    """Start the turn and read its log to the end. A start refused 503 (the gateway's link to
    the restarted coordinator not yet back) is sent again, as a client does: a POST with the
    same run id starts the run at most once."""
    agent = {"kind": "replay", "journal": SHORT, "speed": 50.0}

    async def to_end() -> None:
        async for _ in gw.start(run_id, thread_id, messages, agent=agent):
            pass  # to the log's end

    await retry(to_end, deadline=Deadline.after(60), retry_on=(StoreUnavailable,), first_pause=0.1, max_pause=1.0)


@pytest.mark.timeout(240)
async def test_a_turn_stamped_by_a_clock_stepped_back_still_replaces_the_transcript(
        fault_cluster: ClusterFactory, tmp_path: pathlib.Path) -> None:
    if not LIBFAKETIME.exists():
        pytest.fail(f"{LIBFAKETIME} missing: apt-get install libfaketime (.ci/run installs it)")
    assert (CORPUS / SHORT).exists()
    c = await fault_cluster(hosts=1)
    assert c.coordinator is not None
    offset = tmp_path / "coordinator-clock"
    offset.write_text("+0\n")
    # The coordinator's wall clock, read from a file at every call (so the test can step it);
    # its monotonic clock is left alone (timeouts, the event loop).
    c.coordinator.env.update({  # type: ignore[union-attr]
        "LD_PRELOAD": str(LIBFAKETIME), "FAKETIME_TIMESTAMP_FILE": str(offset),
        "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
    await c.coordinator.restart()  # type: ignore[union-attr]
    async with CoordinatorClient(c.coordinator.address, token=c.env["BATON_INTERNAL_TOKEN"]) as cc:
        async def host_registered() -> None:
            assert [h for h in await cc.list_hosts() if not h.draining]
        await eventually(host_registered, 60)  # its session may have lapsed during the restart
    thread = f"skew-{c.tag}"
    first_user = {"id": f"{thread}-u1", "role": "user", "content": "the first turn"}
    second_user = {"id": f"{thread}-u2", "role": "user", "content": "the second turn"}
    async with GatewayClient(c.url, timeout=60) as gw:
        await _turn(gw, f"{thread}-r1", thread, [first_user])
        assert (await gw.get_run(f"{thread}-r1"))["status"] == "completed"
        first = await gw.messages(thread)
        assert first[0]["id"] == first_user["id"]
        async with c.fault("the coordinator's clock stepped back an hour between two turns"):
            offset.write_text("-3600\n")
        await _turn(gw, f"{thread}-r2", thread, [*first, second_user])
        r1, r2 = await gw.get_run(f"{thread}-r1"), await gw.get_run(f"{thread}-r2")
        assert r2["status"] == "completed"
        assert r2["startedAt"] < r1["startedAt"]  # the clock did lie
        saved = await gw.messages(thread)
    assert [m["id"] for m in saved[: len(first) + 1]] == [*(m["id"] for m in first), second_user["id"]]
    assert len(saved) > len(first) + 1  # and the second turn's answer
