"""A command run to its end inside a sandbox (a workspace's setup command): the adapter of the
daemon's ``Exec`` call.

The command runs in a session and process group of its own, with no stdin, its stdout and
stderr into one pipe of which only the last bytes are kept (older output is counted and
dropped as it comes: bounded memory whatever it prints). At the timeout, or when the caller
goes away (the call is cancelled), the whole group gets SIGKILL before the answer (or the
cancel) goes on. A command that ends on its own may leave a process it started in the
background (a service the agent needs): its group is not killed then, and its output is
read for :data:`DRAIN_SECONDS` at most after the command ended (a background process may
hold the pipe open for ever).
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass
from typing import Mapping, Sequence

from sandbox_host.providers._redact import REDACTED, redact

#: Seconds a command may run at most (a request's 0 means this).
MAX_TIMEOUT = 3600.0
#: Bytes of output kept by default, and at most.
DEFAULT_LIMIT = 64 << 10
MAX_LIMIT = 1 << 20
#: Seconds the output is still read after the command ended (see the module docstring).
DRAIN_SECONDS = 2.0
_READ = 1 << 16


@dataclass(frozen=True)
class ExecResult:
    """How a command ended.

    Attributes:
        exit_code: its exit status; ``-N`` when signal ``N`` ended it.
        timed_out: it was killed at its timeout.
        output: the last bytes of its output (stdout and stderr as they interleaved).
        output_bytes: bytes of output it wrote in all.
    """

    exit_code: int
    timed_out: bool
    output: bytes
    output_bytes: int


class Tail:
    """The last ``limit`` bytes of a stream, and how many went by (pure)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        self._buf = bytearray()

    def add(self, data: bytes) -> None:
        """Take ``data`` in, dropping what falls out of the last ``limit`` bytes."""
        self.total += len(data)
        self._buf += data[-self.limit:] if self.limit else b""
        if len(self._buf) > self.limit:
            del self._buf[:len(self._buf) - self.limit]

    def value(self) -> bytes:
        """The bytes kept."""
        return bytes(self._buf)


def redacted_tail(data: bytes, secrets: Mapping[str, str], *, cut: bool, limit: int) -> bytes:
    """The last ``limit`` bytes of output ``data`` with every secret redacted (pure).

    Args:
        data: the output kept (:class:`Tail`), ``limit`` bytes plus a margin as long as the
            longest secret, so that redacting leaves ``limit`` bytes to show.
        secrets: name → value.
        cut: whether ``data`` is a tail (earlier output was dropped): then it may begin
            inside a secret, and a beginning that ends a secret is redacted too.
        limit: bytes to return at most.
    """
    text = redact(data.decode("utf-8", "replace"), secrets)
    if cut:
        for value in sorted({v for v in secrets.values() if v}, key=len, reverse=True):
            for k in range(len(value) - 1, 0, -1):
                if text.startswith(value[-k:]):
                    text = REDACTED + text[k:]
                    break
    return text.encode()[-limit:]


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def _read(stream: asyncio.StreamReader, tail: Tail) -> None:
    while data := await stream.read(_READ):
        tail.add(data)


async def run(argv: Sequence[str], *, cwd: str, env: Mapping[str, str], timeout: float,  # noqa: ASYNC109 -- the command's own bound, not the call's
              limit: int) -> ExecResult:
    """Run ``argv`` to its end (see the module docstring).

    Args:
        argv: the command (not empty).
        cwd: its working directory.
        env: its whole environment.
        timeout: seconds before its group is killed.
        limit: bytes of output kept (its tail).

    Returns:
        How it ended.

    Raises:
        OSError: it could not start (no such program, ``cwd`` missing).
    """
    # A pipe of our own (not the subprocess transport's): it can be closed under a process
    # the command left in the background that still holds its other end.
    r, w = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, env=dict(env), stdin=asyncio.subprocess.DEVNULL, stdout=w, stderr=w,
            start_new_session=True)
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    stream = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    try:
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stream),
                                                    os.fdopen(r, "rb", buffering=0))
    except BaseException:
        _kill_group(proc.pid)
        await asyncio.shield(proc.wait())
        raise
    tail = Tail(limit)
    reader = asyncio.ensure_future(_read(stream, tail))
    timed_out = False
    try:
        try:
            async with asyncio.timeout(timeout):
                await proc.wait()
        except TimeoutError:
            timed_out = True
            _kill_group(proc.pid)
            await proc.wait()
        await asyncio.wait([reader], timeout=DRAIN_SECONDS)
    except BaseException:
        # The caller went away (or reading failed): nothing of the command may run on.
        _kill_group(proc.pid)
        if proc.returncode is None:
            await asyncio.shield(proc.wait())
        raise
    finally:
        reader.cancel()
        transport.close()
        await asyncio.wait([reader])
        if not reader.cancelled():
            reader.exception()  # retrieved: a pipe that failed only shortens the tail
    assert proc.returncode is not None
    return ExecResult(proc.returncode, timed_out, tail.value(), tail.total)


__all__ = ["DEFAULT_LIMIT", "DRAIN_SECONDS", "ExecResult", "MAX_LIMIT", "MAX_TIMEOUT", "Tail", "redacted_tail", "run"]
