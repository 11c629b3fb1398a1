"""A fold of a Durable Stream that another gateway's write raced is known as such, with the
highest fence of the writes that raced it (gateway/durable_streams/_folds.py), so its view
is caught up from there, never cached stale."""
from __future__ import annotations

import pytest

from gateway.durable_streams._folds import UNFENCED, FoldRaces

pytestmark = pytest.mark.unit


def test_a_write_during_a_fold_gives_its_fence_and_only_for_that_stream() -> None:
    r = FoldRaces()
    a, b = r.begin("a"), r.begin("b")
    r.saw("a", 7)
    assert r.end("a", a) == 7
    assert r.end("b", b) is None


def test_the_highest_fence_of_the_writes_that_raced_a_fold_is_given() -> None:
    r = FoldRaces()
    t = r.begin("a")
    for prev in (4, 9, 0, 6):
        r.saw("a", prev)
    assert r.end("a", t) == 9


def test_a_write_with_no_fence_cannot_be_placed() -> None:
    r = FoldRaces()
    t = r.begin("a")
    r.saw("a", 12)
    r.saw("a", None)
    r.saw("a", 13)
    assert r.end("a", t) == UNFENCED


def test_a_write_heard_a_moment_before_a_fold_races_it_a_write_long_before_does_not() -> None:
    """A record heard may be stored after a fold that began once it was heard read where the
    stream ended: for half a second it counts."""
    now = [100.0]
    r = FoldRaces(clock=lambda: now[0], recent=0.5)
    r.saw("a", 3)
    now[0] += 0.4
    t = r.begin("a")
    assert r.end("a", t) == 3
    now[0] += 0.2  # 0.6 s after it
    t = r.begin("a")
    assert r.end("a", t) is None
    t = r.begin("b")  # another stream's
    assert r.end("b", t) is None


def test_this_gateways_own_write_races_only_the_folds_in_flight() -> None:
    r = FoldRaces()
    t = r.begin("a")
    r.wrote("a", 9)
    assert r.end("a", t) == 9
    t = r.begin("a")  # begun after it was stored: it has it
    assert r.end("a", t) is None


def test_a_lost_connection_races_every_fold_in_flight_unplaceably() -> None:
    r = FoldRaces()
    a, b = r.begin("a"), r.begin("b")
    r.lost_sight()
    assert r.end("a", a) == UNFENCED and r.end("b", b) == UNFENCED
    t = r.begin("a")
    assert r.end("a", t) is None


def test_streams_heard_are_remembered_up_to_a_bound() -> None:
    now = [0.0]
    r = FoldRaces(clock=lambda: now[0], keep=2)
    for key in ("a", "b", "c"):
        r.saw(key, 1)
    t = r.begin("a")  # forgotten first
    assert r.end("a", t) is None
    t = r.begin("c")
    assert r.end("c", t) == 1


def test_overlapping_folds_of_one_stream_each_see_the_writes_of_their_own_time() -> None:
    now = [0.0]
    r = FoldRaces(clock=lambda: now[0], recent=0.5)
    first = r.begin("a")
    r.saw("a", 5)
    now[0] += 1.0
    second = r.begin("a")  # began well after the write: it has it
    r.saw("a", 2)
    assert r.end("a", first) == 5
    assert r.end("a", second) == 2
    now[0] += 1.0
    t = r.begin("a")  # all folds ended, the writes long stored: nothing races it
    assert r.end("a", t) is None
