"""The SSE parser against the WHATWG event-stream rules, fed in every possible split."""
from __future__ import annotations

import asyncio

import pytest

from baton.sse import Comment, Event, SSEParser, aiter_sse

pytestmark = pytest.mark.unit


def parse(stream: bytes) -> list[Event | Comment]:
    """Whole-stream parse, checked to give the same result for every split in two and
    for byte-at-a-time feeding (chunk boundaries must never matter)."""
    whole = SSEParser().feed(stream)
    for cut in range(len(stream) + 1):
        p = SSEParser()
        assert p.feed(stream[:cut]) + p.feed(stream[cut:]) == whole, cut
    p = SSEParser()
    assert [it for i in range(len(stream)) for it in p.feed(stream[i:i + 1])] == whole
    return whole


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_line_ends(eol: bytes) -> None:
    stream = eol.join([b"id: 7", b"data: {\"a\":1}", b"", b"data: two", b"", b""])
    assert parse(stream) == [Event('{"a":1}', id="7", last_event_id="7"),
                             Event("two", id=None, last_event_id="7")]


def test_mixed_line_ends_and_a_cr_lf_split_across_chunks() -> None:
    p = SSEParser()
    assert p.feed(b"data: a\r") == []
    # The LF completing the CRLF must not count as a blank line (no early dispatch).
    assert p.feed(b"\ndata: b\n\r\n") == [Event("a\nb")]


def test_multi_line_data_is_joined_with_newlines() -> None:
    assert parse(b"data: first\ndata:second\ndata\ndata:  indented\n\n") == [
        Event("first\nsecond\n\n indented")]


def test_comments_are_returned_and_do_not_end_an_event() -> None:
    assert parse(b": keep-alive\ndata: x\n:no space\n\n: end\n\n") == [
        Comment("keep-alive"), Comment("no space"), Event("x"), Comment("end")]


def test_id_without_data_dispatches_nothing_but_persists() -> None:
    p = SSEParser()
    assert p.feed(b"id: 41\n\nevent: ping\n\n") == []
    assert p.last_event_id == "41"
    assert p.feed(b"data: next\n\n") == [Event("next", id=None, last_event_id="41")]
    # An empty id resets it; an id holding NUL is ignored.
    assert p.feed(b"id\ndata: a\n\nid: x\x00y\ndata: b\n\n") == [
        Event("a", id="", last_event_id=""), Event("b", id=None, last_event_id="")]


def test_field_without_colon_and_unknown_fields() -> None:
    # "data" alone is a data line with an empty value; unknown fields are ignored.
    assert parse(b"data\n\nfoo: bar\nbaz\ndata: x\n\n") == [Event(""), Event("x")]


def test_event_type_and_retry() -> None:
    p = SSEParser()
    assert p.feed(b"event: update\nretry: 1500\ndata: x\n\ndata: y\n\n") == [Event("x", event="update"),
                                                                          Event("y")]
    assert p.retry == 1500
    p.feed(b"retry: soon\nretry: 12a\nretry: \xd9\xa3\n\n")  # not ASCII digits: ignored
    assert p.retry == 1500


def test_leading_bom_is_dropped_once() -> None:
    assert parse(b"\xef\xbb\xbfdata: a\n\n") == [Event("a")]
    # Only at the very start: a later one is part of the field name (an unknown field).
    assert parse(b"data: a\n\n\xef\xbb\xbfdata: b\n\n") == [Event("a")]


def test_utf8_split_inside_a_character() -> None:
    assert parse("data: héllo → ✓\n\n".encode()) == [Event("héllo → ✓")]


def test_an_event_open_at_the_end_of_the_stream_is_discarded() -> None:
    assert parse(b"data: done\n\ndata: cut") == [Event("done")]
    assert parse(b"data: done\n\ndata: cut\n") == [Event("done")]


def test_aiter_sse_over_chunks() -> None:
    async def chunks():
        for c in (b"id: 1\nda", b"ta: x\n", b"\n: end\n\n"):
            yield c

    async def collect() -> list[Event | Comment]:
        return [it async for it in aiter_sse(chunks())]

    assert asyncio.run(collect()) == [Event("x", id="1", last_event_id="1"), Comment("end")]
