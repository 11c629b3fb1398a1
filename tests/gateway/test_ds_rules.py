"""The Durable Streams protocol's pure rules: offsets, JSON mode, producers, the record fold."""
from __future__ import annotations

import pytest

from gateway.durable_streams import _model as M
from gateway.durable_streams import _protocol as P


def test_offsets_increase_and_compare_as_strings() -> None:
    a = P.next_offset(P.ZERO_OFFSET, 5)
    b = P.next_offset(a, 0)
    assert P.ZERO_OFFSET < a < b and a == "0000000000000000_0000000000000010"
    assert P.valid_read_offset("-1") and P.valid_read_offset("now") and P.valid_read_offset(a)
    for bad in ("", "1", "../x", "1_2_3", "a_b", "1_2\n"):
        assert not P.valid_read_offset(bad)


def test_json_mode_flattens_arrays_and_refuses_bad_input() -> None:
    frag = P.process_json_append(b'[{"a":1},2]') + P.process_json_append(b'"x"')
    assert P.format_json([frag]) == b'[{"a":1},2,"x"]'
    assert P.process_json_append(b"[]", initial=True) == b""
    for bad in (b"[]", b"{", b"\xff"):
        with pytest.raises(P.ProtocolError) as exc:
            P.process_json_append(bad)
        assert exc.value.status == 400


def test_producer_headers_all_or_none_and_strict_numbers() -> None:
    # Headers by lower-case name, as the app passes them (and as Starlette's Headers looks up).
    pid, epoch, seq = P.PRODUCER_ID.lower(), P.PRODUCER_EPOCH.lower(), P.PRODUCER_SEQ.lower()
    assert P.parse_producer({}) is None
    assert P.parse_producer({pid: "p", epoch: "1", seq: "0"}) == P.Producer("p", 1, 0)
    for h in ({pid: "p"}, {pid: "", epoch: "0", seq: "0"}, {pid: "p", epoch: "1e3", seq: "0"}):
        with pytest.raises(P.ProtocolError):
            P.parse_producer(h)


def test_producer_rule_fences_epochs_and_dedupes_sequences() -> None:
    st = M.StreamState(path="/s", content_type="text/plain")
    assert M.check_producer(st, P.Producer("p", 0, 1)).status == "sequence_gap"
    M.apply(st, 1, {M.OP: "append", M.OFFSET: P.next_offset(st.offset, 1), M.PID: "p", M.PEPOCH: 1, M.PSEQ: 0}, b"x")
    assert M.check_producer(st, P.Producer("p", 1, 0)).status == "duplicate"
    assert M.check_producer(st, P.Producer("p", 1, 1)).status == "accepted"
    assert M.check_producer(st, P.Producer("p", 1, 3)).expected == 1
    assert M.check_producer(st, P.Producer("p", 0, 0)).status == "stale_epoch"
    assert M.check_producer(st, P.Producer("p", 2, 1)).status == "invalid_epoch_seq"


def test_fold_of_records_is_the_stream() -> None:
    cfg = {"path": "/s", "contentType": "text/plain", "created": 1.0}
    st = M.apply(None, 1, {M.OP: "create", M.CONFIG: cfg}, b"")
    assert st is not None
    meta, data = M.decode_record(M.encode_record({M.OP: "append", M.OFFSET: P.next_offset(st.offset, 2)}, b"hi"))
    st = M.apply(st, 2, meta, data)
    assert st is not None and [m.data for m in st.messages] == [b"hi"] and st.js_last == 2
    st = M.apply(st, 3, {M.OP: "close"}, b"")
    assert st is not None and st.closed
    assert M.apply(st, 4, {M.OP: "delete"}, b"") is None
