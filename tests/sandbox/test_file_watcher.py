"""The provider's one inotify instance: every follow's wake-ups, no instance while idle."""
from __future__ import annotations

import asyncio
import pathlib

import pytest

from sandbox_host.providers._inotify import FileWatcher, libc

pytestmark = pytest.mark.skipif(libc() is None, reason="no C library to reach inotify")


async def _woken(w: object, timeout: float = 5.0) -> bool:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await w.wait(timeout)  # type: ignore[attr-defined]
    return loop.time() - t0 < timeout


async def test_watches_share_one_instance_and_wake_for_their_own_file(tmp_path: pathlib.Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(b"")
    b.write_bytes(b"")
    fw = FileWatcher()
    wa, wa2, wb = fw.watch(str(a)), fw.watch(str(a)), fw.watch(str(b))
    assert wa is not None and wa2 is not None and wb is not None
    fd = fw._fd
    assert fd is not None and wa.wd == wa2.wd != wb.wd
    with a.open("ab") as f:
        f.write(b"{}\n")
    assert await _woken(wa) and await _woken(wa2)
    assert not await _woken(wb, timeout=0.2)  # b did not change
    wa.close()
    wa.close()  # idempotent
    with a.open("ab") as f:
        f.write(b"{}\n")
    assert await _woken(wa2)  # the shared wd stays for the other watch of the same file
    wa2.close()
    assert fw._fd == fd  # b's watch still holds the instance
    wb.close()
    assert fw._fd is None and fw._watches == {}  # idle: no descriptor held
    w = fw.watch(str(tmp_path / "missing"))
    assert w is None and fw._fd is None
