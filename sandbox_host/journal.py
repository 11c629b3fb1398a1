"""Journals: file names, the exit sentinel, following a journal, and the attach preflight.

docs/design.md §5.2. An agent's stdout is redirected (never piped) into
``<journal_dir>/<file stem of the run id>.ndjson`` and its stderr into ``….err``; the launch
wrapper (:mod:`sandbox_host._wrapper`) appends ``{"__exit": <code>, "__nonce": "<nonce>"}``
when the agent ends. The nonce is made here, handed to the wrapper out of band, and never
reaches the agent, so an agent cannot forge the end of its own journal.

An agent process relaunched in the same run (:mod:`sandbox_host.agent_resume`: it died while
its turn waited for an answer, and goes on with ``--resume``) appends to the same journal: its
wrapper first writes ``{"__resume": <attempt>, "__nonce": "<nonce>", "inbox": "<path>"}``
(:class:`JournalResume`), so a sentinel followed by that marker is an agent process that
ended and was resumed, not the journal's end. Same nonce, so the agent cannot forge it either.

:func:`follow_journal` turns bytes from a provider into complete lines with absolute byte
offsets. It never parses JSON (translators do) and never repairs a trailing fragment
(journal-formats.md §0.3): at final EOF the fragment is reported as
:class:`JournalTruncated`.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import AsyncGenerator, AsyncIterator, Awaitable, Callable, Union

from baton.errors import JournalAttachUnavailable, JournalError
from baton.ids import file_stem
from baton.runs import TERMINAL
from sandbox_host.providers._base import Chunk, Provider, SandboxHandle

log = logging.getLogger(__name__)

JOURNAL_SUFFIX = ".ndjson"
STDERR_SUFFIX = ".err"

_SENTINEL_MARK = b'{"__exit":'
_SENTINEL_RE = re.compile(rb'\{"__exit":\s*(-?\d+),\s*"__nonce":\s*"([0-9a-f]+)"\}')
_RESUME_MARK = b'{"__resume":'
_RESUME_RE = re.compile(rb'\{"__resume":\s*(\d+),\s*"__nonce":\s*"([0-9a-f]+)",\s*"inbox":\s*"([^"\\]*)"\}')


def journal_path(journal_dir: str, run_id: str) -> str:
    """The journal file of a run: ``<journal_dir>/<file_stem(run_id)>.ndjson``.

    The stem (:func:`baton.ids.file_stem`) is injective and shell-safe.
    """
    return os.path.join(journal_dir, file_stem(run_id) + JOURNAL_SUFFIX)


def stderr_path(journal_dir: str, run_id: str) -> str:
    """The agent's stderr file beside its journal: ``<journal_dir>/<stem>.err``."""
    return os.path.join(journal_dir, file_stem(run_id) + STDERR_SUFFIX)


def new_nonce() -> str:
    """A fresh exit-sentinel nonce: 128 random bits as 32 lower-case hex characters."""
    return secrets.token_hex(16)


def exit_sentinel(code: int, nonce: str) -> bytes:
    """The sentinel line (with its ``\\n``) the wrapper appends when the agent exits."""
    return json.dumps({"__exit": code, "__nonce": nonce}, separators=(",", ":")).encode() + b"\n"


def parse_sentinel(data: bytes, nonce: str) -> int | None:
    """The exit code when ``data`` (one line, no ``\\n``) is the sentinel with ``nonce``.

    A sentinel with any other nonce is an ordinary journal line (forged or foreign): the
    caller passes it on to the translator, which reports it and does not obey it.
    """
    m = _SENTINEL_RE.fullmatch(data)
    if m is None or not secrets.compare_digest(m.group(2), nonce.encode()):
        return None
    return int(m.group(1))


@dataclass(frozen=True)
class JournalLine:
    """One complete journal line.

    Attributes:
        offset: byte offset of its first byte in the journal.
        end: byte offset just past its ``\\n`` (where the next line starts).
        data: the line without ``\\n`` and without trailing ``\\r`` (raw bytes; may be
            invalid UTF-8 or longer than 1 MiB).
    """

    offset: int
    end: int
    data: bytes


#: A journal line longer than this (bytes, without its ``\n``) is never held whole: it
#: comes out as a :class:`JournalOversized` (its head and tail kept), which the translator
#: reports instead of parsing. Sandboxed code can write the journal, and a line of many GiB
#: with no ``\n`` held whole would take down the host, then every host that takes the run
#: over and replays it. 32 times the largest tool result a chunk carries
#: (``translate._base.MAX_RESULT_BYTES``), so no line the translator could use whole is
#: cut. A constant, not a setting: hosts must split one journal alike (a replay that
#: differs from the stored chunks stops the run).
MAX_LINE_BYTES = 16 << 20
#: Bytes kept of an oversized line's start (reported) and its end (where the wrapper's exit
#: sentinel lands when the agent was killed mid-line).
OVERSIZED_HEAD = 4096
OVERSIZED_TAIL = 512
#: Bytes of the journal read at a time when not following it (at the end of a run, or from a
#: provider that cannot follow): the rest of a journal written faster than it was followed
#: is not read whole.
READ_LIMIT = 1 << 20


@dataclass(frozen=True)
class JournalOversized(JournalLine):
    """A journal line longer than :data:`MAX_LINE_BYTES`, not held whole.

    Attributes:
        data: its first :data:`OVERSIZED_HEAD` bytes.
        size: its length in bytes (without ``\n``).
        tail: its last :data:`OVERSIZED_TAIL` bytes.
    """

    size: int
    tail: bytes


@dataclass(frozen=True)
class JournalExit:
    """The wrapper's exit sentinel (right nonce): the agent ended with ``code``.

    Attributes:
        code: the agent's exit status (128+N when killed by signal N, as the shell reports).
        offset: byte offset of the sentinel.
        end: byte offset past it (the journal's end).
    """

    code: int
    offset: int
    end: int


@dataclass(frozen=True)
class JournalResume:
    """The marker a relaunched agent's wrapper writes before the agent starts (right nonce).

    Attributes:
        attempt: the agent process's number in this run (2 for the first relaunch).
        inbox: the relaunched process's inbox path in the sandbox ("" = none).
        offset: byte offset of the marker.
        end: byte offset past it.
    """

    attempt: int
    inbox: str
    offset: int
    end: int


def parse_resume(data: bytes, nonce: str) -> tuple[int, str] | None:
    """``(attempt, inbox)`` when ``data`` (one line, no ``\\n``) is a resume marker with
    ``nonce``; a marker with any other nonce is an ordinary line (forged or foreign)."""
    m = _RESUME_RE.fullmatch(data)
    if m is None or not secrets.compare_digest(m.group(2), nonce.encode()):
        return None
    return int(m.group(1)), m.group(3).decode("utf-8", "replace")


def nonce_file_text(nonce: str, attempt: int = 1) -> str:
    """What a launch writes to the wrapper's nonce file: the nonce, and for a relaunched
    agent process (``attempt`` > 1) its number, which makes the wrapper write the
    :class:`JournalResume` marker first."""
    return nonce if attempt <= 1 else f"{nonce} {attempt}"


@dataclass(frozen=True)
class JournalTruncated:
    """A trailing fragment without ``\\n`` at final EOF (reported, never repaired).

    Attributes:
        offset: byte offset of the fragment.
        data: its bytes (of one longer than :data:`MAX_LINE_BYTES`, its first
            :data:`OVERSIZED_HEAD`).
        size: its length in bytes (``-1``: ``len(data)``).
    """

    offset: int
    data: bytes
    size: int = field(default=-1, compare=False)  # (one fragment, however it was told)

    @property
    def length(self) -> int:
        """The fragment's length in bytes."""
        return len(self.data) if self.size < 0 else self.size


JournalItem = Union[JournalLine, JournalExit, JournalTruncated, JournalResume]


class JournalDeleted(JournalError):
    """The journal file disappeared while it was being followed.

    Attributes:
        path: the journal's path in the sandbox.
        offset: bytes consumed before it went away.
    """

    def __init__(self, path: str, offset: int) -> None:
        self.path = path
        self.offset = offset
        super().__init__(f"journal {path!r} disappeared after {offset} bytes")


class LineSplitter:
    """Split a byte stream into complete lines with absolute offsets (pure, no I/O).

    Searches only the newly added bytes for ``\\n``, so a line of many MiB arriving in
    small reads costs linear time. Lines are never decoded here: a UTF-8 character split
    across two reads is joined before anyone decodes it.

    A line longer than :data:`MAX_LINE_BYTES` is never held whole: once its bytes pass the
    limit only its first :data:`OVERSIZED_HEAD` and last :data:`OVERSIZED_TAIL` bytes are
    kept, and it comes out as a :class:`JournalOversized` when its ``\\n`` does, whatever
    the reads' sizes were (so a replay on another host sees the same item).
    """

    def __init__(self, offset: int = 0) -> None:
        self._buf = bytearray()
        self._start = offset  # absolute offset of _buf[0] (of the oversized line, when skipping)
        self._scan = 0  # bytes of _buf already known to hold no "\n"
        self._skipped = 0  # bytes of an oversized line seen so far (0: not in one)
        self._head = b""
        self._tail = b""

    @property
    def consumed(self) -> int:
        """Absolute offset just past the last complete line."""
        return self._start

    @property
    def pending(self) -> bytes:
        """The bytes after the last complete line (a fragment, possibly empty; of an
        oversized fragment, its first :data:`OVERSIZED_HEAD` bytes)."""
        return self._head if self._skipped else bytes(self._buf)

    @property
    def pending_size(self) -> int:
        """The length in bytes of the fragment after the last complete line."""
        return self._skipped or len(self._buf)

    def feed(self, data: bytes) -> list[JournalLine]:
        """Add bytes; return the lines they complete, in order (a :class:`JournalOversized`
        for each longer than :data:`MAX_LINE_BYTES`)."""
        out: list[JournalLine] = []
        if self._skipped:
            nl = data.find(b"\n")
            if nl < 0:
                self._skipped += len(data)
                self._tail = (self._tail + data[-OVERSIZED_TAIL:])[-OVERSIZED_TAIL:]
                return out
            size = self._skipped + nl
            tail = (self._tail + data[max(0, nl - OVERSIZED_TAIL):nl])[-OVERSIZED_TAIL:]
            out.append(JournalOversized(self._start, self._start + size + 1, self._head, size, tail))
            self._start += size + 1
            self._skipped, self._head, self._tail = 0, b"", b""
            data = data[nl + 1:]
        self._buf += data
        pos = 0
        while True:
            nl = self._buf.find(b"\n", max(pos, self._scan))
            if nl < 0:
                break
            if nl - pos > MAX_LINE_BYTES:
                out.append(JournalOversized(self._start + pos, self._start + nl + 1, bytes(self._buf[pos:pos + OVERSIZED_HEAD]),
                                            nl - pos, bytes(self._buf[max(pos, nl - OVERSIZED_TAIL):nl])))
            else:
                raw = bytes(self._buf[pos:nl])
                if raw.endswith(b"\r"):
                    raw = raw.rstrip(b"\r")
                out.append(JournalLine(self._start + pos, self._start + nl + 1, raw))
            pos = nl + 1
        if pos:
            del self._buf[:pos]
            self._start += pos
        if len(self._buf) > MAX_LINE_BYTES:  # a line past the limit, its end not read yet
            self._skipped = len(self._buf)
            self._head = bytes(self._buf[:OVERSIZED_HEAD])
            self._tail = bytes(self._buf[-OVERSIZED_TAIL:])
            self._buf = bytearray()
        self._scan = len(self._buf)
        return out


def _classify(line: JournalLine, nonce: str) -> list[JournalItem]:
    """Recognise the sentinel (only with the right nonce), also when glued to a fragment.

    When the agent was killed mid-line, the wrapper's sentinel lands right after the
    fragment on the same physical line: the fragment is reported as truncated and the
    sentinel still counts.
    """
    if isinstance(line, JournalOversized):
        tail = line.tail.rstrip(b"\r")  # as a line held whole is stripped
        cut = tail.rfind(_SENTINEL_MARK)
        code = parse_sentinel(tail[cut:], nonce) if cut >= 0 else None
        if code is None:
            return [line]
        at = line.offset + line.size - (len(line.tail) - cut)  # where the sentinel starts
        return [JournalTruncated(line.offset, line.data, at - line.offset), JournalExit(code, at, line.end)]
    if line.data.startswith(_RESUME_MARK):
        resumed = parse_resume(line.data, nonce)
        if resumed is not None:
            return [JournalResume(resumed[0], resumed[1], line.offset, line.end)]
    if _SENTINEL_MARK not in line.data:
        return [line]
    code = parse_sentinel(line.data, nonce)
    if code is not None:
        return [JournalExit(code, line.offset, line.end)]
    cut = line.data.rfind(_SENTINEL_MARK)
    if cut > 0:
        code = parse_sentinel(line.data[cut:], nonce)
        if code is not None:
            return [
                JournalTruncated(line.offset, line.data[:cut]),
                JournalExit(code, line.offset + cut, line.end),
            ]
    return [line]


async def read_journal(provider: Provider, handle: SandboxHandle, path: str, nonce: str) -> AsyncIterator[JournalItem]:
    """The journal's items from byte 0 to its size when asked, read :data:`READ_LIMIT`
    bytes at a time (never held whole), without following it (a process the agent left
    behind may write on: not past that size); a trailing fragment is left out.

    Raises:
        FileNotFoundError: the journal does not exist.
    """
    end = await provider.file_size(handle, path)
    if end is None:
        raise FileNotFoundError(path)
    splitter = LineSplitter()
    pos = 0
    while pos < end and (data := await provider.read_file(handle, path, pos, min(READ_LIMIT, end - pos))):
        pos += len(data)
        for item in _items(splitter, data, nonce):
            yield item


def _items(splitter: LineSplitter, data: bytes, nonce: str) -> list[JournalItem]:
    """The journal items the bytes ``data`` complete, fed to ``splitter``."""
    out: list[JournalItem] = []
    for line in splitter.feed(data):
        out.extend(_classify(line, nonce))
    return out


async def _next_chunk(stream: AsyncIterator[Chunk]) -> Chunk:
    return await stream.__anext__()


async def _discard(fut: "asyncio.Future[Chunk]") -> None:
    """Cancel our own pending read and wait for it to settle.

    ``asyncio.wait`` does not raise the future's outcome, so only a cancellation of the
    caller itself propagates from here; the read's exception is retrieved so it is not
    reported as never retrieved.
    """
    fut.cancel()
    await asyncio.wait({fut})
    if not fut.cancelled():
        fut.exception()


async def follow_journal(
    provider: Provider,
    handle: SandboxHandle,
    path: str,
    *,
    offset: int = 0,
    nonce: str,
    poll_interval: float = 0.25,
    on_lag: Callable[[int], None] | None = None,
) -> AsyncGenerator[JournalItem, None]:
    """Follow a journal from ``offset`` until its end, yielding complete lines.

    Ends after a :class:`JournalExit` (the sentinel with ``nonce``), or when the agent's
    processes are gone and the file stopped growing (then without ``JournalExit``). A
    trailing fragment at final EOF is yielded as :class:`JournalTruncated` just before the
    end. Silence alone is never the end (journal-formats.md §4.3): while a process lives,
    this waits.

    Use it as ``async with contextlib.aclosing(follow_journal(...)) as items`` so the
    pending read is cancelled when the caller stops early.

    Args:
        provider: the sandbox's provider.
        handle: the sandbox.
        path: the journal's path in the sandbox.
        offset: absolute byte offset to start from (must be a line start).
        nonce: the run's exit-sentinel nonce.
        poll_interval: seconds between liveness checks while idle, and between reads for
            providers that cannot follow.
        on_lag: called once per read that returned bytes (never per line) with the journal's
            lag: bytes written but not yet consumed (the journal's size minus the end of the
            last complete line yielded; a generator runs only when its consumer asks for
            more, so everything yielded before was consumed). The size is the one the
            follow's chunk tells (the sandbox daemon's, just after its read), else the end of
            the read: exact when the read went to the end of the file, a lower bound while a
            long follow catches up.

    Yields:
        ``JournalLine`` | ``JournalExit`` | ``JournalTruncated`` | ``JournalResume``, in file
        order (it ends at a ``JournalExit``: a relaunched agent's part of the journal is
        followed anew from the sentinel's end, see :mod:`sandbox_host.agent_resume`).

    Raises:
        JournalDeleted: the journal vanished (or never existed) while being followed.
    """
    splitter = LineSplitter(offset)
    pos = offset  # next byte to read

    def items(data: bytes, size: int = 0) -> list[JournalItem]:
        """The items ``data`` (read at ``pos``) completes; ``size``: the file's size told
        with it (0: not told; a read to the end of the file is its end)."""
        nonlocal pos
        pos += len(data)
        if on_lag is not None:
            on_lag(max(pos, size) - splitter.consumed)
        return _items(splitter, data, nonce)

    async def drain(limit: int = READ_LIMIT) -> bytes:
        try:
            return await provider.read_file(handle, path, pos, limit)
        except FileNotFoundError:
            raise JournalDeleted(path, pos) from None

    def at_eof() -> list[JournalItem]:
        frag = splitter.pending
        return [JournalTruncated(splitter.consumed, frag, splitter.pending_size)] if frag else []

    if not provider.can_follow:
        while True:
            data = await drain()
            if data:
                for it in items(data):
                    yield it
                    if isinstance(it, JournalExit):
                        return
                continue
            if not await provider.processes_alive(handle):
                data = await drain()
                if not data:
                    for it in at_eof():
                        yield it
                    return
                for it in items(data):
                    yield it
                    if isinstance(it, JournalExit):
                        return
                continue
            await asyncio.sleep(poll_interval)

    stream = provider.follow(handle, path, offset)
    pending: asyncio.Future[Chunk] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(_next_chunk(stream))
            done, _ = await asyncio.wait({pending}, timeout=poll_interval)
            if done:
                fut, pending = pending, None
                try:
                    data, _, size = fut.result()
                except StopAsyncIteration:
                    data, size = b"", 0
                    stream_ended = True
                except FileNotFoundError:
                    raise JournalDeleted(path, pos) from None
                else:
                    stream_ended = False
                if data:
                    for item in items(data, size):
                        yield item
                        if isinstance(item, JournalExit):
                            return
                    continue
                if not stream_ended:
                    continue
            # Idle (or the follow stream ended): the end is "processes gone and nothing
            # more in the file". Read the file directly, since a follow may lag.
            if await provider.processes_alive(handle):
                continue
            if pending is not None:
                await _discard(pending)
                pending = None
            # To the size it has now: a process the agent left behind (out of its group)
            # may write on, and the run's end must not wait for it.
            end = await provider.file_size(handle, path)
            if end is None:
                raise JournalDeleted(path, pos)
            while pos < end:
                data = await drain(min(READ_LIMIT, end - pos))
                if not data:
                    break
                for item in items(data):
                    yield item
                    if isinstance(item, JournalExit):
                        return
            for item in at_eof():
                yield item
            return
    finally:
        if pending is not None:
            await _discard(pending)
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


async def preflight_attach(
    run_id: str,
    *,
    status: Callable[[], Awaitable[str | None]],
    journal_size: Callable[[], Awaitable[int | None]],
    attach_wait: float = 10.0,
    poll_interval: float = 0.05,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Check that a run can be attached to (docs/design.md §5.2); return the journal's size.

    The record and the journal are read through callables, so this module stays free of
    the coordinator client and of any one provider (e.g. ``status=lambda: ...`` returning
    the record's status name, ``journal_size=lambda: provider.file_size(handle, path)``).

    Args:
        run_id: the run (for the error).
        status: the record's status name (``"running"``, ``"completed"``, …), ``None``
            when there is no record.
        journal_size: the journal's size in bytes, ``None`` while it does not exist.
        attach_wait: seconds to wait, in total, for the journal and its first byte.
        poll_interval: seconds between checks.
        clock: monotonic clock in seconds (injected for tests).

    Returns:
        The journal size (> 0) when the first byte is there.

    Raises:
        JournalAttachUnavailable: ``unknown-run`` (no record, at once), ``terminal-run``
            (at once), ``journal-timeout`` (no journal file within ``attach_wait``), or
            ``journal-stalled`` (the file exists but holds no byte within ``attach_wait``).
    """
    st = await status()
    if st is None:
        raise JournalAttachUnavailable(run_id, "unknown-run")
    if st in TERMINAL:
        raise JournalAttachUnavailable(run_id, "terminal-run")
    deadline = clock() + attach_wait
    seen_file = waited = False
    while True:
        size = await journal_size()
        if size is not None:
            seen_file = True
            if size > 0:
                return size
        if clock() >= deadline:
            raise JournalAttachUnavailable(run_id, "journal-stalled" if seen_file else "journal-timeout")
        if size is None and not waited:
            log.info("run %s: waiting up to %.1fs for the journal", run_id, attach_wait)
        waited = True
        await asyncio.sleep(poll_interval)
