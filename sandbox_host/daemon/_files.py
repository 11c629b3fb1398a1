"""Reading and following a sandbox's files from the inside (the daemon's file I/O adapter).

A follow reads from an offset to the end, then waits for an inotify wake-up (one instance per
daemon, :class:`sandbox_host.providers._inotify.FileWatcher`) or :data:`WATCHED_RECHECK`
seconds (where inotify is unavailable: polls every ``idle_check``, at most 20 ms), and reads
on; a file deleted (no link left) ends it with ``FileNotFoundError`` after its last bytes.
"""
from __future__ import annotations

import asyncio
import os
from typing import AsyncIterator

from sandbox_host.providers._inotify import FileWatcher

#: Bytes read (and sent) at once; under gRPC's default 4 MiB message limit.
CHUNK = 1 << 20
#: A read of at most this many bytes (the file's size then, less the position) runs on the
#: loop: a copy from the page cache of a few microseconds, where a worker thread's hand-off
#: costs tens (a followed journal grows by a line or a few at each wake-up).
INLINE = 64 << 10
#: Seconds a follow with an inotify watch waits before it looks at the file anyway (at least
#: ``idle_check``): a safety net only, as the watch wakes it at every write and at the file's
#: unlink (``IN_ATTRIB``). At the hosts' 0.25 s, an idle follow's four looks a second were
#: half of a local daemon's CPU while its run streamed (~1 of 2 ms a second; 200 runs run
#: 200 daemons).
WATCHED_RECHECK = 2.0


async def follow_file(path: str, offset: int, watcher: FileWatcher, idle_check: float,
                      *, follow: bool = True, limit: int = 0) -> AsyncIterator[bytes]:
    """Yield the file's bytes from ``offset``; with ``follow`` as they are written (never ends
    by itself), else up to its end (or ``limit`` bytes when > 0).

    Raises:
        FileNotFoundError: the file does not exist, or (following) was deleted, after
            everything written to it was yielded.
        IsADirectoryError: ``path`` is a directory.
    """
    # Long reads run in a worker thread: a catch-up over a long journal reads megabytes. Such
    # a read is shielded and awaited before the file is closed, so a cancelled follow never
    # closes the file under a read still running in its thread. open, fstat and short reads
    # (at most INLINE bytes) stay inline.
    loop = asyncio.get_running_loop()
    f = open(path, "rb")  # noqa: ASYNC230 -- metadata only, see above
    watch = watcher.watch(path) if follow else None
    reading: asyncio.Future[bytes] | None = None
    left = limit if limit > 0 and not follow else -1

    def start(n: int) -> None:
        nonlocal reading
        reading = loop.run_in_executor(None, f.read, n)

    async def read(n: int) -> bytes:
        # The read already started (read ahead below), a short one, or a new long one.
        nonlocal reading
        if reading is None:
            if os.fstat(f.fileno()).st_size - f.tell() <= INLINE:
                return f.read(min(n, INLINE))
            start(n)
        assert reading is not None
        data = await asyncio.shield(reading)
        reading = None
        return data

    try:
        f.seek(offset)
        while True:
            want = CHUNK if left < 0 else min(CHUNK, left)
            data = await read(want)
            if data:
                if left > 0:
                    left -= len(data)
                if len(data) == want and left != 0:
                    # A full chunk: more is likely there. The next read runs in its thread
                    # while this chunk is sent (a catch-up overlaps disk and network).
                    start(CHUNK if left < 0 else min(CHUNK, left))
                yield data
                if left == 0:
                    return
                continue
            if not follow:
                return
            if watch is not None:
                await watch.wait(max(idle_check, WATCHED_RECHECK))
            else:
                await asyncio.sleep(min(idle_check, 0.02))
            if os.fstat(f.fileno()).st_nlink == 0:
                while rest := await read(CHUNK):
                    yield rest
                raise FileNotFoundError(path)
    finally:
        if watch is not None:
            watch.close()
        if reading is not None:
            await asyncio.wait({reading})
            if not reading.cancelled():
                reading.exception()  # retrieved: the follow is ending anyway
        f.close()


def write_whole(target: str, content: bytes, mode: int) -> None:
    """Write ``target`` whole: a temporary name beside it, then a rename (blocking)."""
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    tmp = f"{target}.tmp-{os.urandom(4).hex()}"
    with open(tmp, "wb") as f:
        f.write(content)
    os.chmod(tmp, mode)
    os.replace(tmp, target)


__all__ = ["CHUNK", "follow_file", "write_whole"]
