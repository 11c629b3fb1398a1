"""Faults at the sandbox daemon (docs/design.md §5.1), compared with the uninterrupted replay
(``FaultCluster.check``: every reader's chunks, a fresh read, the stored log, the transcript).

- Every sandbox's daemon SIGKILLed mid-run, twice, with the journals read through the daemons
  (``BATON_LOCAL_SANDBOX_IO=daemon``, as a docker or kubernetes sandbox's): the next call
  starts a new one (its agent lives on) and the journal is read on from the offset the host
  held.
- A host SIGKILLed mid-run and its runs taken over by a host with another journal and
  sandbox directory, journals read through the daemons: it reads the sandboxes' journals
  through their daemons, found from the handles. (With the default, direct reads, every
  other fault case's successor reads them on the machine.)
"""
from __future__ import annotations

import os
import pathlib
import signal

import pytest

from tests.faults.conftest import ClusterFactory
from tests.faults.harness import FaultCluster, eventually

pytestmark = pytest.mark.servers


def _daemon_pids(c: FaultCluster) -> dict[str, int]:
    """Sandbox directory name → the pid in its daemon's address file (live daemons only)."""
    out = {}
    for d in c.sandbox_dir.iterdir() if c.sandbox_dir.exists() else []:
        try:
            pid = int((d / ".baton" / "daemon.addr").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if pathlib.Path(f"/proc/{pid}").exists():
            out[d.name] = pid
    return out


@pytest.mark.timeout(240)
async def test_daemons_killed_mid_run_lose_and_repeat_nothing(fault_cluster: ClusterFactory) -> None:
    c = await fault_cluster(hosts=2, host_env={"BATON_LOCAL_SANDBOX_IO": "daemon"})
    runs = await c.start_runs(3, seconds=8, detached=1)
    for round_ in (1, 2):
        await c.wait_progress(runs, 25 * round_)
        before = await eventually(lambda: (p := _daemon_pids(c)) and len(p) == len(runs) and p, 30)
        async with c.fault(f"every sandbox daemon SIGKILLed mid-run (round {round_})"):
            for pid in before.values():
                os.kill(pid, signal.SIGKILL)
            # Replaced at the hosts' next call (a follow resumes at once): new pids.
            await eventually(lambda: (p := _daemon_pids(c)) and all(
                p.get(k) not in (None, v) for k, v in before.items()), 30)
    await c.finish(timeout=120)
    await c.check()


@pytest.mark.timeout(300)
async def test_successor_with_other_dirs_reads_journals_through_daemons(fault_cluster: ClusterFactory,
                                                                       tmp_path: pathlib.Path) -> None:
    c = await fault_cluster(hosts=1, host_env={"BATON_LOCAL_SANDBOX_IO": "daemon"})
    # Long enough to be running still once the successor has started.
    runs = await c.start_runs(2, seconds=40, detached=1)
    await c.wait_progress(runs, 20)
    # The successor sees none of the first host's directories by its settings.
    other = tmp_path / "successor"
    b = await c.add_host(BATON_JOURNAL_DIR=str(other / "journals"), BATON_SANDBOX_DIR=str(other / "sandboxes"),
                         BATON_LOCAL_SANDBOX_IO="daemon")
    async with c.fault("the only driving host SIGKILLed; its successor has other directories"):
        await c.hosts[0].kill()

        async def moved() -> None:
            drivers = await c.drivers(runs)
            assert set(drivers.values()) == {b.host_id}, drivers
        await eventually(moved, 60)
    await c.finish(timeout=150)
    await c.check()
    assert not (other / "journals").exists() or not any((other / "journals").iterdir())


