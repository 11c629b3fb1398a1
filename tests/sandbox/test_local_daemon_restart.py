"""A local sandbox's daemon found stopping when the next run of its thread starts (the run
before ended on another host, which stopped it): the host waiting for its address starts it
again, instead of waiting for one that is gone."""
from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import pathlib
import subprocess
import sys
import time
from typing import AsyncIterator, Iterator

import pytest

from sandbox_host.journal import new_nonce
from sandbox_host.providers import SandboxHandle, SandboxSpec, _local_daemon
from sandbox_host.providers._local_daemon import ADDR_FILE, LOCK_FILE, daemon_running, meta_dir
from sandbox_host.providers.local import LocalProvider
from tests.conftest import assert_eventually
from tests.sandbox.conftest import with_data

pytestmark = [pytest.mark.servers, pytest.mark.timeout(120)]


@pytest.fixture
async def quiet_sandbox(tmp_path: pathlib.Path) -> AsyncIterator[tuple[LocalProvider, SandboxHandle, pathlib.Path]]:
    """A local sandbox whose daemon (the one ``create`` started) is stopped and its address
    gone → (provider, handle, its ``.baton`` directory); destroyed afterwards."""
    host = LocalProvider(str(tmp_path / "sandboxes"), str(tmp_path / "journals"), idle_check=0.05, sandbox_io="daemon")
    h = await host.create("quiet-run", SandboxSpec())
    meta = pathlib.Path(meta_dir(h))
    try:
        await host._daemons.stop(h)
        await assert_eventually(lambda: not daemon_running(str(meta)), timeout=30)
        (meta / ADDR_FILE).unlink(missing_ok=True)
        yield host, h, meta
    finally:
        await host.destroy(h)
        await host.close()


@contextlib.contextmanager
def stand_in(script: str, *args: str, log: pathlib.Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """``python -c script *args`` (a stand-in daemon), killed and reaped on exit."""
    out = open(log, "ab") if log is not None else subprocess.DEVNULL
    try:
        proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=out, stderr=out)
    finally:
        if log is not None:
            out.close()  # type: ignore[union-attr]
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


async def test_a_daemon_stopping_as_the_next_run_starts_is_started_again(
        quiet_sandbox: tuple[LocalProvider, SandboxHandle, pathlib.Path]) -> None:
    host, h, meta = quiet_sandbox
    # The daemon of the run before, on its way out: its lock still held, its address gone.
    fd = os.open(meta / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    asyncio.get_running_loop().call_later(1.0, os.close, fd)  # ... and gone a second later
    h = with_data(h, await host.launch(h, ["sh", "-c", "echo after-restart"], nonce=new_nonce()))

    async def ran() -> bool:
        return b"after-restart" in await host.read_file(h, h.journal_path)
    await assert_eventually(ran, timeout=30)


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
        quiet_sandbox: tuple[LocalProvider, SandboxHandle, pathlib.Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A host that waits in vain for a live daemon's address asks it for its stacks
    (``SIGUSR1``) before it gives up, so the error and the host's log say where it hangs."""
    host, h, meta = quiet_sandbox
    with stand_in(_HUNG, str(meta / LOCK_FILE), log=meta / "daemon.log"):
        await assert_eventually(lambda: daemon_running(str(meta)), timeout=30)
        monkeypatch.setattr(_local_daemon, "START_TIMEOUT", 2.0)
        # What the host's wait for the daemon's address ends with (a launch wraps it in a
        # SandboxBuildFailed that quotes it, after its client's 30 s of patience).
        with pytest.raises(OSError) as caught:
            await host._daemons._wait_addr(h, str(meta))
        assert "(running)" in str(caught.value) and "hung_in_startup" in str(caught.value)


_SLOW = """
import fcntl, os, signal, sys, time  # stands in for a daemon on a busy machine: slow to take its lock
while not os.path.exists(sys.argv[3]):  # until the test lets it go on
    time.sleep(0.01)
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write("127.0.0.1:1 %d" % os.getpid())
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
signal.pause()  # serves until killed
"""


@pytest.mark.parametrize("alive", [True, False])
async def test_a_daemon_still_starting_is_not_started_twice(
        quiet_sandbox: tuple[LocalProvider, SandboxHandle, pathlib.Path], monkeypatch: pytest.MonkeyPatch,
        alive: bool) -> None:
    """The daemon a host started, alive but not yet holding its lock past ``RESPAWN_AFTER``
    (a busy machine), is waited for, not started again (a second one only costs its start-up
    CPU, then exits at the lock); one that is gone is started again."""
    host, h, meta = quiet_sandbox
    spawns: list[bool] = []
    seen_starting: list[float] = []  # when the wait found the stand-in alive and starting
    starting = _local_daemon._starting

    async def spawn(handle: object, meta_: str, *, fresh: bool = True) -> int | None:
        spawns.append(fresh)
        return None

    def watched_starting(pid: int | None, meta_: str) -> bool:
        alive_now = starting(pid, meta_)
        if alive_now:
            seen_starting.append(time.monotonic())
        return alive_now

    monkeypatch.setattr(_local_daemon, "RESPAWN_AFTER", 0.3)
    monkeypatch.setattr(_local_daemon, "START_TIMEOUT", 20.0 if alive else 2.0)
    monkeypatch.setattr(_local_daemon, "_starting", watched_starting)
    monkeypatch.setattr(host._daemons, "_spawn", spawn)
    go = meta / "go"
    with stand_in(_SLOW, str(meta / LOCK_FILE), str(meta / ADDR_FILE), str(go)) as slow:
        if not alive:
            slow.kill()
            slow.wait()
            with pytest.raises(OSError):  # the stand-in _spawn starts nothing
                await host._daemons._wait_addr(h, str(meta), slow.pid)
            assert spawns and not any(spawns)  # started again (fresh=False: keep any address)
            return
        waiting = asyncio.ensure_future(host._daemons._wait_addr(h, str(meta), slow.pid))
        # Let it go on once the wait has seen it starting for well past RESPAWN_AFTER.
        await assert_eventually(lambda: seen_starting and seen_starting[-1] - seen_starting[0] > 3 * 0.3,
                                timeout=30)
        go.touch()
        assert await waiting == "127.0.0.1:1"
        assert spawns == []


def test_a_daemon_start_tells_its_pid_and_returns_at_once_under_uvloop(tmp_path: pathlib.Path) -> None:
    """The hosts run on uvloop: the start returns when its shell has, with the daemon's pid
    (the one that then serves), while that daemon runs (a pipe the daemon inherited once made
    the start wait for the daemon's exit, 60 s idle later)."""
    import uvloop

    from sandbox_host.daemon import _procs

    async def main() -> tuple[int | None, bool, int]:
        host = LocalProvider(str(tmp_path / "sandboxes"), str(tmp_path / "journals"), idle_check=0.05, sandbox_io="daemon")
        host._daemons.forkserver = False  # the start as a command (the fallback) is what is tested
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
