"""Concurrent etcd transactions coalesced into one, each keeping its own compares (pure).

While one transaction of the store is on its way to etcd, the ones that arrive meanwhile
wait and then go together as one etcd ``Txn`` whose success branch holds each of them as a
nested transaction (``RequestOp.request_txn``, etcd >= 3.3). etcd evaluates every nested
transaction's compares on its own and runs its success or failure branch, all in one
revision, so each caller gets the answer it would have got alone: its compares (the
record's mod revision, the claim, the epoch fence, the incarnation) are checked inside
etcd exactly as before, nothing is checked by the batch on a caller's behalf.

etcd decides every nested transaction's branch against the state before the batch's
writes (``compareToPath`` in etcd's ``apply.go``) and refuses a transaction that writes one
key twice. So a batch only holds transactions whose footprints do not meet: no
transaction writes a key another one compares, reads or writes. Then running them together
is the same as running them one after another in any order. A transaction that names a
key range (a range compare, read or delete) or nests a transaction itself is not batched:
it goes alone.

A batch keeps arrival order among transactions that meet: one that must wait for the next
batch also holds back later ones that meet it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from aetcd import rpc

#: Most transactions in one batch (etcd's ``--max-txn-ops``, default 128, bounds the top
#: level's ops, then each nested transaction's by what is left).
MAX_BATCH = 64
#: Most operations etcd takes in one transaction (``--max-txn-ops``, default 128).
MAX_TXN_OPS = 128

#: Most request bytes in one batch (etcd's ``--max-request-bytes`` default is 1.5 MiB).
MAX_BATCH_BYTES = 512 * 1024


@dataclass(frozen=True)
class Footprint:
    """The keys one transaction writes and the keys it touches at all (writes included).

    ``None`` in place of a footprint means "not batchable" (see the module docstring).
    """

    writes: frozenset[bytes]
    touches: frozenset[bytes]

    def meets(self, other: "Footprint") -> bool:
        """Whether either one writes a key the other touches."""
        return not (self.writes.isdisjoint(other.touches) and other.writes.isdisjoint(self.touches))


def footprint(req: rpc.TxnRequest) -> Footprint | None:
    """What ``req`` writes and touches, or ``None`` when it names a key range or nests a
    transaction (such a request is sent alone)."""
    writes: set[bytes] = set()
    touches: set[bytes] = set()
    for c in req.compare:
        if c.range_end:
            return None
        touches.add(c.key)
    for op in (*req.success, *req.failure):
        kind = op.WhichOneof("request")
        if kind == "request_put":
            writes.add(op.request_put.key)
        elif kind == "request_range":
            if op.request_range.range_end:
                return None
            touches.add(op.request_range.key)
        elif kind == "request_delete_range":
            if op.request_delete_range.range_end:
                return None
            writes.add(op.request_delete_range.key)
        else:
            return None
    touches |= writes
    return Footprint(frozenset(writes), frozenset(touches))


def take_batch(footprints: Sequence[Footprint | None], sizes: Sequence[int], *,
               max_batch: int = MAX_BATCH, max_bytes: int = MAX_BATCH_BYTES) -> list[int]:
    """Which waiting transactions go in the next batch, oldest first.

    Args:
        footprints: each waiting transaction's footprint, in arrival order.
        sizes: each one's request size in bytes.
        max_batch: most transactions in a batch.
        max_bytes: most request bytes in a batch (the first one always goes, whatever its size).

    Returns:
        Indexes into ``footprints`` (ascending); never empty when ``footprints`` is not. A
        transaction without a footprint goes alone, and only when it is the oldest.
    """
    if not footprints:
        return []
    if footprints[0] is None:
        return [0]
    chosen: list[int] = []
    held: list[Footprint] = []  # chosen, and skipped ones later ones must not overtake
    total = 0
    for i, fp in enumerate(footprints):
        if len(chosen) >= max_batch:
            break
        if fp is None:
            # Not batchable: later ones may still go (a range is no key of theirs to meet),
            # but it goes in a batch of its own later.
            continue
        if any(fp.meets(h) for h in held) or (chosen and total + sizes[i] > max_bytes):
            held.append(fp)
            continue
        chosen.append(i)
        held.append(fp)
        total += sizes[i]
    return chosen


def combine(reqs: Sequence[rpc.TxnRequest]) -> rpc.TxnRequest:
    """One transaction running each of ``reqs`` as a nested transaction (no compare of its
    own: it always takes its success branch)."""
    return rpc.TxnRequest(success=[rpc.RequestOp(request_txn=r) for r in reqs])


def flat_reads(reqs: Sequence[rpc.TxnRequest], max_ops: int = MAX_TXN_OPS) -> list[
        tuple[rpc.TxnRequest, int]] | None:
    """The reads of ``reqs`` side by side in as few transactions as hold them, when each is
    a read without compares (so it always takes its success branch); else ``None``
    (:func:`combine` them).

    etcd serves a transaction of reads only as a read (at its current revision, after a
    ReadIndex); one of nested transactions is a write to it, whatever they hold (etcd 3.5's
    ``isTxnReadonly`` looks at the top level only), so a :func:`combine` of reads would go
    through raft: a proposal in the WAL that every member applies.

    Returns:
        (transaction, how many of ``reqs`` it holds) in the order of ``reqs``: each holds at
        most ``max_ops`` ops (etcd's ``--max-txn-ops``), and one request's reads are never
        split, so each is read at one revision, as alone. :func:`split_flat` splits an
        answer.
    """
    if not all(not r.compare and read_only(r) for r in reqs):
        return None
    out: list[tuple[rpc.TxnRequest, int]] = []
    ops: list[rpc.RequestOp] = []
    n = 0
    for r in reqs:
        if n and len(ops) + len(r.success) > max_ops:
            out.append((rpc.TxnRequest(success=ops), n))
            ops, n = [], 0
        ops += r.success
        n += 1
    out.append((rpc.TxnRequest(success=ops), n))
    return out


def split_flat(responses: Sequence[rpc.ResponseOp], reqs: Sequence[rpc.TxnRequest]) -> list[
        tuple[bool, Sequence[rpc.ResponseOp]]]:
    """Each of ``reqs``' (succeeded, responses) from the responses of a :func:`flat_reads`
    transaction holding them, in the order of ``reqs`` (each took its success branch).

    Raises:
        ValueError: ``responses`` are not one range response per read of ``reqs``.
    """
    counts = [len(r.success) for r in reqs]
    if len(responses) != sum(counts) or not all(r.HasField("response_range") for r in responses):
        raise ValueError(f"expected {sum(counts)} range responses, got {len(responses)}")
    out: list[tuple[bool, Sequence[rpc.ResponseOp]]] = []
    start = 0
    for n in counts:
        out.append((True, responses[start:start + n]))
        start += n
    return out


def split(responses: Sequence[rpc.ResponseOp], n: int) -> list[tuple[bool, Sequence[rpc.ResponseOp]]]:
    """Each nested transaction's (succeeded, responses) from the responses of a
    :func:`combine` d transaction, in the order of its ``reqs``.

    Raises:
        ValueError: ``responses`` are not ``n`` nested transaction responses.
    """
    if len(responses) != n or not all(r.HasField("response_txn") for r in responses):
        raise ValueError(f"expected {n} nested transaction responses, got {len(responses)}")
    return [(r.response_txn.succeeded, r.response_txn.responses) for r in responses]


def read_only(req: rpc.TxnRequest) -> bool:
    """Whether ``req`` writes nothing (only range reads in either branch)."""
    return all(o.HasField("request_range") for o in (*req.success, *req.failure))
