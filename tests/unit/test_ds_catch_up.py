"""A cached Durable Stream view catches up from its last sequence with the records another
gateway stored after it (gateway/durable_streams/_catchup.py): in order, each once, waiting
for a record heard of before it was stored, and giving the view up when it never comes; a
record heard is matched with JetStream's ack of it, heard too, in either order."""
from __future__ import annotations

import asyncio
import json
import zlib

import pytest

from gateway.durable_streams import _model as M
from gateway.durable_streams._catchup import Heard, ack_seq, ack_subject, catch_up

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


def test_a_record_and_its_ack_are_matched_in_either_order_by_writer_prev_and_crc() -> None:
    r1, r2 = _append("0_1"), _append("0_2")
    heard = Heard()
    heard.record("/s", "gwA", 3, r1)
    assert heard.stored_after("/s", 3) is None  # no ack yet
    heard.ack("/s", "gwA", 3, zlib.crc32(r1), 7)
    assert heard.stored_after("/s", 3) == (7, r1)
    assert heard.stored_after("/s", 3) is None  # taken once
    heard.ack("/s", "gwA", 7, zlib.crc32(r2), 9)  # the ack first (two subscriptions, two tasks)
    assert heard.stored_after("/s", 7) is None
    heard.record("/s", "gwA", 7, r2)
    assert heard.stored_after("/s", 7) == (9, r2)


def test_only_the_record_the_ack_names_is_folded() -> None:
    refused, stored = _append("0_1"), _append("0_9")
    heard = Heard()
    heard.record("/s", "gwB", 3, refused)  # another writer's record fenced on 3 too: refused
    heard.record("/s", "gwA", 3, stored)
    heard.ack("/s", "gwA", 3, zlib.crc32(stored), 5)
    assert heard.stored_after("/s", 3) == (5, stored)
    heard.record("/s", "gwA", 5, refused)
    heard.ack("/s", "gwA", 5, zlib.crc32(stored), 6)  # other bytes than heard: not folded
    assert heard.stored_after("/s", 5) is None
    heard.record("/s", "gwA", 5, stored)  # its retry fenced on the same sequence: the later counts
    assert heard.stored_after("/s", 5) == (6, stored)
    heard.record("/s", "gwA", 6, stored)
    heard.ack("/t", "gwA", 6, zlib.crc32(stored), 8)  # another stream's ack
    assert heard.stored_after("/s", 6) is None


def test_an_ack_is_due_only_from_a_writer_whose_acks_are_heard() -> None:
    heard = Heard()
    heard.record("/s", "old", 3, _append("0_1"))  # a gateway whose acks go to its own inbox
    assert not heard.due("/s", 3)
    heard.ack("/t", "new", 1, 0, 2)
    heard.record("/s", "new", 4, _append("0_1"))
    assert heard.due("/s", 4) and not heard.due("/s", 3) and not heard.due("/s", 9)


def test_what_is_kept_is_bounded_oldest_first() -> None:
    heard = Heard(max_entries=4, max_bytes=1 << 20, max_record=64)
    big = M.encode_record({M.OP: "append", M.OFFSET: "0_1"}, b"x" * 100)
    heard.record("/s", "gw", 1, big)  # over max_record: not kept
    heard.ack("/s", "gw", 1, zlib.crc32(big), 2)
    assert heard.stored_after("/s", 1) is None
    for prev in range(2, 8):  # a record and its ack: two entries each
        heard.record("/s", "gw", prev, _append("0_1"))
        heard.ack("/s", "gw", prev, zlib.crc32(_append("0_1")), prev + 100)
    assert [heard.stored_after("/s", p) is not None for p in range(2, 8)] == [False] * 4 + [True] * 2
    by_bytes = Heard(max_entries=100, max_bytes=100, max_record=100)
    by_bytes.ack("/t", "gw", 9, 0, 10)  # gw's acks are heard
    for prev in range(4):
        by_bytes.record("/s", "gw", prev, b"y" * 40)
    # 100 bytes hold two of the four: the two oldest went.
    assert [by_bytes.due("/s", p) for p in range(4)] == [False, False, True, True]


def test_an_ack_is_read_from_its_reply_subject_and_body() -> None:
    assert ack_subject("_DSACK.BATON_DS.gwA.k3y.12.345.0") == ("gwA", "k3y", 12, 345)
    for subject in ("_DSACK.BATON_DS.gwA.k3y.12.345", "_DSACK.BATON_DS.gwA.k3y.x.345.0",
                    "_DSACK.BATON_DS.gwA.k3y.12.-5.0", "_DSACK.BATON_DS.gwA.k3y.1\u00b2.345.0"):
        assert ack_subject(subject) is None, subject
    assert ack_seq(json.dumps({"stream": "BATON_DS", "seq": 13}).encode(), "BATON_DS") == 13
    refused = json.dumps({"error": {"code": 400, "err_code": 10071, "description": "wrong last sequence: 14"}})
    for body in (refused.encode(), b"not json", b'{"stream": "BATON_DS", "seq": "13"}',
                 b'{"stream": "BATON_DS", "seq": true}', b"[13]", b"", b'{"seq": 13}',
                 b'{"stream": "OTHER", "seq": 13}', b"[" * 200_000):
        assert ack_seq(body, "BATON_DS") is None, body[:40]


async def test_a_catch_up_waits_for_an_ack_due_then_asks_jetstream_when_none_comes() -> None:
    st = _view_behind()
    stored = Stored({4: _append("0_1")})
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await catch_up(st, stored.fetch, lambda: True, ack_due=lambda prev: True, ack_wait=0.05)
    assert loop.time() - began >= 0.05 and stored.gets == 1  # waited, then one get
    assert [m.offset for m in st.messages] == ["0_1"]

    # The ack folds the record while the catch-up waits: no get at all.
    st = _view_behind()
    stored = Stored({4: _append("0_1")})

    def ack_heard() -> None:
        M.apply(st, 4, {M.OP: "append", M.OFFSET: "0_1"}, b"0_1")
        st.notify()

    loop.call_later(0.01, ack_heard)
    assert await catch_up(st, stored.fetch, lambda: True, ack_due=lambda prev: prev == 3, ack_wait=30)
    assert stored.gets == 0 and st.js_last == 4 and loop.time() - began < 10
