"""Wake-ups when followed files change: one inotify instance for all of a provider's follows.

Linux inotify through libc (no extra dependency). One instance per provider (per event
loop), holding one watch per followed file, rather than one instance per follow: the
kernel tears every inotify instance down when a process dies, each teardown waits for an
RCU grace period, and a dying host closes its sockets only after them. With an instance
per followed journal, a SIGKILLed host driving 10 runs kept its keep-alive connection to
the coordinator open for 60-170 ms more, the start of every takeover; with
one instance the extra wait is that of one teardown.
"""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import functools
import logging
import os
import struct
import time

log = logging.getLogger(__name__)

_IN_MODIFY = 0x002
_IN_ATTRIB = 0x004
_IN_CLOSE_WRITE = 0x008
_IN_MOVE_SELF = 0x800
_IN_DELETE_SELF = 0x400
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_MASK = _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVE_SELF | _IN_DELETE_SELF
#: ``struct inotify_event`` without its name: wd, mask, cookie, name length.
_EVENT = struct.Struct("iIII")
#: Seconds between two warnings that a follow polls for want of inotify (per process).
WARN_EVERY = 60.0
_warned_at: float | None = None
#: The kernel limit behind a refusal, by errno (inotify(7), "/proc interfaces").
_LIMITS = {
    errno.EMFILE: "fs.inotify.max_user_instances (instances per user, 128 by default) or the "
                  "process's open-file limit",
    errno.ENOSPC: "fs.inotify.max_user_watches (watches per user)",
    errno.ENFILE: "the system's open-file limit",
    errno.ENOMEM: "kernel memory",
}


def _warn_polling(call: str, err: int, path: str | None = None) -> None:
    """Log, at most every :data:`WARN_EVERY` seconds per process, that a follow polls
    because ``call`` was refused: each such follow then looks at its file up to 50 times a
    second (:mod:`sandbox_host.daemon._files`), so a machine past the limit spends its CPU
    there. Refused silently, 200 local sandboxes' daemons following at once against 128
    instances per user left some 70 polling so; a docker host's containers share root's
    instances alike."""
    global _warned_at
    now = time.monotonic()
    if _warned_at is not None and now - _warned_at < WARN_EVERY:
        return
    _warned_at = now
    limit = _LIMITS.get(err)
    log.warning("inotify refused (%s: %s)%s; followed files are polled instead%s", call,
                os.strerror(err), f" for {path[:200]!r}" if path else "", f": raise {limit}" if limit else "")


@functools.cache
def libc() -> ctypes.CDLL | None:
    """The C library, loaded once per process; ``None`` where none is found.

    ``ctypes.util.find_library`` runs ``ldconfig -p`` in a subprocess and parses its
    output: done at every follow, on the event loop, it held a host's loop for tens of ms
    per takeover.
    """
    name = ctypes.util.find_library("c")
    return None if name is None else ctypes.CDLL(name, use_errno=True)


class Watch:
    """Wake-ups for one followed file: :meth:`wait`, then :meth:`close` (idempotent)."""

    def __init__(self, watcher: "FileWatcher", wd: int) -> None:
        self._watcher = watcher
        self.wd = wd
        self._event = asyncio.Event()
        self._closed = False

    def _fire(self) -> None:
        self._event.set()

    async def wait(self, timeout: float) -> None:
        """Return after a change or ``timeout`` seconds, whichever is first."""
        try:
            async with asyncio.timeout(timeout):  # not wait_for: it can swallow a cancel on 3.11
                await self._event.wait()
        except TimeoutError:
            pass
        self._event.clear()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._watcher._release(self)


class FileWatcher:
    """The one inotify instance of its owner, opened at the first watch and closed when the
    last watch is closed (so an idle owner holds no descriptor)."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watches: dict[int, set[Watch]] = {}

    def watch(self, path: str) -> Watch | None:
        """A watch on ``path``, or ``None`` where inotify is unavailable (then poll)."""
        c = libc()
        if c is None:
            return None
        loop = asyncio.get_running_loop()
        if self._fd is not None and self._loop is not loop:
            return None  # another loop owns the instance (tests): poll rather than share it
        if self._fd is None:
            fd = c.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
            if fd < 0:
                err = ctypes.get_errno()
                if err in _LIMITS:
                    _warn_polling("inotify_init1", err)
                return None
            self._fd, self._loop = fd, loop
            loop.add_reader(fd, self._on_readable)
        wd = c.inotify_add_watch(self._fd, os.fsencode(path), _MASK)
        if wd < 0:
            err = ctypes.get_errno()
            if err in _LIMITS:  # a limit to raise; not a file gone or swapped (its read says so)
                _warn_polling("inotify_add_watch", err, path)
            self._close_if_idle()
            return None
        # The same file watched twice gets the same wd: both watches wake, and the wd is
        # removed with the last of them.
        w = Watch(self, wd)
        self._watches.setdefault(wd, set()).add(w)
        return w

    def _on_readable(self) -> None:
        assert self._fd is not None
        woken: set[int] = set()
        try:
            while data := os.read(self._fd, 65536):
                off = 0
                while off + _EVENT.size <= len(data):
                    wd, _mask, _cookie, length = _EVENT.unpack_from(data, off)
                    off += _EVENT.size + length
                    woken.add(wd)
        except BlockingIOError:
            pass
        if -1 in woken:  # IN_Q_OVERFLOW: events were lost, so every follow looks
            woken = set(self._watches)
        for wd in woken:
            for w in self._watches.get(wd, ()):
                w._fire()

    def _release(self, w: Watch) -> None:
        ws = self._watches.get(w.wd)
        if ws is None:
            return
        ws.discard(w)
        if not ws:
            del self._watches[w.wd]
            c = libc()
            if c is not None and self._fd is not None:
                c.inotify_rm_watch(self._fd, w.wd)  # fails harmlessly when the file is gone
        self._close_if_idle()

    def _close_if_idle(self) -> None:
        if self._watches or self._fd is None:
            return
        fd, loop, self._fd, self._loop = self._fd, self._loop, None, None
        if loop is not None and not loop.is_closed():
            loop.remove_reader(fd)
        os.close(fd)
