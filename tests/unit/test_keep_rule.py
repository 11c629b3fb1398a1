"""The rules of keeping a detached run (baton/keep.py) and the reaper's cancel that honours them."""
from __future__ import annotations

import math

import pytest

from baton.errors import InvalidArgument
from baton import keep
from baton.v1.runs_pb2 import RunRecord, RunStatus
from coordinator.rules import Snapshot, reap_cancel

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("raw, ttl", [(60, 60.0), ("90.5", 90.5), (1e6, 1e6)])
def test_a_ttl_is_a_finite_positive_number(raw: object, ttl: float) -> None:
    assert keep.check_keep_ttl(raw, "ttl") == ttl


@pytest.mark.parametrize("raw", [0, -1, "x", None, True, math.nan, math.inf, "-inf", [3]])
def test_a_bad_ttl_names_its_field(raw: object) -> None:
    with pytest.raises(InvalidArgument) as bad:
        keep.check_keep_ttl(raw, "ttlSeconds")
    assert bad.value.field == "ttlSeconds"


def test_zero_is_no_change_where_allowed() -> None:
    assert keep.check_keep_ttl(0, "keep_ttl_seconds", allow_zero=True) == 0.0


def test_grant_clamps_and_never_shortens() -> None:
    assert keep.grant(100, 50) == 50 and keep.grant(10, 50) == 10
    assert keep.kept_until(1000.0, 60, None) == 1060.0
    assert keep.kept_until(1000.0, 60, 5000.0) == 5000.0
    assert keep.kept_until(1000.0, 60, 1001.0) == 1060.0


def test_the_deadline_is_the_later_of_the_ttl_and_the_keep() -> None:
    assert keep.reap_deadline(100.0, 3600, None) == 3700.0
    assert keep.reap_deadline(100.0, 3600, 9000.0) == 9000.0
    assert keep.reap_deadline(100.0, 3600, 200.0) == 3700.0
    assert keep.expired(100.0, 3600, None, 3700.0)  # inclusive
    assert not keep.expired(100.0, 3600, 9000.0, 3700.0) and keep.expired(100.0, 3600, 9000.0, 9000.0)


def _snap(**fields: object) -> Snapshot:
    rec = RunRecord(run_id="r", thread_id="t", status=RunStatus.RUN_STATUS_RUNNING, detached_since=100.0, **fields)  # type: ignore[arg-type]
    return Snapshot(run_id="r", kv=None, record=rec, claim_kv=None, revision=1, incarnation=b"i")


def test_the_reapers_cancel_loses_to_a_keep_that_landed_after_the_listing() -> None:
    plan = reap_cancel(_snap(kept_until=9000.0), listed_detached_since=100.0, ttl=3600, now=4000.0)
    assert plan.result == "kept" and not plan.write
    plan = reap_cancel(_snap(kept_until=9000.0), listed_detached_since=100.0, ttl=3600, now=9000.0)
    assert plan.result is None and plan.new is not None and plan.new.cancel_reason == "reaped"
    plan = reap_cancel(_snap(), listed_detached_since=100.0, ttl=3600, now=3700.0)
    assert plan.result is None and plan.new is not None
