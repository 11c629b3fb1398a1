"""The host's workspace upkeep removes idle thread directories that a snapshot holds, and
nothing else: not a directory in use (unmarked), not one marked recently."""
from __future__ import annotations

import os
import pathlib

import pytest

from sandbox_host.providers.local import LocalProvider
from sandbox_host.workspace_upkeep import UpkeepSettings, sweep_once

pytestmark = pytest.mark.unit


async def test_idle_marked_thread_directories_go_and_the_rest_stay(tmp_path: pathlib.Path) -> None:
    provider = LocalProvider(base_dir=str(tmp_path / "sandboxes"), journal_dir=str(tmp_path / "journals"))
    threads = tmp_path / "sandboxes" / "threads"
    for name in ("idle", "recent", "in-use"):
        (threads / name / "work").mkdir(parents=True)
        (threads / name / "work" / "f.txt").write_text(name)
    (threads / "idle" / ".baton-snapshot").write_text("d1\n")
    os.utime(threads / "idle" / ".baton-snapshot", (1000, 1000))
    (threads / "recent" / ".baton-snapshot").write_text("d2\n")
    await sweep_once(None, {"local": provider}, UpkeepSettings(warm_ttl=3600), now=os.stat(threads).st_mtime + 10)
    assert sorted(p.name for p in threads.iterdir()) == ["in-use", "recent"]
