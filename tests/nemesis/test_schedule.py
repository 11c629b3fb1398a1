"""The nemesis's schedule: drawn the same from a seed, within its limits, shrunk to a
minimal failing one, stored and read back."""
from __future__ import annotations

import pytest

from tests.nemesis.schedule import KINDS, MAX_CONCURRENT, Fault, Schedule, Topology, draw, dumps, loads, shrink

pytestmark = pytest.mark.unit


def test_the_same_seed_draws_the_same_schedule() -> None:
    assert draw(7, 10) == draw(7, 10)
    assert draw(7, 10).faults != draw(8, 10).faults


def test_a_long_schedule_draws_every_kind_on_every_sort_of_target() -> None:
    s = draw(1, 60)
    assert {f.kind for f in s.faults} == set(KINDS)
    targets = {f.target.split("-")[0] for f in s.faults if "->" not in f.target}
    assert targets >= {"etcd", "nats", "coordinator", "host", "gateway"}
    assert {f.direction for f in s.of_kind("partition")} == {"both", "up", "down"}


def test_limits_hold() -> None:
    topo = Topology()
    for seed in range(20):
        s = draw(seed, 10, topo)
        assert [f.at for f in s.faults] == sorted(f.at for f in s.faults)
        assert all(f.at < 10 * 60 - 20 for f in s.faults)
        for f in s.faults:
            span = max(f.duration, 1.0)
            during = [g for g in s.faults if g is not f and g.at < f.at + span and f.at < g.at + max(g.duration, 1.0)]
            assert len(during) < MAX_CONCURRENT + 1
            mine = set(f.target.split("->"))
            for g in during:
                assert not mine & set(g.target.split("->")), (f, g)
                for engine in ("etcd-", "nats-"):  # a quorum is always up
                    assert not (any(p.startswith(engine) for p in mine)
                                and any(p.startswith(engine) for p in g.target.split("->"))), (f, g)
        assert all(f.target in topo.processes + topo.links for f in s.faults)
        assert all(f.target.startswith(("host-", "coordinator-")) for f in s.of_kind("skew"))


def test_only_the_kinds_the_machine_can_inject() -> None:
    s = draw(3, 30, Topology(kinds=("kill", "pause")))
    assert {f.kind for f in s.faults} == {"kill", "pause"}


def test_shrink_finds_the_one_fault_that_fails() -> None:
    s = draw(5, 20)
    culprit = s.faults[len(s.faults) // 2]
    calls = []

    def fails(t: Schedule) -> bool:
        calls.append(len(t.faults))
        return culprit in t.faults
    out = shrink(s, fails, budget=100)
    assert out.faults == [culprit]
    assert len(calls) <= 100


def test_shrink_keeps_a_pair_that_fails_together_and_respects_its_budget() -> None:
    s = draw(6, 20)
    a, b = s.faults[1], s.faults[-2]
    out = shrink(s, lambda t: a in t.faults and b in t.faults, budget=200)
    assert out.faults == [a, b]
    calls = []
    shrink(s, lambda t: calls.append(1) is None and True, budget=3)
    assert len(calls) == 3


def test_a_schedule_survives_json_and_bad_ones_are_refused() -> None:
    s = draw(9, 5)
    assert loads(dumps(s)) == s
    with pytest.raises(ValueError, match="unknown fault kinds"):
        loads('{"seed": 1, "minutes": 1, "faults": [{"at": 1, "kind": "meteor", "target": "gateway"}]}')
    with pytest.raises(ValueError, match="not a nemesis schedule"):
        loads('{"seed": 1}')
    assert "latency 250ms" in Fault(1, "latency", "host-0->nats-1", 3, param=0.25).describe()
