"""A fold of a Durable Stream that another gateway's write raced is known as such
(gateway/durable_streams/_folds.py), so its view is not cached stale."""
from __future__ import annotations

import pytest

from gateway.durable_streams._folds import FoldRaces

pytestmark = pytest.mark.unit


def test_a_write_during_a_fold_marks_it_raced_and_only_that_stream() -> None:
    r = FoldRaces()
    a, b = r.begin("a"), r.begin("b")
    r.saw("a")
    assert r.end("a", a) is True
    assert r.end("b", b) is False


def test_a_write_before_or_after_a_fold_does_not_race_it() -> None:
    r = FoldRaces()
    r.saw("a")  # no fold in flight: nothing kept
    t = r.begin("a")
    assert r.end("a", t) is False
    r.saw("a")
    t = r.begin("a")
    assert r.end("a", t) is False


def test_overlapping_folds_of_one_stream_each_see_the_writes_of_their_own_time() -> None:
    r = FoldRaces()
    first = r.begin("a")
    r.saw("a")
    second = r.begin("a")  # started after the write: it has it
    assert r.end("a", first) is True
    assert r.end("a", second) is False
    t = r.begin("a")  # all folds ended: the count starts again
    assert r.end("a", t) is False
