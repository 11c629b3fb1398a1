"""A cached Durable Stream view catches up from its last sequence with the records another
gateway stored after it (gateway/durable_streams/_catchup.py): in order, each once, waiting
for a record heard of before it was stored, and giving the view up when it never comes."""
from __future__ import annotations


import pytest

from gateway.durable_streams import _model as M
from gateway.durable_streams._catchup import catch_up

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def _view() -> M.StreamState:
    st = M.apply(None, 3, {M.OP: "create", M.CONFIG: {"path": "/s", "contentType": "text/plain"}}, b"")
    assert st is not None
    return st


def _append(offset: str) -> bytes:
    return M.encode_record({M.OP: "append", M.OFFSET: offset}, offset.encode())


class Stored:
    """Records of one subject by sequence; ``hidden`` ones are not stored yet."""

    def __init__(self, records: dict[int, bytes]) -> None:
        self.records = records
        self.hidden: set[int] = set()
        self.gets = 0

    async def fetch(self, start: int) -> tuple[int, bytes] | None:
        self.gets += 1
        seqs = sorted(s for s in self.records if s >= start and s not in self.hidden)
        return (seqs[0], self.records[seqs[0]]) if seqs else None


async def test_a_view_behind_folds_the_records_after_it_in_order_each_once() -> None:
    st = _view()
    stored = Stored({9: _append("0_1"), 12: _append("0_2")})
    st.heard_prev = 9  # a write fenced on 9 was heard: 9 and what follows it are folded
    woken = st.changed
    assert await catch_up(st, stored.fetch, lambda: True)
    assert [m.offset for m in st.messages] == ["0_1", "0_2"] and st.js_last == 12
    assert woken.is_set() and stored.gets == 2  # one get per record behind, none for "no more"
    assert await catch_up(st, stored.fetch, lambda: True) and stored.gets == 2  # not behind: no get


async def test_a_record_heard_before_it_was_stored_is_waited_for() -> None:
    st = _view()
    stored = Stored({5: _append("0_1")})
    stored.hidden.add(5)
    st.heard_prev = 3

    async def fetch(start: int) -> tuple[int, bytes] | None:
        got = await stored.fetch(start)
        stored.hidden.clear()  # stored after the first get missed it
        return got

    assert await catch_up(st, fetch, lambda: True)
    assert stored.gets == 2
    assert [m.offset for m in st.messages] == ["0_1"] and st.js_last == 5


async def test_a_record_that_never_comes_or_a_delete_gives_the_view_up() -> None:
    st = _view()
    st.heard_prev = 3
    assert not await catch_up(st, Stored({}).fetch, lambda: True, wait=0.01)
    deleted = Stored({4: M.encode_record({M.OP: "delete"})})
    assert not await catch_up(_view_behind(), deleted.fetch, lambda: True)
    assert not await catch_up(_view_behind(), Stored({4: _append("0_1")}).fetch, lambda: False)


async def test_records_folded_meanwhile_by_this_gateways_own_write_are_skipped() -> None:
    st = _view_behind()
    stored = Stored({4: _append("0_1"), 5: _append("0_2")})

    async def fetch(start: int) -> tuple[int, bytes] | None:
        got = await stored.fetch(start)
        if got is not None and got[0] == 4 and st.js_last < 4:  # the own write's ack came first
            M.apply(st, 4, {M.OP: "append", M.OFFSET: "0_1"}, b"0_1")
        return got

    st.heard_prev = 4
    assert await catch_up(st, fetch, lambda: True)
    assert [m.offset for m in st.messages] == ["0_1", "0_2"] and st.js_last == 5


def _view_behind() -> M.StreamState:
    st = _view()
    st.heard_prev = 3
    return st
