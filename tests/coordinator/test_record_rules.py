"""Pure record rules (no servers): field masks, terminal states, index membership."""
from __future__ import annotations

import pytest

from baton import errors
from baton.v1.runs_pb2 import RunError, RunRecord, RunStatus
from coordinator._keys import Keys, micros
from coordinator._records import apply_mask, check_paths, is_active, is_reclaimable, is_terminal


def test_terminal_states() -> None:
    assert {s for s in RunStatus.values() if is_terminal(s)} == {
        RunStatus.RUN_STATUS_COMPLETED, RunStatus.RUN_STATUS_FAILED, RunStatus.RUN_STATUS_ABORTED}


def test_apply_mask_sets_clears_and_leaves_the_rest() -> None:
    cur = RunRecord(run_id="r", thread_id="t", sandbox_key="sb", detached_since=5.0,
                    error=RunError(message="m", code="c"), driver_epoch=3)
    new = apply_mask(cur, RunRecord(sandbox_key="ignored", finished_at=9.0), ["finished_at", "detached_since", "error"])
    assert new == RunRecord(run_id="r", thread_id="t", sandbox_key="sb", finished_at=9.0, driver_epoch=3)
    assert not new.HasField("detached_since") and not new.HasField("error")
    assert cur.detached_since == 5.0   # the input is not modified


@pytest.mark.parametrize("path", ["run_id", "thread_id", "revision", "tenant", "driver_epoch", "nope",
                                  "error.message"])
def test_check_paths_refuses_read_only_and_unknown(path: str) -> None:
    with pytest.raises(errors.InvalidArgument) as ei:
        check_paths([path])
    assert ei.value.field == "update_mask"


def test_index_membership() -> None:
    running = RunRecord(status=RunStatus.RUN_STATUS_RUNNING)
    assert is_active(running) and not is_reclaimable(running)
    running.detached_since = 1.0
    assert is_reclaimable(running)
    assert not is_reclaimable(RunRecord(status=RunStatus.RUN_STATUS_INTERRUPTED, detached_since=1.0))


def test_reclaimable_keys_sort_by_time_and_cutoff_is_inclusive() -> None:
    k = Keys("/p/")
    assert k.reclaimable(9.5, "z") < k.reclaimable(10.0, "a") < k.reclaimable(100.0, "a")
    assert k.reclaimable(10.0, "a") < k.reclaimable_until(10.0) <= k.reclaimable(10.000001, "a")
    assert micros(0.1 + 0.2) == 300000


def test_keys_of_different_runs_never_nest() -> None:
    k = Keys("/p/")
    assert not k.reader("a/b", "x").startswith(k.readers("a"))
    assert k.run_id_of_reader(k.reader("a/b", "x")) == "a/b"
    assert k.run_id_of_claim(k.claim("r%1")) == "r%1"
