"""Reading and following a sandbox's files from the inside (the daemon's file I/O adapter).

A follow reads from an offset to the end, then waits for an inotify wake-up (one instance per
daemon, :class:`sandbox_host.providers._inotify.FileWatcher`) or :data:`WATCHED_RECHECK`
seconds (where inotify is unavailable: polls every ``idle_check``, at most 20 ms), and reads
on; a file deleted (no link left) ends it with ``FileNotFoundError`` after its last bytes.
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
from typing import AsyncGenerator

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


def open_regular(path: str, *, no_link: bool = False, append: bool = False, create: bool = False) -> int:
    """A read-only descriptor of the regular file at ``path`` (``append``: write-only,
    appending; ``create``: made empty when missing), opened without ever waiting: ``O_NONBLOCK``, so a FIFO put there does not
    hold the ``open`` until a writer (or reader) comes (nor a file under another process's
    lease until it breaks), and no effect on a regular file's reads and writes. With
    ``no_link``, the file at ``path`` itself, never what a symbolic link there points to
    (``O_NOFOLLOW``). One ``open`` and one ``fstat``.

    Raises:
        FileNotFoundError: nothing is at ``path``.
        IsADirectoryError: ``path`` is a directory.
        PermissionError: ``path`` is a symbolic link (``no_link``), not a regular file (a
            FIFO, a socket, a device), under a lease, or unreadable.
    """
    access, done = (os.O_WRONLY | os.O_APPEND, "written") if append else (os.O_RDONLY, "read")
    flags = access | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_NOFOLLOW if no_link else 0) | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP and no_link:
            raise PermissionError(f"{path} is a symbolic link: not {done}") from None
        if exc.errno == errno.ENXIO:  # a socket, or a FIFO nobody reads (written)
            raise PermissionError(f"{path} is not a regular file: not {done}") from None
        if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
            raise PermissionError(f"{path} is leased by another process: not {done}") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(path)
        raise PermissionError(f"{path} is not a regular file: not {done}")
    return fd


def size_at_least(path: str, end: int, *, follow_links: bool = True) -> int:
    """The size in bytes of the file at ``path``, at least ``end`` (the end of what was read
    from it: a file replaced or truncated meanwhile says no less). ``follow_links=False``:
    a symbolic link put at ``path`` tells its own size, not its target's."""
    try:
        return max(os.stat(path, follow_symlinks=follow_links).st_size, end)
    except OSError:
        return end


async def follow_file(path: str, offset: int, watcher: FileWatcher, idle_check: float,
                      *, follow: bool = True, limit: int = 0, no_link: bool = False) -> AsyncGenerator[bytes, None]:
    """Yield the file's bytes from ``offset``; with ``follow`` as they are written (never ends
    by itself), else up to its end (or ``limit`` bytes when > 0). Only a regular file is
    read, and with ``no_link`` not through a symbolic link (:func:`open_regular`). The inotify
    watch is on the file opened (``/proc/self/fd/<fd>``), not on whatever ``path`` names by
    the time it is added.

    Raises:
        FileNotFoundError: the file does not exist, or (following) was deleted, after
            everything written to it was yielded.
        IsADirectoryError: ``path`` is a directory.
        PermissionError: see :func:`open_regular`.
    """
    # Long reads run in a worker thread: a catch-up over a long journal reads megabytes. Such
    # a read is shielded and awaited before the file is closed, so a cancelled follow never
    # closes the file under a read still running in its thread. open, fstat and short reads
    # (at most INLINE bytes) stay inline.
    loop = asyncio.get_running_loop()
    f = open(path, "rb", opener=lambda p, _flags: open_regular(p, no_link=no_link))  # noqa: ASYNC230 -- metadata only, see above
    watch = watcher.watch(_opened(f.fileno(), path)) if follow else None
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


def _opened(fd: int, path: str) -> str:
    """A path naming the file descriptor ``fd`` has open (``/proc/self/fd/<fd>``: inotify
    resolves it to that inode), else ``path`` where ``/proc`` is not mounted."""
    own = f"/proc/self/fd/{fd}"
    return own if os.path.exists(own) else path


def write_whole(target: str, content: bytes, mode: int) -> None:
    """Write ``target`` whole: a temporary name beside it, then a rename (blocking); the
    temporary file goes when the rename fails (``target`` a directory, say)."""
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    tmp = f"{target}.tmp-{os.urandom(4).hex()}"
    try:
        with open(tmp, "xb") as f:
            f.write(content)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


__all__ = ["CHUNK", "follow_file", "open_regular", "size_at_least", "write_whole"]
