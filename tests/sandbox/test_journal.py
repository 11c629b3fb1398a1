"""Journal names, the exit sentinel, the line splitter, the follower and the attach preflight.

Hostile journals: a 2 MiB line, invalid UTF-8, CRLF, a forged
sentinel, a 0-byte journal, a journal deleted mid-follow: each has one clear outcome.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import tracemalloc
from typing import AsyncIterator

import pytest

from baton.errors import JournalAttachUnavailable
from baton.ids import file_stem
from sandbox_host.journal import (
    JournalDeleted,
    JournalExit,
    JournalLine,
    JournalOversized,
    JournalTruncated,
    LineSplitter,
    MAX_LINE_BYTES,
    OVERSIZED_HEAD,
    OVERSIZED_TAIL,
    exit_sentinel,
    follow_journal,
    journal_path,
    new_nonce,
    parse_sentinel,
    preflight_attach,
    stderr_path,
)
from sandbox_host.providers import Chunk, SandboxHandle
from sandbox_host.providers.local import LocalProvider
from tests.conftest import assert_eventually
from tests.sandbox.conftest import follow_all, with_data


@pytest.fixture(params=["direct", "daemon"])
def local_provider(tmp_path: pathlib.Path, request: pytest.FixtureRequest) -> LocalProvider:
    """Both ways a host reads a local sandbox's journal: on the machine, and through the
    sandbox's daemon (``BATON_LOCAL_SANDBOX_IO``)."""
    return LocalProvider(str(tmp_path / "sandboxes"), str(tmp_path / "journals"), idle_check=0.05,
                         sandbox_io=request.param)


def test_journal_names_are_injective_and_shell_safe() -> None:
    a = journal_path("/tmp/j", "run/1 $(rm -rf)")
    b = journal_path("/tmp/j", "run%2F1")
    assert a != b
    assert a == f"/tmp/j/{file_stem('run/1 $(rm -rf)')}.ndjson"
    assert set(os.path.basename(a)) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-%.")
    assert stderr_path("/tmp/j", "r1") == "/tmp/j/r1.err"


def test_sentinel_needs_the_right_nonce() -> None:
    n = new_nonce()
    assert len(n) == 32 and n != new_nonce()
    line = exit_sentinel(3, n)
    assert line == b'{"__exit":3,"__nonce":"' + n.encode() + b'"}\n'
    assert parse_sentinel(line[:-1], n) == 3
    assert parse_sentinel(line[:-1], new_nonce()) is None
    assert parse_sentinel(b'{"__exit":0}', n) is None


def test_splitter_offsets_crlf_and_split_utf8() -> None:
    s = LineSplitter(10)
    text = "a\r\nb€\n\nc".encode()
    out: list[JournalLine] = []
    for i in range(len(text)):  # one byte per read: "€" straddles three reads
        out += s.feed(text[i : i + 1])
    assert out == [JournalLine(10, 13, b"a"), JournalLine(13, 18, "b€".encode()), JournalLine(18, 19, b"")]
    assert s.pending == b"c" and s.consumed == 19


def test_splitter_two_mib_line_in_small_reads() -> None:
    s = LineSplitter()
    big = b'{"x":"' + b"y" * (2 << 20) + b'"}\n'
    out: list[JournalLine] = []
    for i in range(0, len(big), 65536):
        out += s.feed(big[i : i + 65536])
    assert len(out) == 1 and out[0].data == big[:-1] and out[0].end == len(big)


def test_splitter_a_line_over_the_limit_comes_out_the_same_whatever_the_reads() -> None:
    """A line longer than MAX_LINE_BYTES is a JournalOversized (size, head, tail) and its
    neighbours plain lines, read whole, a MiB at a time or in odd pieces: hosts that read one
    journal in different pieces replay the same items."""
    huge = b"<" + b"x" * (MAX_LINE_BYTES + 10) + b">"
    journal = b"a\n" + huge + b"\r\nb\n" + b"y" * MAX_LINE_BYTES + b"\ntail"
    want = [
        JournalLine(0, 2, b"a"),
        JournalOversized(2, 2 + len(huge) + 2, huge[:OVERSIZED_HEAD], len(huge) + 1, (huge + b"\r")[-OVERSIZED_TAIL:]),
        JournalLine(len(huge) + 4, len(huge) + 6, b"b"),
        JournalLine(len(huge) + 6, len(huge) + 7 + MAX_LINE_BYTES, b"y" * MAX_LINE_BYTES),  # at the limit: whole
    ]
    for piece in (len(journal), 1 << 20, 65537, MAX_LINE_BYTES + 1):
        s = LineSplitter()
        out: list[JournalLine] = []
        for i in range(0, len(journal), piece):
            out += s.feed(journal[i : i + piece])
        assert out == want, piece
        assert s.pending == b"tail" and s.consumed == len(journal) - 4


def test_splitter_keeps_only_the_head_of_a_line_over_the_limit_still_being_written() -> None:
    s = LineSplitter()
    for _ in range(3 * MAX_LINE_BYTES // (1 << 20)):
        assert s.feed(b"z" * (1 << 20)) == []
    assert s.pending == b"z" * OVERSIZED_HEAD and s.consumed == 0
    assert len(s._buf) == 0  # nothing more of it held


async def _launch_sh(provider: LocalProvider, sandboxes: list, key: str, script: str, nonce: str):  # type: ignore[no-untyped-def]
    from sandbox_host.providers import SandboxSpec

    h = await provider.create(key, SandboxSpec())
    sandboxes.append(h)
    h = with_data(h, dict(await provider.launch(h, ["sh", "-c", script], nonce=nonce)))
    sandboxes[-1] = h
    return h


@pytest.mark.servers  # starts processes: not a unit test
async def test_follow_hostile_lines(local_provider: LocalProvider, sandboxes: list) -> None:
    """2 MiB line, invalid UTF-8, CRLF and a forged sentinel come through as plain lines."""
    nonce = new_nonce()
    script = (
        "head -c 2097152 /dev/zero | tr '\\0' 'x'; printf '\\n';"
        "printf '\\377\\376 not utf-8\\n';"
        "printf '{\"type\":\"turn.started\"}\\r\\n';"
        "printf '{\"__exit\":0,\"__nonce\":\"0123abcd\"}\\n';"
        "printf 'last'"
    )
    h = await _launch_sh(local_provider, sandboxes, "hostile", script, nonce)
    items = await follow_all(local_provider, h, nonce)
    assert [type(i) for i in items] == [JournalLine] * 4 + [JournalTruncated, JournalExit]
    assert items[0].data == b"x" * 2097152 and items[0].offset == 0 and items[0].end == 2097153
    assert items[1].data == b"\xff\xfe not utf-8"
    assert items[2].data == b'{"type":"turn.started"}'
    assert items[3].data == b'{"__exit":0,"__nonce":"0123abcd"}'  # forged: not obeyed
    assert items[4] == JournalTruncated(items[3].end, b"last")  # fragment glued to the sentinel
    assert isinstance(items[5], JournalExit) and items[5].code == 0
    assert items[5].end == os.path.getsize(h.journal_path)


@pytest.mark.servers  # starts processes: not a unit test
async def test_follow_a_line_over_the_limit_without_holding_it(local_provider: LocalProvider, sandboxes: list) -> None:
    """Sandboxed code writes a 96 MiB line, then a line; later the agent dies mid-line and the
    wrapper's sentinel lands at its end: the host follows both without ever holding either
    (its Python memory stays under twice the limit), and sees the sentinel."""
    nonce = new_nonce()
    size = 96 << 20
    script = f"head -c {size} /dev/zero | tr '\\0' 'x'; printf '\\nafter\\n'; head -c {size} /dev/zero | tr '\\0' 'y'; exit 3"
    h = await _launch_sh(local_provider, sandboxes, "oversized", script, nonce)
    tracemalloc.start()
    try:
        items = await follow_all(local_provider, h, nonce, timeout=120)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [type(i) for i in items] == [JournalOversized, JournalLine, JournalTruncated, JournalExit]
    first = items[0]
    assert isinstance(first, JournalOversized)
    assert (first.offset, first.end, first.size) == (0, size + 1, size)
    assert first.data == b"x" * OVERSIZED_HEAD and first.tail == b"x" * OVERSIZED_TAIL
    assert items[1] == JournalLine(size + 1, size + 7, b"after")
    assert items[2] == JournalTruncated(size + 7, b"y" * OVERSIZED_HEAD)  # the fragment the agent left
    assert items[2].length == size
    exit_ = items[3]
    assert isinstance(exit_, JournalExit) and exit_.code == 3
    assert exit_.offset == 2 * size + 7 and exit_.end == os.path.getsize(h.journal_path)
    assert peak < 2 * MAX_LINE_BYTES, f"{peak / 2**20:.0f} MiB held following two 96 MiB lines"


@pytest.mark.servers  # starts processes: not a unit test
async def test_follow_zero_byte_journal_ends_with_exit(local_provider: LocalProvider, sandboxes: list) -> None:
    nonce = new_nonce()
    h = await _launch_sh(local_provider, sandboxes, "empty", "exit 4", nonce)
    items = await follow_all(local_provider, h, nonce)
    assert items == [JournalExit(4, 0, os.path.getsize(h.journal_path))]


@pytest.mark.servers  # starts processes: not a unit test
async def test_follow_killed_agent_reports_fragment_without_exit(
    local_provider: LocalProvider, sandboxes: list
) -> None:
    """SIGKILL of the whole group: no sentinel; the trailing fragment is reported."""
    nonce = new_nonce()
    h = await _launch_sh(local_provider, sandboxes, "killed", "printf 'one\\ntw'; exec sleep 60", nonce)
    await assert_eventually(lambda: os.path.getsize(h.journal_path) == 6)
    assert await local_provider.kill(h, 9)
    items = await follow_all(local_provider, h, nonce)
    assert items == [JournalLine(0, 4, b"one"), JournalTruncated(4, b"tw")]
    assert not await local_provider.processes_alive(h)


@pytest.mark.servers  # starts processes: not a unit test
async def test_follow_resumes_from_offset(local_provider: LocalProvider, sandboxes: list) -> None:
    nonce = new_nonce()
    h = await _launch_sh(local_provider, sandboxes, "offset", "printf 'a\\nbb\\nccc\\n'", nonce)
    full = await follow_all(local_provider, h, nonce)
    again = await follow_all(local_provider, h, nonce, offset=2)
    assert [i.data for i in full[:3]] == [b"a", b"bb", b"ccc"]  # type: ignore[union-attr]
    assert again == full[1:]


@pytest.mark.servers  # starts processes: not a unit test
async def test_follow_journal_deleted_mid_follow(local_provider: LocalProvider, sandboxes: list) -> None:
    nonce = new_nonce()
    h = await _launch_sh(local_provider, sandboxes, "deleted", "printf 'a\\n'; exec sleep 60", nonce)
    await assert_eventually(lambda: os.path.getsize(h.journal_path) == 2)

    async def delete_soon() -> None:
        await assert_eventually(lambda: True)
        os.unlink(h.journal_path)

    task = asyncio.create_task(delete_soon())
    with pytest.raises(JournalDeleted) as ei:
        await follow_all(local_provider, h, nonce)
    await task
    assert ei.value.path == h.journal_path and ei.value.offset >= 0


class _UntoldSizeProvider(LocalProvider):
    """The local provider as if its sandbox's daemon predated the size in a follow's chunks."""

    async def follow(self, handle: SandboxHandle, path: str, offset: int) -> AsyncIterator[Chunk]:
        async for chunk in super().follow(handle, path, offset):
            yield chunk._replace(size=0)


@pytest.mark.servers  # the sandbox's daemon is a process
@pytest.mark.parametrize("told", [True, False], ids=["size-told", "reads-only"])
async def test_the_lag_is_sampled_once_per_read(tmp_path: pathlib.Path, told: bool) -> None:
    """The follower reports the journal's lag at each read, not per line: bytes written and
    not yet consumed. Followed from byte 0 (a takeover's replay) the first read's sample is
    the whole journal (its size, told by the daemon with the chunk), or the 1 MiB read (a
    lower bound, from a daemon that does not tell it); the second is what is left past the
    two lines the first read completed. No ``FileSize`` call is made per read."""
    provider = (LocalProvider if told else _UntoldSizeProvider)(str(tmp_path / "s"), str(tmp_path / "j"),
                                                                idle_check=0.05)
    nonce = new_nonce()
    line = b'{"x":"' + b"y" * 399_992 + b'"}\n'  # 400_001 bytes: two complete lines per MiB read
    path = tmp_path / "j.ndjson"
    path.write_bytes(line * 5 + exit_sentinel(0, nonce))
    size = path.stat().st_size
    (tmp_path / "sbx" / ".baton").mkdir(parents=True)  # the sandbox's daemon keeps its state here
    handle = SandboxHandle("local", "lag", str(path), str(tmp_path / "j.err"), str(tmp_path),
                           {"dir": str(tmp_path / "sbx")})  # no agent process
    assert await provider.file_size(handle, str(path)) == size  # the daemon is up: the follow answers at once
    sized: list[str] = []
    stat = provider.file_size

    async def counted(h: SandboxHandle, p: str) -> int | None:
        sized.append(p)
        return await stat(h, p)
    provider.file_size = counted  # type: ignore[method-assign]
    lags: list[int] = []
    async with asyncio.timeout(20):
        async with contextlib.aclosing(follow_journal(provider, handle, str(path), nonce=nonce,
                                                      poll_interval=1.0, on_lag=lags.append)) as items:
            got = [it async for it in items]
    await provider.destroy(handle)
    assert [type(i) for i in got] == [JournalLine] * 5 + [JournalExit]
    assert sized == []
    assert lags == [size if told else 1 << 20, size - 2 * len(line)]


@pytest.mark.servers  # the sandbox's daemon is a process
async def test_follow_missing_journal_is_deleted(local_provider: LocalProvider, sandboxes: list) -> None:
    from sandbox_host.providers import SandboxSpec

    h = await local_provider.create("never", SandboxSpec())
    sandboxes.append(h)
    with pytest.raises(JournalDeleted):
        await follow_all(local_provider, h, new_nonce())


async def test_preflight_reasons(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "j.ndjson"

    async def size() -> int | None:
        return path.stat().st_size if path.exists() else None

    async def status_of(value: str | None):  # type: ignore[no-untyped-def]
        return value

    cases = [(None, "unknown-run"), ("completed", "terminal-run"), ("aborted", "terminal-run"),
             ("failed", "terminal-run")]
    for st, reason in cases:
        with pytest.raises(JournalAttachUnavailable) as ei:
            await preflight_attach("r1", status=lambda st=st: status_of(st), journal_size=size, attach_wait=5)
        assert ei.value.reason == reason and ei.value.run_id == "r1"
    with pytest.raises(JournalAttachUnavailable) as ei:
        await preflight_attach("r1", status=lambda: status_of("running"), journal_size=size, attach_wait=0.1)
    assert ei.value.reason == "journal-timeout"
    path.write_bytes(b"")
    with pytest.raises(JournalAttachUnavailable) as ei:
        await preflight_attach("r1", status=lambda: status_of("running"), journal_size=size, attach_wait=0.1)
    assert ei.value.reason == "journal-stalled"

    async def write_later() -> None:
        await asyncio.sleep(0.05)
        path.write_bytes(b"{}\n")

    task = asyncio.create_task(write_later())
    got = await preflight_attach("r1", status=lambda: status_of("interrupted"), journal_size=size, attach_wait=5)
    await task
    assert got == 3


@pytest.mark.servers  # starts processes: not a unit test
async def test_a_relaunched_agent_continues_the_same_journal(local_provider: LocalProvider, sandboxes: list) -> None:
    """An agent process ends while its run wants it back: the relaunched wrapper marks the
    journal first, and the journal reads as one (the sentinel in between is no end). A
    successor replaying it relaunches nothing; a marker with a foreign nonce is a plain line."""
    from sandbox_host.agent_resume import journal_with_resumes
    from sandbox_host.journal import JournalResume, nonce_file_text
    from sandbox_host.providers import Sandbox

    nonce = new_nonce()
    forged = '{"__resume":2,"__nonce":"0123abcd","inbox":""}'
    h = await _launch_sh(local_provider, sandboxes, "relaunch", f"printf 'one\\n{forged}\\n'; exit 3", nonce)
    sbx = Sandbox(local_provider, h, nonce)
    launched: list[int] = []
    resumed: list[JournalResume] = []

    async def relaunch(attempt: int) -> bool:
        launched.append(attempt)
        data = await local_provider.launch(sbx.handle, ["sh", "-c", "printf 'two\\n'"],
                                           nonce=nonce_file_text(nonce, attempt))
        sbx.handle = with_data(sbx.handle, dict(data))
        return True

    async def read(wanted: bool) -> list:
        out = []
        async with asyncio.timeout(20):
            async for it in journal_with_resumes(sbx, poll_interval=0.05, wanted=lambda a: wanted and a == 2,
                                                 relaunch=relaunch, on_resume=resumed.append):
                out.append(it)
        return out

    items = await read(True)
    assert [getattr(i, "data", None) for i in items] == [b"one", forged.encode(), b"two", None]
    assert isinstance(items[-1], JournalExit) and items[-1].code == 0
    assert launched == [2] and [(r.attempt, r.inbox) for r in resumed] == [(2, "")]
    text = pathlib.Path(h.journal_path).read_bytes().decode()
    assert text.count('"__exit"') == 2 and text.index('"__resume":2,"__nonce":"' + nonce) < text.index("two")
    # A successor replays the same journal: the marker says the agent was relaunched already.
    assert await read(True) == items and launched == [2]
    # Without a marker after it, a sentinel nobody wants a relaunch for is the end.
    h2 = await _launch_sh(local_provider, sandboxes, "relaunch-not", "printf 'one\\n'; exit 3", nonce)
    sbx.handle = h2
    assert [type(i) for i in await read(False)] == [JournalLine, JournalExit] and launched == [2]
