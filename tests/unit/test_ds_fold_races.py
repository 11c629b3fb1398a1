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


def test_a_write_before_or_after_a_fold_does_not_race_it() -> None:
    r = FoldRaces()
    r.saw("a", 3)  # no fold in flight: nothing kept
    t = r.begin("a")
    assert r.end("a", t) is None
    r.saw("a", 3)
    t = r.begin("a")
    assert r.end("a", t) is None


def test_overlapping_folds_of_one_stream_each_see_the_writes_of_their_own_time() -> None:
    r = FoldRaces()
    first = r.begin("a")
    r.saw("a", 5)
    second = r.begin("a")  # started after the write: it has it
    r.saw("a", 2)
    assert r.end("a", first) == 5
    assert r.end("a", second) == 2
    t = r.begin("a")  # all folds ended: nothing is kept
    assert r.end("a", t) is None
