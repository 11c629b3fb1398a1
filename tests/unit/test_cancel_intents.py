"""The pure rules of a Stop that races its run's start (coordinator/rules.py)."""
from __future__ import annotations

import pytest

from baton.errors import UnknownRun
from baton.v1.runs_pb2 import RunRecord, RunStatus
from coordinator import rules

pytestmark = pytest.mark.unit


def test_a_run_is_born_cancelled_only_by_its_own_tenants_intent() -> None:
    intent = rules.cancel_intent_value("tenant-a", "user")
    assert rules.born_cancelled(intent, "tenant-a") == "user"
    assert rules.born_cancelled(intent, "tenant-b") is None  # never stops someone else's run
    assert rules.born_cancelled(None, "tenant-a") is None
    assert rules.born_cancelled(b"not json", "tenant-a") is None
    assert rules.born_cancelled(rules.cancel_intent_value("", "user"), "") == "user"  # no auth: tenant ""


def test_a_users_cancel_of_another_tenants_run_is_unknown() -> None:
    rec = RunRecord(run_id="r1", thread_id="t1", status=RunStatus.RUN_STATUS_RUNNING, tenant="tenant-a")
    snap = rules.Snapshot(run_id="r1", kv=None, record=rec, claim_kv=None, revision=1, incarnation=b"i")
    with pytest.raises(UnknownRun):
        rules.cancel_for_tenant(snap, reason="user", tenant="tenant-b")
    plan = rules.cancel_for_tenant(snap, reason="user", tenant="tenant-a")
    assert plan.result.cancel_requested and plan.result.cancel_reason == "user"
