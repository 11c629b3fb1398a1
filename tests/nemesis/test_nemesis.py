"""The nemesis (``make test-nemesis``): a random schedule of faults from a seed, over
``NEMESIS_MINUTES`` (10), while the workload runs; the checker over the whole history.

``NEMESIS_SEED`` replays a seed (default: a new one, printed); ``NEMESIS_SCHEDULE`` replays
a saved (e.g. shrunk) schedule file; ``NEMESIS_RUNS`` concurrent users (6);
``NEMESIS_SHRINK`` replays spent shrinking a failure (3; 0 under CI). A failing history is
saved under ``bench/results/nemesis-failures/`` with its process logs. The figures go to
``bench/results/nemesis.json``. Skipped unless ``BATON_NEMESIS=1`` (the make target sets it).
"""
from __future__ import annotations

import os
import pathlib
import random
import sys

import pytest

from tests.nemesis.cluster import available_kinds
from tests.nemesis.runner import keep_logs, play, save_failure, table, write_results
from tests.nemesis.schedule import Schedule, Topology, draw, loads, shrink

pytestmark = [pytest.mark.servers,
              pytest.mark.skipif(os.environ.get("BATON_NEMESIS") != "1", reason="`make test-nemesis` runs it")]

MINUTES = float(os.environ.get("NEMESIS_MINUTES") or 10)
SHRINK = int(os.environ.get("NEMESIS_SHRINK") or (0 if os.environ.get("CI") else 3))
SLOTS = int(os.environ.get("NEMESIS_RUNS") or 6)
#: The whole session, its heal and checks, and every shrinking replay.
BUDGET = (MINUTES * 60 + 900) * (1 + SHRINK)


@pytest.mark.timeout(BUDGET)
async def test_nemesis(tmp_path: pathlib.Path) -> None:
    topology = Topology(kinds=available_kinds())
    if os.environ.get("NEMESIS_SCHEDULE"):
        schedule = loads(pathlib.Path(os.environ["NEMESIS_SCHEDULE"]).read_text())
    else:
        seed = int(os.environ.get("NEMESIS_SEED") or random.randrange(1, 10**9))
        schedule = draw(seed, MINUTES, topology)
    print(f"\nnemesis: seed {schedule.seed}, {len(schedule.faults)} faults over {schedule.minutes} min "
          f"(replay: make test-nemesis SEED={schedule.seed} NEMESIS_MINUTES={schedule.minutes:g})", file=sys.stderr)
    for f in schedule.faults:
        print(f"  {f.describe()}", file=sys.stderr)
    outcome = await play(tmp_path / "main", schedule, topology, slots=SLOTS)
    data = write_results(outcome)
    print(table(data), file=sys.stderr)
    for e in outcome.errors[:20]:
        print(f"  nemesis/workload: {e}", file=sys.stderr)
    if not outcome.violations:
        return
    save_failure(outcome)
    keep_logs(tmp_path / "main", schedule.seed)
    shrunk: Schedule | None = None
    if SHRINK:
        trials = iter(range(SHRINK))

        async def fails(s: Schedule) -> bool:
            i = next(trials)
            length = max([f.end for f in s.faults], default=0.0) + 60.0
            return bool((await play(tmp_path / f"shrink-{i}", s, topology, slots=SLOTS, length=length)).violations)
        shrunk = await _ashrink(schedule, fails, SHRINK)
    path = save_failure(outcome, shrunk)
    lines = "\n".join(str(v) for v in outcome.violations[:30])
    raise AssertionError(f"{len(outcome.violations)} violations (seed {schedule.seed}; history in {path}"
                         f"{'; shrunk to ' + str(len(shrunk.faults)) + ' faults' if shrunk else ''}):\n{lines}")


async def _ashrink(schedule: Schedule, fails: object, budget: int) -> Schedule:
    """:func:`shrink` with an async replay: the replays run one by one, each awaited."""
    import asyncio

    loop = asyncio.get_running_loop()

    def sync_fails(s: Schedule) -> bool:
        return asyncio.run_coroutine_threadsafe(fails(s), loop).result()  # type: ignore[operator]
    return await asyncio.to_thread(shrink, schedule, sync_fails, budget)
