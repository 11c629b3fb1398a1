"""A sandbox host started while NATS is down waited for it forever
and ignored SIGTERM meanwhile, so a deploy (or ``baton down``) hung on it until SIGKILL.
A host still starting owns no run: SIGTERM ends it at once.
"""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys

import pytest

from baton_tools.testing.servers import env_without_proxy, free_port
from tests.conftest import assert_eventually

# Starts baton processes by hand: not a `unit` test (tests/conftest.py).
pytestmark = pytest.mark.servers


async def test_sigterm_stops_a_host_still_waiting_for_nats(tmp_path: pathlib.Path) -> None:
    closed = free_port()  # nothing listens here: NATS is "down"
    env = {**env_without_proxy(), "BATON_NATS_URL": f"nats://127.0.0.1:{closed}",
           "BATON_COORDINATOR": f"127.0.0.1:{free_port()}", "BATON_HOST_LISTEN": f"127.0.0.1:{free_port()}",
           "BATON_HOST_ID": "starting-host", "BATON_JOURNAL_DIR": str(tmp_path / "j"),
           "BATON_SANDBOX_DIR": str(tmp_path / "s")}
    log_path = tmp_path / "host.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sandbox_host"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, cwd=str(pathlib.Path(__file__).parents[2]))
    try:
        # It is up and waiting for NATS (it says so, once).
        await assert_eventually(lambda: b"NATS unreachable" in log_path.read_bytes(), timeout=60)
        os.kill(proc.pid, signal.SIGTERM)
        await assert_eventually(lambda: proc.poll() is not None, timeout=30)
        assert b"Traceback" not in log_path.read_bytes(), log_path.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
