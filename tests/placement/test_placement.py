"""The one host-picking rule (baton.placement), table-tested without servers."""
from __future__ import annotations

from collections import Counter

import pytest

from baton.placement import Candidate as C
from baton.placement import assign, order


@pytest.mark.parametrize("hosts, n, want", [
    # The issue-19 E case: eight orphans, two empty hosts with room: four each, alternating.
    ([C("a"), C("b")], 8, ["a", "b"] * 4),
    # Existing load counts: b has 3 already, so a takes the first three, then they alternate.
    ([C("a"), C("b", load=3)], 5, ["a", "a", "a", "a", "b"]),
    # Capacity is respected (per unit of it): a takes 2 more (it has 1 of 3), b 4, then none.
    ([C("a", load=1, capacity=3), C("b", capacity=4)], 8, ["b", "b", "a", "b", "a", "b"]),
    # Load per unit of capacity: a (cap 8, load 4) ties with b (cap 2, load 1); id breaks it.
    ([C("a", load=4, capacity=8), C("b", load=1, capacity=2)], 3, ["a", "b", "a"]),
    # Draining hosts take nothing; full hosts take nothing.
    ([C("a", draining=True), C("b", load=2, capacity=2), C("c")], 2, ["c", "c"]),
    # Nobody with room: nothing placed.
    ([C("a", load=1, capacity=1)], 3, []),
    ([], 2, []),
    ([C("a")], 0, []),
    # Ties break by host id, deterministically.
    ([C("c"), C("b"), C("a")], 3, ["a", "b", "c"]),
])
def test_assign(hosts: list[C], n: int, want: list[str]) -> None:
    assert assign(hosts, n) == want


def test_assign_counts_pending_as_load_and_against_capacity() -> None:
    hosts = [C("a", capacity=3), C("b", capacity=3)]
    # Two hand-overs to a are in flight: the next three go to b, then a, then none.
    assert assign(hosts, 5, pending={"a": 2}) == ["b", "b", "a", "b"]


@pytest.mark.parametrize("n_runs, loads", [(8, (0, 0, 0)), (8, (0, 2, 5)), (7, (1, 1)), (30, (3, 0, 9, 1))])
def test_assign_spreads_within_one_of_level(n_runs: int, loads: tuple[int, ...]) -> None:
    hosts = [C(f"h{i}", load=load) for i, load in enumerate(loads)]
    got = Counter(assign(hosts, n_runs))
    final = [h.load + got[h.host_id] for h in hosts]
    assert sum(got.values()) == n_runs
    # Water-filling: every host that received a run ends within one of the least loaded.
    assert all(final[i] <= min(final) + 1 for i, h in enumerate(hosts) if got[h.host_id])


@pytest.mark.parametrize("hosts, handed, want", [
    # Room first; full hosts last (a published load may be stale), draining never.
    ([C("a", load=2, capacity=2), C("b", load=5), C("c", draining=True)], {}, ["b", "a"]),
    # Load per capacity, then runs handed so far, then id.
    ([C("a", load=1, capacity=4), C("b", load=1, capacity=4)], {"a": 2}, ["b", "a"]),
    ([C("b"), C("a")], {}, ["a", "b"]),
    ([C("a", load=3, capacity=4), C("b", load=1, capacity=2)], {}, ["b", "a"]),
])
def test_order(hosts: list[C], handed: dict[str, int], want: list[str]) -> None:
    assert [h.host_id for h in order(hosts, handed=handed)] == want


def test_order_counts_pending_as_load() -> None:
    hosts = [C("a", capacity=2), C("b", load=1, capacity=2)]
    assert [h.host_id for h in order(hosts, pending={"a": 2})] == ["b", "a"]
