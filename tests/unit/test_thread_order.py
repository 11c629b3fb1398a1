"""The order of a thread's runs, pure (baton/thread_order.py, coordinator/rules.py): runs
are numbered by the thread's counter in the creating write; numbers order them, never a
clock; runs from before numbers come first, by their clocks."""
from __future__ import annotations

import pytest

from baton.ids import page_position, page_token, run_position, thread_run_position
from baton.errors import InvalidArgument
from baton.thread_order import next_seq, thread_position
from coordinator import _etcd as E
from coordinator import _thread_seq
from coordinator._keys import Keys

pytestmark = pytest.mark.unit

K = Keys("/p/")


def test_numbered_runs_are_ordered_by_number_whatever_their_clocks() -> None:
    later_but_slow = thread_position(2, 100.0, "a")
    earlier_but_fast = thread_position(1, 5000.0, "z")
    assert earlier_but_fast < later_but_slow


def test_runs_from_before_numbers_come_first_by_clock_then_id() -> None:
    keys = [thread_position(1, 0.5, "x"), thread_position(0, 20.0, "a"), thread_position(0, 10.0, "b"),
            thread_position(0, 10.0, "a")]
    assert sorted(keys) == [thread_position(0, 10.0, "a"), thread_position(0, 10.0, "b"),
                            thread_position(0, 20.0, "a"), thread_position(1, 0.5, "x")]


@pytest.mark.parametrize("stored,expected", [(None, 1), (b"0", 1), (b"1", 2), (b"41", 42)])
def test_the_next_number(stored: bytes | None, expected: int) -> None:
    assert next_seq(stored) == expected


@pytest.mark.parametrize("stored", [b"", b"-1", b"x", b"1.5"])
def test_a_corrupt_counter_is_refused_never_restarted(stored: bytes) -> None:
    with pytest.raises(ValueError):
        next_seq(stored)


def test_taking_a_number_compares_the_counter_as_read() -> None:
    n, cmps, ops = _thread_seq.take_thread_seq(K, "t", None)
    assert n == 1
    assert cmps == [E.cmp_mod(K.thread_seq("t"), 0)]  # absent, as read
    assert ops == [E.put(K.thread_seq("t"), b"1")]
    n, cmps, ops = _thread_seq.take_thread_seq(K, "t", E.KV(key=K.thread_seq("t"), value=b"7", mod_revision=33))
    assert n == 8
    assert cmps == [E.cmp_mod(K.thread_seq("t"), 33)]
    assert ops == [E.put(K.thread_seq("t"), b"8")]


def test_queue_order_interrupts_first_then_by_number() -> None:
    order = sorted([_thread_seq.queue_order("enqueue", 3, "a"), _thread_seq.queue_order("interrupt", 9, "b"),
                    _thread_seq.queue_order("enqueue", 2, "c"), _thread_seq.queue_order("enqueue", 10, "d")])
    assert order == [_thread_seq.queue_order("interrupt", 9, "b"), _thread_seq.queue_order("enqueue", 2, "c"),
                     _thread_seq.queue_order("enqueue", 3, "a"), _thread_seq.queue_order("enqueue", 10, "d")]


def test_queue_entries_from_before_numbers_go_first_in_their_kind() -> None:
    legacy_enqueue = f"1{1_700_000_000_000_000:020d}-old"
    legacy_interrupt = f"0{1_700_000_000_000_000:020d}-old"
    assert legacy_interrupt < _thread_seq.queue_order("interrupt", 1, "n") < legacy_enqueue < _thread_seq.queue_order("enqueue", 1, "n")


def test_thread_page_tokens_follow_the_number_and_are_not_tenant_tokens() -> None:
    a, b = thread_run_position(1, 900.0, "r-a"), thread_run_position(2, 100.0, "r-b")
    assert a < b
    assert page_position(page_token(b), thread=True) == b
    with pytest.raises(InvalidArgument):
        page_position(page_token(run_position(100.0, "r-b")), thread=True)
    with pytest.raises(InvalidArgument):
        page_position(page_token(b))


def test_the_number_is_not_writable() -> None:
    from coordinator._records import check_paths

    with pytest.raises(InvalidArgument):
        check_paths(["thread_seq"])
