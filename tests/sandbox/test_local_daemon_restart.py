"""A local sandbox's daemon found stopping when the next run of its thread starts (the run
before ended on another host, which stopped it): the host waiting for its address starts it
again, instead of waiting for one that is gone."""
from __future__ import annotations

import asyncio
import fcntl
import os
import pathlib

import pytest

from sandbox_host.journal import new_nonce
from sandbox_host.providers import SandboxSpec
from sandbox_host.providers._local_daemon import ADDR_FILE, LOCK_FILE, daemon_running, meta_dir
from sandbox_host.providers.local import LocalProvider
from tests.conftest import assert_eventually
from tests.sandbox.conftest import with_data

pytestmark = [pytest.mark.servers, pytest.mark.timeout(120)]


async def test_a_daemon_stopping_as_the_next_run_starts_is_started_again(tmp_path: pathlib.Path) -> None:
    host = LocalProvider(str(tmp_path / "sandboxes"), str(tmp_path / "journals"), idle_check=0.05)
    h = await host.create("restart-run", SandboxSpec())
    meta = pathlib.Path(meta_dir(h))
    try:
        await host._daemons.stop(h)  # whatever create started
        await assert_eventually(lambda: not daemon_running(str(meta)), timeout=30)
        # The daemon of the run before, on its way out: its lock still held, its address gone.
        (meta / ADDR_FILE).unlink(missing_ok=True)
        fd = os.open(meta / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        asyncio.get_running_loop().call_later(1.0, os.close, fd)  # ... and gone a second later
        launched = await host.launch(h, ["sh", "-c", "echo after-restart"], nonce=new_nonce())
        h = with_data(h, launched)

        async def ran() -> bool:
            return b"after-restart" in await host.read_file(h, h.journal_path)
        await assert_eventually(ran, timeout=30)
    finally:
        await host.destroy(h)
        await host.close()


_HUNG = """
import fcntl, faulthandler, os, signal, sys, time  # stands in for: python -m sandbox_host.daemon
faulthandler.register(signal.SIGUSR1, all_threads=True)
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
def hung_in_startup():
    while True:
        time.sleep(0.05)
hung_in_startup()
"""


async def test_a_daemon_that_holds_its_lock_and_never_serves_is_named_with_its_stacks(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host that waits in vain for a live daemon's address asks it for its stacks
    (``SIGUSR1``) before it gives up, so the error and the host's log say where it hangs."""
    import subprocess
    import sys

    from sandbox_host.providers import _local_daemon

    host = LocalProvider(str(tmp_path / "sandboxes"), str(tmp_path / "journals"), idle_check=0.05)
    h = await host.create("hung-run", SandboxSpec())
    meta = pathlib.Path(meta_dir(h))
    hung = None
    try:
        await host._daemons.stop(h)
        await assert_eventually(lambda: not daemon_running(str(meta)), timeout=30)
        (meta / ADDR_FILE).unlink(missing_ok=True)
        with open(meta / "daemon.log", "ab") as log_file:
            hung = subprocess.Popen([sys.executable, "-c", _HUNG, str(meta / LOCK_FILE)],
                                    stdout=log_file, stderr=log_file)
        await assert_eventually(lambda: daemon_running(str(meta)), timeout=30)
        monkeypatch.setattr(_local_daemon, "START_TIMEOUT", 2.0)
        # What the host's wait for the daemon's address ends with (a launch wraps it in a
        # SandboxBuildFailed that quotes it, after its client's 30 s of patience).
        with pytest.raises(OSError) as caught:
            await host._daemons._wait_addr(h, str(meta))
        assert "(running)" in str(caught.value) and "hung_in_startup" in str(caught.value)
    finally:
        if hung is not None:
            hung.kill()
            hung.wait()
        await host.destroy(h)
        await host.close()


_SLOW = """
import fcntl, os, sys, time  # stands in for a daemon on a busy machine: slow to take its lock
time.sleep(float(sys.argv[3]))
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write("127.0.0.1:1 %d" % os.getpid())
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
time.sleep(60)
"""


@pytest.mark.parametrize("alive", [True, False])
async def test_a_daemon_still_starting_is_not_started_twice(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, alive: bool) -> None:
    """The daemon a host started, alive but not yet holding its lock past ``RESPAWN_AFTER``
    (a busy machine), is waited for, not started again (a second one only costs its start-up
    CPU, then exits at the lock); one that is gone is started again."""
    import subprocess
    import sys

    from sandbox_host.providers import _local_daemon

    host = LocalProvider(str(tmp_path / "sandboxes"), str(tmp_path / "journals"), idle_check=0.05)
    h = await host.create("slow-run", SandboxSpec())
    meta = pathlib.Path(meta_dir(h))
    slow = None
    spawns: list[bool] = []

    async def spawn(handle: object, meta_: str, *, fresh: bool = True) -> int | None:
        spawns.append(fresh)
        return None

    try:
        await host._daemons.stop(h)
        await assert_eventually(lambda: not daemon_running(str(meta)), timeout=30)
        (meta / ADDR_FILE).unlink(missing_ok=True)
        slow = subprocess.Popen([sys.executable, "-c", _SLOW, str(meta / LOCK_FILE), str(meta / ADDR_FILE),
                                 "1.5" if alive else "600"])
        if not alive:
            slow.kill()
            slow.wait()
        monkeypatch.setattr(_local_daemon, "RESPAWN_AFTER", 0.3)
        monkeypatch.setattr(_local_daemon, "START_TIMEOUT", 20.0 if alive else 2.0)
        monkeypatch.setattr(host._daemons, "_spawn", spawn)
        if alive:
            assert await host._daemons._wait_addr(h, str(meta), slow.pid) == "127.0.0.1:1"
            assert spawns == []
        else:
            with pytest.raises(OSError):  # the stand-in _spawn starts nothing
                await host._daemons._wait_addr(h, str(meta), slow.pid)
            assert spawns and not any(spawns)  # started again (fresh=False: keep any address)
    finally:
        if slow is not None:
            slow.kill()
            slow.wait()
        await host.destroy(h)
        await host.close()


def test_a_daemon_start_tells_its_pid_and_returns_at_once_under_uvloop(tmp_path: pathlib.Path) -> None:
    """The hosts run on uvloop: the start returns when its shell has, with the daemon's pid
    (the one that then serves), while that daemon runs (a pipe the daemon inherited once made
    the start wait for the daemon's exit, 60 s idle later)."""
    import uvloop

    from sandbox_host.daemon import _procs

    async def main() -> tuple[int | None, bool, int]:
        host = LocalProvider(str(tmp_path / "sandboxes"), str(tmp_path / "journals"), idle_check=0.05)
        h = await host.create("uvloop-run", SandboxSpec())
        meta = meta_dir(h)
        try:
            await host._daemons.stop(h)
            await assert_eventually(lambda: not daemon_running(meta), timeout=30)
            pid = await host._daemons._spawn(h, meta)
            st = _procs.proc_stat(pid) if pid else None
            alive = st is not None and st[0] != "Z"
            await host._daemons._wait_addr(h, meta, pid)
            with open(os.path.join(meta, ADDR_FILE)) as f:
                return pid, alive, int(f.read().split()[1])
        finally:
            await host.destroy(h)
            await host.close()

    pid, alive_at_return, serving = uvloop.run(main())
    assert alive_at_return and pid == serving
