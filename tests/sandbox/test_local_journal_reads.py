"""A local sandbox's journal read on the machine (``BATON_LOCAL_JOURNAL_READS=direct``, the
default; docs/design.md §5.1): the follow needs nothing from the sandbox's daemon, a link put
where the journal was is never read, and every other file still goes through the daemon."""
from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import signal
import socket

import pytest

from sandbox_host.journal import JournalExit, JournalLine, new_nonce
from sandbox_host.providers import SandboxHandle, SandboxSpec
from sandbox_host.providers.local import LocalProvider
from tests.conftest import assert_eventually
from tests.sandbox.conftest import follow_all, with_data

pytestmark = pytest.mark.servers  # starts the sandbox's daemon and agent


def _daemon_pid(handle: SandboxHandle) -> int:
    return int((pathlib.Path(handle.data["dir"]) / ".baton" / "daemon.addr").read_text().split()[1])


async def _refused(provider: LocalProvider, h: SandboxHandle, why: str, *, sized: bool = True) -> None:
    """Following, reading and (``sized``) sizing the journal each raise ``PermissionError``
    saying ``why``."""
    with pytest.raises(PermissionError, match=why):
        async with contextlib.aclosing(provider.follow(h, h.journal_path, 0)) as chunks:
            async for _ in chunks:
                pass
    with pytest.raises(PermissionError, match=why):
        await provider.read_file(h, h.journal_path)
    if sized:
        with pytest.raises(PermissionError, match=why):
            await provider.file_size(h, h.journal_path)


def test_an_unknown_way_of_reading_is_refused_by_name(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="BATON_LOCAL_JOURNAL_READS must be one of direct, daemon, not 'nfs'"):
        LocalProvider(str(tmp_path / "s"), str(tmp_path / "j"), journal_reads="nfs")


async def test_the_journal_flows_while_the_daemon_is_frozen(local_provider: LocalProvider,
                                                            sandboxes: list[SandboxHandle]) -> None:
    """The agent writes a line every 20 ms; its daemon is SIGSTOPped right after the launch
    and stays so: the follow still yields every line, in order, and the sentinel."""
    assert local_provider.journal_reads == "direct"
    nonce = new_nonce()
    h = await local_provider.create("frozen-daemon", SandboxSpec())
    sandboxes.append(h)
    script = 'i=0; while [ $i -lt 60 ]; do echo "line $i"; i=$((i+1)); sleep 0.02; done'
    h = with_data(h, dict(await local_provider.launch(h, ["sh", "-c", script], nonce=nonce)))
    sandboxes[-1] = h
    pid = _daemon_pid(h)
    os.kill(pid, signal.SIGSTOP)
    try:
        items = await follow_all(local_provider, h, nonce, timeout=30)
        assert pathlib.Path(f"/proc/{pid}").exists()  # the same daemon, still stopped
        with open(f"/proc/{pid}/stat") as f:
            assert f.read().rsplit(")", 1)[1].split()[0] == "T"
    finally:
        os.kill(pid, signal.SIGCONT)
    assert [i.data for i in items if isinstance(i, JournalLine)] == [f"line {n}".encode() for n in range(60)]
    assert isinstance(items[-1], JournalExit) and items[-1].code == 0
    # Read whole and in part, and sized, on the machine too (the daemon was not needed).
    whole = pathlib.Path(h.journal_path).read_bytes()
    assert await local_provider.read_file(h, h.journal_path) == whole
    assert await local_provider.read_file(h, h.journal_path, 7, 6) == whole[7:13]
    assert await local_provider.read_file(h, h.journal_path, 5, 0) == b""
    assert await local_provider.file_size(h, h.journal_path) == len(whole)


async def test_a_link_where_the_journal_was_is_not_read(local_provider: LocalProvider,
                                                        sandboxes: list[SandboxHandle],
                                                        tmp_path: pathlib.Path) -> None:
    """An agent that swaps its journal for a symbolic link to another file (another run's
    journal) gets nothing of it into its own: follow, read and size refuse the link. (A hard
    link is the file itself: the local provider is no isolation, docs/overview.md.)"""
    h = await local_provider.create("linked", SandboxSpec())
    sandboxes.append(h)
    secret = tmp_path / "other-run.ndjson"
    secret.write_text('{"type":"secret","of":"another tenant"}\n')
    pathlib.Path(h.journal_path).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(secret, h.journal_path)
    await _refused(local_provider, h, "symbolic link")


@pytest.mark.parametrize("reads", ["direct", "daemon"])
@pytest.mark.parametrize("kind", ["fifo", "socket"])
async def test_a_fifo_or_socket_where_the_journal_was_is_refused_at_once(
        tmp_path: pathlib.Path, reads: str, kind: str) -> None:
    """A FIFO with no writer would hold a plain ``open`` (the host's event loop, or the
    daemon's for good) until one came: refused at once instead, on the machine and through
    the daemon alike; a socket too."""
    provider = LocalProvider(str(tmp_path / "sandboxes"), str(tmp_path / "journals"), idle_check=0.05,
                             journal_reads=reads)
    h = await provider.create(kind, SandboxSpec())
    pathlib.Path(h.journal_path).parent.mkdir(parents=True, exist_ok=True)
    held = None
    if kind == "fifo":
        os.mkfifo(h.journal_path)
    else:
        held = socket.socket(socket.AF_UNIX)
        held.bind(h.journal_path)
    try:
        async with asyncio.timeout(30):
            await _refused(provider, h, "not a regular file", sized=reads == "direct")
    finally:
        if held is not None:
            held.close()
        os.unlink(h.journal_path)
        await provider.destroy(h)
        await provider.close()


async def test_a_closed_follow_lets_go_of_its_file_and_watch_at_once(local_provider: LocalProvider,
                                                                    sandboxes: list[SandboxHandle]) -> None:
    """The run's end closes its follow: the journal's descriptor and the inotify watch go
    then, not at the loop's later clean-up of an unclosed generator."""
    h = await local_provider.create("closed", SandboxSpec())
    sandboxes.append(h)
    path = pathlib.Path(h.journal_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"one\n")
    before = set(os.listdir("/proc/self/fd"))
    follow = local_provider.follow(h, h.journal_path, 0)
    assert (await follow.__anext__()).data == b"one\n"
    assert local_provider._watcher._watches
    await follow.aclose()
    assert not local_provider._watcher._watches
    assert set(os.listdir("/proc/self/fd")) <= before


async def test_a_journal_deleted_under_the_follow_ends_it_after_its_last_bytes(
        local_provider: LocalProvider, sandboxes: list[SandboxHandle]) -> None:
    h = await local_provider.create("deleted", SandboxSpec())
    sandboxes.append(h)
    path = pathlib.Path(h.journal_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"one\n")
    got: list[bytes] = []

    async def follow() -> None:
        async for chunk in local_provider.follow(h, h.journal_path, 0):
            got.append(chunk.data)
            assert chunk.size >= chunk.offset + len(chunk.data)

    task = asyncio.create_task(follow())
    await assert_eventually(lambda: got == [b"one\n"], timeout=10)
    with open(path, "ab") as f:
        f.write(b"two\n")
        os.unlink(path)  # deleted with its last line written: still read
    with pytest.raises(FileNotFoundError):
        async with asyncio.timeout(10):
            await task
    assert b"".join(got) == b"one\ntwo\n"


async def test_other_files_still_go_through_the_daemon(local_provider: LocalProvider,
                                                       sandboxes: list[SandboxHandle]) -> None:
    """A workspace file is the daemon's to read: with the daemon frozen, its read waits (and
    goes on once the daemon does), where the journal's does not."""
    h = await local_provider.create("other-files", SandboxSpec())
    sandboxes.append(h)
    await local_provider.copy_in(h, "notes.txt", b"through the daemon\n")
    pid = _daemon_pid(h)
    os.kill(pid, signal.SIGSTOP)
    try:
        read = asyncio.create_task(local_provider.read_file(h, "notes.txt"))
        for _ in range(20):  # the journal's size, on the machine, while the daemon answers nothing
            assert await local_provider.file_size(h, h.journal_path) is None
            await asyncio.sleep(0)
        assert not read.done()
    finally:
        os.kill(pid, signal.SIGCONT)
    async with asyncio.timeout(30):
        assert await read == b"through the daemon\n"
