"""The daemon's file reads (sandbox_host/daemon/_files.py): offsets and limits across the
chunks it reads ahead, a follow closed while a read-ahead is in flight, and the allocator
setting the daemon and host start with."""
from __future__ import annotations

import asyncio
import os
import pathlib

import pytest

from baton.malloc_tuning import retain_freed_memory
from sandbox_host.daemon._files import CHUNK, follow_file
from sandbox_host.providers._inotify import FileWatcher

pytestmark = pytest.mark.servers  # the follow's inotify looks up libc with ldconfig

_CONTENT = os.urandom(3 * CHUNK + 12345)


@pytest.mark.parametrize("offset, limit", [(0, 0), (7, 0), (CHUNK, 0), (CHUNK - 1, CHUNK + 2), (5, CHUNK),
                                           (0, 2 * CHUNK), (len(_CONTENT) - 3, 10), (len(_CONTENT), 0)])
async def test_read_to_end_or_limit(tmp_path: pathlib.Path, offset: int, limit: int) -> None:
    path = tmp_path / "f"
    path.write_bytes(_CONTENT)
    got = [d async for d in follow_file(str(path), offset, FileWatcher(), 0.25, follow=False, limit=limit)]
    want = _CONTENT[offset:offset + limit] if limit else _CONTENT[offset:]
    assert b"".join(got) == want
    assert all(0 < len(d) <= CHUNK for d in got)


async def test_follow_sees_appends_after_a_catch_up(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(_CONTENT)
    watcher = FileWatcher()
    stream = follow_file(str(path), 3, watcher, 0.05)
    got = bytearray()
    try:
        async for data in stream:
            got += data
            if len(got) == len(_CONTENT) - 3:
                with path.open("ab") as f:
                    f.write(b"tail\n")
            if len(got) == len(_CONTENT) + 2:
                break
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    assert bytes(got) == _CONTENT[3:] + b"tail\n"


async def test_closed_while_reading_ahead(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(_CONTENT)
    watcher = FileWatcher()
    stream = follow_file(str(path), 0, watcher, 0.25)
    first = await stream.__anext__()  # type: ignore[attr-defined]
    assert first == _CONTENT[:CHUNK]
    await asyncio.wait_for(stream.aclose(), 30)  # type: ignore[attr-defined]  # the read-ahead is awaited


def test_retain_freed_memory_on_glibc() -> None:
    assert retain_freed_memory() is (os.confstr("CS_GNU_LIBC_VERSION") is not None)
