"""`baton demo --quick`, as CI runs it: exits 0 with a passing table, leaves nothing behind."""
from __future__ import annotations

import pathlib

import pytest

from tests.cli.conftest import processes_mentioning, run_cli

# Starts baton processes by hand: not a `unit` test (tests/conftest.py).
pytestmark = pytest.mark.servers


@pytest.mark.timeout(150)
def test_demo_quick_passes_and_leaves_nothing_behind(tmp_path: pathlib.Path) -> None:
    data_dir = tmp_path / "demo"
    out = run_cli("demo", "--quick", "--data-dir", str(data_dir), timeout=140)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    text = out.stdout
    assert "SIGKILL host-1" in text and "rejoined with Last-Event-ID" in text and "joined fresh from offset -1" in text
    (row,) = [line for line in text.splitlines() if line.rstrip().endswith("claude/partial-messages-bash-exit-128")]
    verdict, chunks, dups, gaps, takeover, transcript, status, host, reader, _journal = row.split()
    assert verdict == "PASS"
    assert int(chunks) > 100
    assert (dups, gaps) == ("0", "0")
    # Taken over by the other host, and a latency was measured.
    before, _, after = host.partition("→")
    assert before.startswith("host-") and after.startswith("host-") and before != after
    assert takeover.endswith("s") and float(takeover[:-1]) > 0
    assert (transcript, status) == ("equal", "completed")
    assert reader == "both"  # rejoined by Last-Event-ID, and a second tab reloaded
    assert processes_mentioning(str(data_dir)) == []
