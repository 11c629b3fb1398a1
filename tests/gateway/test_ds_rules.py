"""The Durable Streams protocol's pure rules: offsets, JSON mode, producers, the record fold."""
from __future__ import annotations

import pytest

from gateway.durable_streams import _model as M
from gateway.durable_streams import _protocol as P
from gateway.durable_streams._app import stream_path


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
    for bad in (b"[]", b"{", b"\xff", b'"\\ud800"', b'[1, {"\\udfff": 2}]'):
        with pytest.raises(P.ProtocolError) as exc:
            P.process_json_append(bad)
        assert exc.value.status == 400


def test_json_depth_is_judged_without_parsing() -> None:
    limit = P.MAX_JSON_DEPTH
    assert not P.json_too_deep(b"[" * limit + b"]" * limit)
    assert P.json_too_deep(b"[" * (limit + 1) + b"]" * (limit + 1))
    assert P.json_too_deep(b"[" * 1_000_000)  # no recursion, whatever the depth
    # Without a run of brackets: [[1],[[1],[[1],...]]] nests one level per element.
    assert P.json_too_deep(b"[" + b"[[1]," * limit + b"1" + b"]" * (limit + 1))
    # Brackets in strings (escaped quotes and backslashes included) are text.
    assert not P.json_too_deep(b'{"a":"' + b"[{" * 5000 + b'\\""}')
    assert not P.json_too_deep(b'["\\\\", "\\"[[[", ' + b'"[",' * 100 + b"1]")
    assert P.json_too_deep(b'["\\\\",' + b"[" * 70 + b"]" * 70 + b"]")
    with pytest.raises(P.ProtocolError) as exc:
        P.process_json_append(b"[" * 100_000 + b"]" * 100_000)
    assert (exc.value.status, exc.value.reason) == (400, f"Invalid JSON: nested deeper than {limit} levels")


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


def test_the_stream_path_is_the_path_as_sent_under_the_mount() -> None:
    def scope(raw: bytes | None, path: str) -> dict[str, object]:
        s: dict[str, object] = {"path": path, "root_path": "/ds"}
        if raw is not None:
            s["raw_path"] = raw
        return s

    # Escapes kept: "a%2Fb" is not "a/b" (as the reference server's URL pathname).
    assert stream_path(scope(b"/ds/streams/a%2Fb", "/ds/streams/a/b")) == "/streams/a%2Fb"
    assert stream_path(scope(b"/ds/runs%2Fr1", "/ds/runs/r1")) == "/runs%2Fr1"
    assert stream_path(scope(b"/ds/x/y", "/ds/x/y")) == "/x/y"
    # No raw path, or a mount prefix sent escaped: the decoded path under the root.
    assert stream_path(scope(None, "/ds/streams/a/b")) == "/streams/a/b"
    assert stream_path(scope(b"/d%73/a%2Fb", "/ds/a/b")) == "/a/b"


def test_location_comes_from_the_settings_or_the_accepting_socket_never_host() -> None:
    from gateway.durable_streams._app import settings_from_env
    from gateway.durable_streams._routes import location

    scope = {"type": "http", "scheme": "http", "server": ("::1", 8080), "root_path": "/ds",
             "headers": [(b"host", b"evil.example")]}
    assert location(scope, "/a%2Fb") == "http://[::1]:8080/ds/a%2Fb"
    assert location(scope, "/a%2Fb", "https://baton.example/ds/") == "https://baton.example/ds/a%2Fb"
    assert location({**scope, "server": None}, "/s") == "/ds/s"
    ds, _ = settings_from_env({"BATON_DS_PUBLIC_URL": "https://baton.example/ds"})
    assert ds.public_url == "https://baton.example/ds"
    for bad in ("baton.example/ds", "https://x/\r\nSet-Cookie: a=b"):
        with pytest.raises(ValueError, match="BATON_DS_PUBLIC_URL"):
            settings_from_env({"BATON_DS_PUBLIC_URL": bad})


def test_stream_paths_with_control_characters_are_refused() -> None:
    P.check_stream_path("/a%2Fb/%E2%9C%93 x")
    for bad in ("/a%00b", "/a%0Ab", "/a%0db", "/a%7F", "/a\x01b", "/%1f"):
        with pytest.raises(P.ProtocolError) as exc:
            P.check_stream_path(bad)
        assert exc.value.status == 400
