"""The order of a thread's runs (docs/design.md §3.1, "Order of a thread's runs"). Pure.

A thread's runs are numbered 1, 2, 3... by the coordinator, from a counter kept in etcd
(``threads/<thread>/seq``) and taken in the transaction that creates the run's record, so
the number is decided by etcd's order of those transactions, not by any clock. Two
coordinators whose clocks disagree (or one whose clock jumped back) still number a thread's
runs in the order they were created; a ``started_at`` stamped by them may not be.

A record created before the counter existed has number 0. Such runs come before every
numbered run of their thread (they were all created before the first number was taken, once
every coordinator runs a version with the counter), and among themselves by ``started_at``,
then run id, as before.
"""
from __future__ import annotations

#: ``(thread_seq, started_at, run_id)``: compare with ``<`` to order two runs of one thread.
ThreadPosition = tuple[int, float, str]


def thread_position(thread_seq: int, started_at: float, run_id: str) -> ThreadPosition:
    """Where a run sits among its thread's runs, earliest first.

    Args:
        thread_seq: the run's number in its thread (``RunRecord.thread_seq``; 0: a run
            created before the counter).
        started_at: the run's ``started_at`` (Unix seconds); decides only between runs
            numbered 0.
        run_id: the run id; decides only between runs numbered 0 stamped at the same time.

    Returns:
        A key: the earlier of two runs of one thread has the smaller key. A numbered run's
        key never depends on its ``started_at`` beyond its number (numbers are unique in a
        thread), so no clock can reorder numbered runs.
    """
    if thread_seq > 0:
        # Unique per thread: the clock and the id never decide (kept out so a skewed stamp
        # cannot matter even in a comparison across a malformed pair).
        return (thread_seq, 0.0, "")
    return (0, started_at, run_id)


def next_seq(stored: bytes | None) -> int:
    """The number the next run of a thread gets, from the counter's stored value.

    Args:
        stored: the value of ``threads/<thread>/seq`` (ASCII decimal: the last number
            given), or ``None`` when the thread has no counter yet.

    Returns:
        ``stored + 1``; 1 for a thread without a counter (its older runs, numbered 0, come
        first anyway).

    Raises:
        ValueError: ``stored`` is not a non-negative decimal (a corrupt counter is refused,
            never restarted: restarting would give a later run a smaller number).
    """
    if stored is None:
        return 1
    text = stored.decode("ascii")
    if not text.isdigit():
        raise ValueError(f"thread counter holds {stored!r}, not a number")
    return int(text) + 1
