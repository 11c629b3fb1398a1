"""Admission control of run starts (gateway/_admission.py), pure: who gets a slot, who
waits, who is refused with a Retry-After, and that no slot leaks."""
from __future__ import annotations

import asyncio

import pytest

from gateway._admission import Admission, AdmissionLimits, TooManyStarts

pytestmark = pytest.mark.unit


async def _hold(adm: Admission, tenant: str, hosts: int, release: asyncio.Event, entered: list[str],
                name: str) -> None:
    async with adm.slot(tenant, hosts):
        entered.append(name)
        await release.wait()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_tenant_at_its_limit_waits_and_lets_others_pass() -> None:
    adm = Admission(AdmissionLimits(per_tenant=1, per_host=4, queue=8, wait=5))
    release = {n: asyncio.Event() for n in ("a1", "a2", "b1")}
    entered: list[str] = []
    tasks = [asyncio.create_task(_hold(adm, t, 1, release[n], entered, n)) for t, n in
             (("a", "a1"), ("a", "a2"), ("b", "b1"))]
    await _settle()
    assert entered == ["a1", "b1"] and adm.waiting == 1 and adm.in_flight == 2
    release["a1"].set()
    await _settle()
    assert entered == ["a1", "b1", "a2"] and adm.waiting == 0
    release["a2"].set()
    release["b1"].set()
    await asyncio.gather(*tasks)
    assert adm.in_flight == 0


async def test_the_total_is_per_host_times_hosts_first_come_first_served() -> None:
    adm = Admission(AdmissionLimits(per_tenant=0, per_host=1, queue=8, wait=5))
    release = asyncio.Event()
    entered: list[str] = []
    tasks = [asyncio.create_task(_hold(adm, "t", 2, release, entered, f"s{i}")) for i in range(4)]
    await _settle()
    assert entered == ["s0", "s1"] and adm.waiting == 2  # 2 hosts × 1
    release.set()
    await asyncio.gather(*tasks)
    assert entered == ["s0", "s1", "s2", "s3"] and adm.in_flight == 0


async def test_past_the_queue_or_the_wait_it_is_refused_with_a_retry_after() -> None:
    adm = Admission(AdmissionLimits(per_tenant=0, per_host=1, queue=1, wait=0.2))
    release = asyncio.Event()
    entered: list[str] = []
    holder = asyncio.create_task(_hold(adm, "t", 1, release, entered, "first"))
    waiter = asyncio.create_task(_hold(adm, "t", 1, release, entered, "second"))
    await _settle()
    with pytest.raises(TooManyStarts) as full:
        async with adm.slot("t", 1):
            pass
    assert full.value.retry_after >= 1 and "waiting" in str(full.value)
    with pytest.raises(TooManyStarts) as late:
        await waiter  # its 0.2 s wait ran out
    assert "no start slot" in str(late.value)
    assert adm.waiting == 0
    release.set()
    await holder
    assert entered == ["first"] and adm.in_flight == 0


async def test_a_cancelled_waiter_leaves_no_slot_behind() -> None:
    adm = Admission(AdmissionLimits(per_tenant=0, per_host=1, queue=4, wait=5))
    release = asyncio.Event()
    entered: list[str] = []
    holder = asyncio.create_task(_hold(adm, "t", 1, release, entered, "first"))
    waiter = asyncio.create_task(_hold(adm, "t", 1, release, entered, "second"))
    await _settle()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    release.set()
    await holder
    assert adm.in_flight == 0 and adm.waiting == 0
    async with adm.slot("t", 1):
        assert adm.in_flight == 1


async def test_no_limits_admit_everything_at_once() -> None:
    adm = Admission(AdmissionLimits(per_tenant=0, per_host=0, queue=0, wait=0))
    release = asyncio.Event()
    entered: list[str] = []
    tasks = [asyncio.create_task(_hold(adm, "t", 1, release, entered, f"s{i}")) for i in range(50)]
    await _settle()
    assert len(entered) == 50
    release.set()
    await asyncio.gather(*tasks)


async def test_simultaneous_starts_spread_over_hosts_of_equal_load() -> None:
    """Placement counts the starts in flight: four at once on two idle hosts go two and two
    (the hosts' published load lags them)."""
    import collections

    from baton.v1 import coordinator_pb2
    from gateway._hosts import HostPool, try_hosts

    pool = HostPool(coordinator=None, token="")
    hosts = [coordinator_pb2.HostInfo(host_id=h, address=f"{h}:1", load=0, capacity=64) for h in ("a", "b")]
    gate = asyncio.Event()
    chosen: list[str] = []

    async def attempt(h: coordinator_pb2.HostInfo) -> str:
        chosen.append(h.host_id)
        await gate.wait()
        return str(h.host_id)

    tasks = [asyncio.create_task(try_hosts(pool, hosts, attempt)) for _ in range(4)]
    await _settle()
    assert sorted(collections.Counter(chosen).values()) == [2, 2]
    gate.set()
    await asyncio.gather(*tasks)
    assert not pool.in_flight  # nothing left counted once the starts were answered
