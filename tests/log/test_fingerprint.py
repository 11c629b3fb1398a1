"""Fingerprints (docs/design.md §5.4): what a chunk says, not when or how it was serialised."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from baton.fingerprint import canonical_json, fingerprint, spec_view


def test_key_order_timestamp_raw_event_and_metadata_do_not_matter() -> None:
    a = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "hi", "timestamp": 1}
    b = {"delta": "hi", "timestamp": 99, "messageId": "m1", "type": "TEXT_MESSAGE_CONTENT",
         "rawEvent": {"x": 1}, "metadata": {"host": "a"}}
    assert fingerprint(a) == fingerprint(b)
    assert len(fingerprint(a)) == 64 and int(fingerprint(a), 16) >= 0


def test_delta_and_message_id_matter() -> None:
    base = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "hi"}
    assert fingerprint(base) != fingerprint({**base, "delta": "hi!"})
    assert fingerprint(base) != fingerprint({**base, "messageId": "m2"})
    assert fingerprint(base) != fingerprint({**base, "type": "REASONING_MESSAGE_CONTENT"})


def test_arguments_two_levels_deep_matter_but_not_their_key_order() -> None:
    def tool(args: dict[str, object]) -> dict[str, object]:
        return {"type": "CUSTOM", "name": "tool", "value": {"input": {"args": args}}}

    assert fingerprint(tool({"path": "a.py", "n": 1})) != fingerprint(tool({"path": "b.py", "n": 1}))
    assert fingerprint(tool({"path": "a.py", "n": 1})) == fingerprint(tool({"n": 1, "path": "a.py"}))
    snap = {"type": "STATE_SNAPSHOT", "snapshot": {"a": {"b": [1, 2]}}}
    assert fingerprint(snap) != fingerprint({"type": "STATE_SNAPSHOT", "snapshot": {"a": {"b": [2, 1]}}})


def test_present_null_differs_from_absent() -> None:
    started = {"type": "RUN_STARTED", "threadId": "t", "runId": "r"}
    assert fingerprint(started) != fingerprint({**started, "parentRunId": None})
    start = {"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"}
    assert fingerprint(start) != fingerprint({**start, "name": None})


def test_only_spec_fields_of_the_type_count() -> None:
    # RUN_STARTED ignores protocolVersion (not in its list); unknown types keep everything
    started = {"type": "RUN_STARTED", "threadId": "t", "runId": "r"}
    assert fingerprint(started) == fingerprint({**started, "protocolVersion": "1"})
    assert spec_view({"type": "RUN_ERROR", "message": "x", "code": "c", "extra": 1}) == {
        "type": "RUN_ERROR", "message": "x", "code": "c"
    }
    other = {"type": "SOMETHING_NEW", "a": 1, "timestamp": 5}
    assert spec_view(other) == {"type": "SOMETHING_NEW", "a": 1}
    assert fingerprint(other) != fingerprint({**other, "a": 2})
    # a subagent's text is not its parent's
    text = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "x"}
    assert fingerprint(text) != fingerprint({**text, "subagentRunId": "s1"})


def test_canonical_json_is_utf8_without_escapes() -> None:
    assert canonical_json({"b": "é", "a": [1, {"d": None, "c": "☃"}]}) == '{"a":[1,{"c":"☃","d":null}],"b":"é"}'.encode()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3),
    max_leaves=10,
)


@given(value=json_values, ts1=st.integers(), ts2=st.integers())
def test_fingerprint_is_a_function_of_the_spec_view(value: object, ts1: int, ts2: int) -> None:
    a = {"type": "CUSTOM", "name": "n", "value": value, "timestamp": ts1}
    b = {"timestamp": ts2, "value": value, "name": "n", "type": "CUSTOM"}
    assert fingerprint(a) == fingerprint(b)


_TRICKY = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40) | st.sampled_from(
    ["", "é ü 中文 🙂", 'quote " back \\ slash', "\n\t\r\x00\x1f\x7f", "\u2028\u2029", "</script>"])


@given(delta=_TRICKY, mid=_TRICKY, extra=st.sampled_from([None, "sub-1", 3, {"a": 1}]))
def test_the_string_fields_fast_path_gives_the_definitions_bytes(delta: str, mid: str, extra: object) -> None:
    from baton.fingerprint import SPEC_FIELDS, slow_fingerprint

    for kind in SPEC_FIELDS:
        chunk: dict[str, object] = {"type": kind, "messageId": mid, "delta": delta, "name": mid, "timestamp": 5,
                                    "toolCallId": delta, "role": "assistant"}
        if extra is not None:
            chunk["subagentRunId"] = extra
        assert fingerprint(chunk) == slow_fingerprint(chunk), (kind, chunk)
    assert fingerprint({"type": "NOT_A_TYPE", "delta": delta}) == slow_fingerprint({"type": "NOT_A_TYPE", "delta": delta})
