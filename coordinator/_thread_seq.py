"""A thread's counter in etcd, pure (docs/design.md §3.1, "Order of a thread's runs").

The create transaction of a run, and the enqueue of a queued run, take the thread's next
number here: the compare and put that make the number unique and increasing inside that
write. The order itself (numbers before clocks, the fallback for records without one) is
:mod:`baton.thread_order`.
"""
from __future__ import annotations

from baton.ids import encode_token
from baton.thread_order import next_seq

from coordinator import _etcd as E
from coordinator._keys import Keys


def take_thread_seq(keys: Keys, thread_id: str, counter: E.KV | None) -> tuple[int, list[E.Cmp], list[E.Op]]:
    """The next number of a thread's runs, and what takes it inside the creating write.

    The write compares the counter's mod revision as read (its absence when there was
    none) and puts the new number, so two creates on one thread never get one number and
    a later create never gets a smaller one, whatever the clocks of the coordinators that
    make them (:mod:`baton.thread_order`, docs/design.md §3.1).

    Args:
        keys: the key layout.
        thread_id: the thread.
        counter: ``threads/<thread>/seq`` as read (``None``: absent).

    Returns:
        ``(number, compares, ops)``.

    Raises:
        ValueError: the counter does not hold a number.
    """
    n = next_seq(counter.value if counter is not None else None)
    key = keys.thread_seq(thread_id)
    return n, [E.cmp_mod(key, counter.mod_revision if counter is not None else 0)], [E.put(key, str(n).encode())]


def queue_order(strategy: str, seq: int, run_id: str) -> str:
    """The key suffix that places a queued run in its thread's queue (dispatch order).

    Interrupting runs (``strategy`` ``interrupt``) go before enqueued ones; each kind in
    the order of the numbers ``seq`` the thread's counter gave them (:func:`take_thread_seq`,
    in the enqueuing write), never by a clock. An entry written before numbers
    (``<0|1><enqueued_at µs:020d>-<run>``) sorts before every numbered entry of its kind
    (``s`` follows the digits), as it was queued before them.
    """
    return f"{0 if strategy == 'interrupt' else 1}s{seq:020d}-{encode_token(run_id)}"
