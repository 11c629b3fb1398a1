"""Fixed schedules replaying the bugs the nemesis found (``make test-nemesis`` runs them
before the random schedule; skipped unless ``BATON_NEMESIS=1``).

- A host (re)started while the coordinator replica it dials first is down: before the fix
  ``OpenSession`` was tried on that replica only, and the host could not start at all.
- A coordinator restarted under live readers: calls in flight came back ``CANCELLED`` and
  escaped the gateway as an unhandled exception out of an SSE response (the checker's
  ``no_unhandled_error``).
"""
from __future__ import annotations

import os
import pathlib

import pytest

from tests.nemesis.cluster import available_kinds
from tests.nemesis.runner import play
from tests.nemesis.schedule import Fault, Schedule, Topology

pytestmark = [pytest.mark.servers,
              pytest.mark.skipif(os.environ.get("BATON_NEMESIS") != "1", reason="`make test-nemesis` runs it")]

CASES = {
    "host_restarts_while_the_first_coordinator_is_down": [
        # coordinator-0 down longer than the nemesis retries a restart (60 s)
        Fault(8.0, "kill", "coordinator-0", 80.0), Fault(14.0, "kill", "host-0", 3.0),
        Fault(20.0, "restart", "host-1")],
    "coordinators_restart_under_readers": [
        Fault(8.0, "restart", "coordinator-0"), Fault(20.0, "restart", "coordinator-1"),
        Fault(32.0, "restart", "coordinator-0")],
}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", sorted(CASES))
async def test_fixed_schedule(case: str, tmp_path: pathlib.Path) -> None:
    schedule = Schedule(seed=sorted(CASES).index(case) + 1, minutes=1.5, faults=CASES[case])
    outcome = await play(tmp_path, schedule, Topology(kinds=available_kinds()), slots=4, length=110.0)
    # A fault whose process could not be started again within a minute fails its inject.
    assert not [e for e in outcome.errors if e.startswith("t=")], outcome.errors
    assert not outcome.violations, "\n".join(str(v) for v in outcome.violations)
