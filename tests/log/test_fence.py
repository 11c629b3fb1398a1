"""The epoch fence as a table (no servers): tail record × epoch × the writer's operation."""
from __future__ import annotations

import itertools

import pytest

from baton.log import _headers as H
from baton.log._headers import StoredRecord
from baton.log.fence import Op, Verdict, describe, judge

pytestmark = pytest.mark.unit

WRITE, LOST, CLOSED, CONFLICT = Verdict.WRITE, Verdict.LOST, Verdict.CLOSED, Verdict.CONFLICT
E = 5  # the writer's epoch
EPOCHS = {"lower": E - 1, "equal": E, "higher": E + 1}

#: (tail kind, tail epoch relative to the writer's) → verdict for (fence, append, close).
#: ``append`` means "my chunk's compare failed and this is the tail".
TABLE: dict[tuple[str, str | None], tuple[Verdict, Verdict, Verdict]] = {
    ("none", None):       (WRITE,  CONFLICT, WRITE),
    ("chunk", "lower"):   (WRITE,  CONFLICT, WRITE),
    ("chunk", "equal"):   (WRITE,  CONFLICT, WRITE),
    ("chunk", "higher"):  (LOST,   LOST,     LOST),
    ("fence", "lower"):   (WRITE,  CONFLICT, WRITE),
    ("fence", "equal"):   (WRITE,  CONFLICT, WRITE),
    ("fence", "higher"):  (LOST,   LOST,     LOST),
    ("close", "lower"):   (CLOSED, CONFLICT, CLOSED),
    ("close", "equal"):   (CLOSED, CONFLICT, CLOSED),
    ("close", "higher"):  (LOST,   LOST,     LOST),
}
OPS = (Op.FENCE, Op.APPEND, Op.CLOSE)


def _tail(kind: str, rel: str | None) -> StoredRecord | None:
    if kind == "none":
        return None
    assert rel is not None
    return StoredRecord(offset=42, kind=kind, epoch=EPOCHS[rel], status="completed" if kind == "close" else None)


ROWS = [(kind, rel, op, verdicts[i]) for (kind, rel), verdicts in TABLE.items() for i, op in enumerate(OPS)]


def test_the_table_covers_every_combination() -> None:
    expected = {("none", None)} | set(itertools.product(("chunk", "fence", "close"), EPOCHS))
    assert set(TABLE) == expected and len(ROWS) == 30


@pytest.mark.parametrize(("kind", "rel", "op", "verdict"), ROWS,
                         ids=[f"{k}-{r or 'empty'}-{o.value}" for k, r, o, _ in ROWS])
def test_fence_rule(kind: str, rel: str | None, op: Op, verdict: Verdict) -> None:
    assert judge(_tail(kind, rel), E, op) is verdict


@pytest.mark.parametrize("op", OPS)
def test_a_much_higher_epoch_is_lost_and_epoch_zero_is_lower(op: Op) -> None:
    assert judge(StoredRecord(1, "chunk", 10**9), E, op) is LOST
    assert judge(StoredRecord(1, "close", 0), 1, op) is (CONFLICT if op is Op.APPEND else CLOSED)


@pytest.mark.parametrize("headers", [None, {}, {H.KIND: "close"}, {H.EPOCH: "x", H.KIND: "fence"}])
def test_foreign_or_garbled_headers_read_as_epoch_zero(headers: dict[str, str] | None) -> None:
    """A record without (valid) baton headers never outranks a writer and never latches it."""
    tail = H.parse_record(7, headers)
    assert tail.epoch == 0
    assert judge(tail, 1, Op.FENCE) is (CLOSED if tail.kind == "close" else WRITE)
    assert judge(tail, 1, Op.APPEND) is CONFLICT


def test_describe_names_kind_and_epoch_as_run_claim_lost_observed() -> None:
    assert describe(StoredRecord(3, "fence", 7)) == "fence@7"
    assert describe(H.parse_record(3, {})) == "chunk@0"
