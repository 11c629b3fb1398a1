"""Which concurrent etcd transactions may share one batch (coordinator/_batching.py), pure.

A batch runs its transactions as nested ones, each deciding its branch on the state before
the batch: only transactions that do not meet (none writes a key another compares, reads
or writes) may go together, and arrival order holds among those that do.
"""
from __future__ import annotations

import pytest
from aetcd import rpc

from coordinator import _batching as B
from coordinator import _etcd as E

pytestmark = pytest.mark.unit


def _write(run: str, *, lease: int = 0, extra_cmp: bytes = b"") -> rpc.TxnRequest:
    """A record write as the store sends it: compares, puts, failure reads."""
    cmps = [E.cmp_mod(f"/p/runs/{run}".encode(), 7), E.cmp_value(b"/p/incarnation", b"x")]
    if extra_cmp:
        cmps.append(E.cmp_absent(extra_cmp))
    return rpc.TxnRequest(
        compare=cmps,
        success=[E.put(f"/p/runs/{run}".encode(), b"rec"), E.put(f"/p/claims/{run}".encode(), b"c", lease)],
        failure=[E.get(f"/p/runs/{run}".encode()), E.get(f"/p/claims/{run}".encode()), E.get(b"/p/incarnation")])


def _fp(req: rpc.TxnRequest) -> B.Footprint:
    fp = B.footprint(req)
    assert fp is not None
    return fp


def test_a_footprint_is_the_keys_written_and_every_key_touched() -> None:
    fp = _fp(_write("a"))
    assert fp.writes == {b"/p/runs/a", b"/p/claims/a"}
    assert fp.touches == {b"/p/runs/a", b"/p/claims/a", b"/p/incarnation"}
    delete = rpc.TxnRequest(success=[E.delete(b"/k")])
    assert _fp(delete).writes == {b"/k"}


def test_ranges_and_nested_transactions_are_not_batched() -> None:
    assert B.footprint(rpc.TxnRequest(compare=[E.cmp_absent(b"/r/", b"/r0")])) is None
    assert B.footprint(rpc.TxnRequest(success=[E.get(b"/r/", b"/r0", count_only=True)])) is None
    assert B.footprint(rpc.TxnRequest(success=[E.delete(b"/r/", b"/r0")])) is None
    assert B.footprint(B.combine([_write("a")])) is None


def test_writes_of_different_runs_meet_only_where_keys_do() -> None:
    a, b = _fp(_write("a")), _fp(_write("b"))
    assert not a.meets(b)  # both compare the incarnation key; neither writes it
    assert a.meets(_fp(_write("a")))  # one run twice
    # One compares a key the other writes (a thread's active-run entry, say).
    c = _fp(_write("c", extra_cmp=b"/p/claims/a"))
    assert c.meets(a) and a.meets(c)


def test_a_batch_takes_what_does_not_meet_oldest_first() -> None:
    fps = [_fp(_write(r)) for r in ("a", "b", "a", "c")]
    assert B.take_batch(fps, [10] * 4) == [0, 1, 3]


def test_one_held_back_holds_back_later_ones_that_meet_it() -> None:
    # "a" twice: the second waits; "x" compares a key "a" writes, so it waits too, and
    # arrival order among them holds in the next batch.
    fps = [_fp(_write("a")), _fp(_write("a")), _fp(_write("x", extra_cmp=b"/p/runs/a")), _fp(_write("y"))]
    assert B.take_batch(fps, [10] * 4) == [0, 3]
    assert B.take_batch(fps[1:3], [10] * 2) == [0]


def test_a_transaction_without_a_footprint_goes_alone_when_oldest() -> None:
    fps: list[B.Footprint | None] = [None, _fp(_write("a"))]
    assert B.take_batch(fps, [10, 10]) == [0]
    fps = [_fp(_write("a")), None, _fp(_write("b"))]
    assert B.take_batch(fps, [10] * 3) == [0, 2]
    assert B.take_batch([], []) == []


def test_a_batch_is_bounded_in_count_and_bytes() -> None:
    fps = [_fp(_write(f"r{i}")) for i in range(10)]
    assert B.take_batch(fps, [10] * 10, max_batch=4) == [0, 1, 2, 3]
    assert B.take_batch(fps, [40] * 10, max_bytes=100) == [0, 1]
    # The oldest always goes, however big.
    assert B.take_batch(fps, [1000] + [1] * 9, max_bytes=100) == [0]
    assert B.take_batch(fps[:1], [10**9], max_bytes=100) == [0]


def test_combine_and_split_keep_each_transaction_its_own_answer() -> None:
    reqs = [_write("a"), _write("b")]
    combined = B.combine(reqs)
    assert not combined.compare and [op.request_txn for op in combined.success] == reqs
    resp = rpc.TxnResponse(succeeded=True, responses=[
        rpc.ResponseOp(response_txn=rpc.TxnResponse(succeeded=True, responses=[
            rpc.ResponseOp(response_put=rpc.PutResponse())])),
        rpc.ResponseOp(response_txn=rpc.TxnResponse(succeeded=False, responses=[
            rpc.ResponseOp(response_range=rpc.RangeResponse(count=1))]))])
    (ok_a, out_a), (ok_b, out_b) = B.split(resp.responses, 2)
    assert ok_a and out_a[0].HasField("response_put")
    assert not ok_b and out_b[0].response_range.count == 1
    with pytest.raises(ValueError):
        B.split(resp.responses, 3)


def test_read_only_means_range_reads_only() -> None:
    assert B.read_only(rpc.TxnRequest(success=[E.get(b"/a")], failure=[E.get(b"/b")]))
    assert not B.read_only(_write("a"))


def _reads(run: str) -> rpc.TxnRequest:
    """A snapshot read as the store sends it: record, claim, incarnation, no compare."""
    return rpc.TxnRequest(success=[E.get(f"/p/runs/{run}".encode()), E.get(f"/p/claims/{run}".encode()),
                                   E.get(b"/p/incarnation")])


def test_reads_only_go_side_by_side_in_one_read_and_split_back() -> None:
    """Nested, etcd would take them as a write (raft); flat, they stay one read."""
    reqs = [_reads("a"), _reads("b")]
    pieces = B.flat_reads(reqs)
    assert pieces is not None and len(pieces) == 1 and pieces[0][1] == 2
    flat = pieces[0][0]
    assert B.read_only(flat) and not flat.compare
    assert list(flat.success) == [*reqs[0].success, *reqs[1].success]
    resp = [rpc.ResponseOp(response_range=rpc.RangeResponse(count=i)) for i in range(6)]
    assert [(ok, [r.response_range.count for r in out]) for ok, out in B.split_flat(resp, reqs)] == [
        (True, [0, 1, 2]), (True, [3, 4, 5])]
    with pytest.raises(ValueError):
        B.split_flat(resp[:5], reqs)
    with pytest.raises(ValueError):
        B.split_flat([*resp[:5], rpc.ResponseOp(response_put=rpc.PutResponse())], reqs)


def test_reads_past_etcds_op_limit_go_in_several_reads_none_split() -> None:
    reqs = [_reads(str(i)) for i in range(64)]  # 192 ops
    pieces = B.flat_reads(reqs)
    assert pieces is not None
    assert [(len(t.success), n) for t, n in pieces] == [(126, 42), (66, 22)]
    assert [op for t, _ in pieces for op in t.success] == [op for r in reqs for op in r.success]
    assert [(len(t.success), n) for t, n in B.flat_reads(reqs[:3], max_ops=4) or []] == [(3, 1), (3, 1), (3, 1)]


def test_reads_with_compares_or_writes_are_not_flattened() -> None:
    guarded = rpc.TxnRequest(compare=[E.cmp_absent(b"/p/x")], success=[E.get(b"/p/a")], failure=[E.get(b"/p/b")])
    assert B.flat_reads([_reads("a"), guarded]) is None  # its branch depends on its compare
    assert B.flat_reads([_reads("a"), _write("b")]) is None
