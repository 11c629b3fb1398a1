"""The sandbox daemon through its client: files, follow, launch, inputs, signals, trees,
confinement, the token, and a restart under a follow (a real daemon process each)."""
from __future__ import annotations

import asyncio
import contextlib
import io
import os
import pathlib
import signal
import tarfile
from typing import AsyncIterator, Iterator

import grpc
import pytest

from baton.errors import SandboxBuildFailed
from sandbox_host.daemon import sandbox_token
from sandbox_host.providers._daemon_client import DaemonClient
from tests.conftest import assert_eventually
from tests.sandbox.daemon_support import DaemonProcess, running

pytestmark = [pytest.mark.timeout(120), pytest.mark.servers]


@pytest.fixture
def daemon(tmp_path: pathlib.Path) -> Iterator[DaemonProcess]:
    (tmp_path / "work").mkdir()
    (tmp_path / "journals").mkdir()
    yield from running(DaemonProcess([tmp_path / "work", tmp_path / "journals"]))


@pytest.fixture
async def client(daemon: DaemonProcess) -> AsyncIterator[DaemonClient]:
    c = daemon.client()
    yield c
    await c.close()


async def test_files(client: DaemonClient, tmp_path: pathlib.Path) -> None:
    await client.copy_in("dir/f.txt", b"hello world", 0o600)
    target = tmp_path / "work" / "dir" / "f.txt"
    assert target.read_bytes() == b"hello world" and (target.stat().st_mode & 0o777) == 0o600
    assert await client.read_file(str(target)) == b"hello world"
    assert await client.read_file("dir/f.txt", 6) == b"world"
    assert await client.read_file("dir/f.txt", 2, 3) == b"llo"
    assert await client.file_size("dir/f.txt") == 11
    assert await client.file_size("nope") is None
    with pytest.raises(FileNotFoundError):
        await client.read_file("nope")
    with pytest.raises(PermissionError):
        await client.read_file("/etc/hostname")
    with pytest.raises(ValueError):
        await client.read_file("dir/../../x")
    with pytest.raises(PermissionError):
        await client.copy_in("/tmp/outside-the-roots", b"x")
    assert not os.path.exists("/tmp/outside-the-roots")
    # A link inside a root that points out of it is refused too.
    (tmp_path / "work" / "out").symlink_to("/etc/hostname")
    with pytest.raises(PermissionError):
        await client.read_file("out")


def _follow_into(client: DaemonClient, path: pathlib.Path, offset: int) -> tuple[asyncio.Task[None], bytearray]:
    """A task following ``path`` from ``offset`` through ``client``, and the bytes it got so far."""
    got = bytearray()

    async def follow() -> None:
        async for chunk in client.follow(str(path), offset):
            got.extend(chunk.data)
    return asyncio.create_task(follow()), got


async def test_follow_sees_appends_then_deletion(client: DaemonClient, tmp_path: pathlib.Path) -> None:
    path = tmp_path / "journals" / "j.ndjson"
    path.write_bytes(b"a\n")
    task, got = _follow_into(client, path, 1)
    with path.open("ab") as f:
        for i in range(50):
            f.write(b"line %d\n" % i)
            f.flush()
    expected = b"\n" + b"".join(b"line %d\n" % i for i in range(50))
    await assert_eventually(lambda: bytes(got) == expected, timeout=20)
    path.unlink()
    with pytest.raises(FileNotFoundError):
        await asyncio.wait_for(task, 20)


async def test_launch_journal_sentinel_input_kill(client: DaemonClient, tmp_path: pathlib.Path) -> None:
    journal, err = tmp_path / "journals" / "r.ndjson", tmp_path / "journals" / "r.err"
    pgid, inbox = await client.launch(
        ["sh", "-c", 'echo "{\\"v\\":\\"$V\\",\\"s\\":\\"$S\\",\\"p\\":\\"$(cat)\\"}"'], nonce="ab12",
        journal_path=str(journal), stderr_path=str(err), stdin=b"prompt", env={"V": "plain"}, secrets={"S": "hush"})
    assert pgid > 0 and inbox == ""
    await assert_eventually(lambda: b"__exit" in journal.read_bytes(), timeout=20)
    assert journal.read_bytes() == b'{"v":"plain","s":"hush","p":"prompt"}\n{"__exit":0,"__nonce":"ab12"}\n'
    assert not await client.processes_alive(pgid)
    # The daemon's own credentials never reach the agent.
    env_file = tmp_path / "work" / "env"
    await client.launch(["sh", "-c", f"env > {env_file}"], nonce="cd34", journal_path=str(journal),
                        stderr_path=str(err))
    await assert_eventually(lambda: env_file.exists() and "LANG=" in env_file.read_text(), timeout=20)
    assert "BATON_" not in env_file.read_text()

    # Interactive: an input line reaches the agent once; a kill stops it with a sentinel.
    j2 = tmp_path / "journals" / "i.ndjson"
    pgid, inbox = await client.launch(["sh", "-c", "read l; echo \"$l\"; sleep 60"], nonce="ef56",
                                      journal_path=str(j2), stderr_path=str(err), interactive=True)
    assert inbox
    await client.send_input(inbox, b'i1 {"a":1}\n')
    await assert_eventually(lambda: b'{"a":1}\n' in j2.read_bytes(), timeout=20)
    assert await client.processes_alive(pgid)
    status = await client.status(pgid)
    assert status.daemon_pid > 0 and status.started_at > 0
    assert await client.kill(pgid, signal.SIGTERM)
    await assert_eventually(lambda: b'"__exit":143' in j2.read_bytes(), timeout=20)
    await assert_eventually(_not(client.processes_alive, pgid), timeout=20)
    assert not await client.kill(pgid, signal.SIGTERM)
    with pytest.raises(ValueError):
        await client.send_input(str(tmp_path / "work" / "f"), b"x 1\n")


def _not(f, *args):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return not await f(*args)
    return check


async def test_bad_launch_is_refused_clearly(client: DaemonClient, tmp_path: pathlib.Path) -> None:
    with pytest.raises(SandboxBuildFailed) as caught:
        await client.launch(["true"], nonce="ab", journal_path="/etc/x.ndjson", stderr_path=str(tmp_path / "journals" / "e"),
                            secrets={"S": "hush-hush"})
    assert caught.value.step == "launch" and "hush-hush" not in str(caught.value)


async def test_tree_round_trip(client: DaemonClient, tmp_path: pathlib.Path) -> None:
    (tmp_path / "work" / "a").mkdir()
    (tmp_path / "work" / "a" / "f").write_text("one")
    tar = await client.export_tree()
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        assert sorted(t.getnames()) == ["work", "work/a", "work/a/f"]
    (tmp_path / "work" / "stray").write_text("x")
    await client.import_tree(tar, replace=True)
    assert (tmp_path / "work" / "a" / "f").read_text() == "one" and not (tmp_path / "work" / "stray").exists()
    bad = io.BytesIO()
    with tarfile.open(fileobj=bad, mode="w") as t:
        info = tarfile.TarInfo("work/../../evil")
        t.addfile(info, io.BytesIO(b""))
    with pytest.raises(SandboxBuildFailed):
        await client.import_tree(bad.getvalue())


async def test_token_required(tmp_path: pathlib.Path) -> None:
    (tmp_path / "w").mkdir()
    token = sandbox_token("cluster-secret", "sbx")
    for d in running(DaemonProcess([tmp_path / "w"], token=token)):
        wrong = d.client(token="not-it")
        right = d.client()
        try:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await wrong.file_size("x")
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert await right.file_size("x") is None
        finally:
            await wrong.close()
            await right.close()


async def test_restart_under_follow_loses_and_repeats_nothing(daemon: DaemonProcess, client: DaemonClient,
                                                              tmp_path: pathlib.Path) -> None:
    path = tmp_path / "journals" / "r.ndjson"
    path.write_bytes(b"")
    got = bytearray()

    async def follow() -> None:
        async for chunk in client.follow(str(path), 0):
            got.extend(chunk.data)

    task = asyncio.create_task(follow())
    lines = [b"%05d\n" % i for i in range(3000)]
    with path.open("ab") as f:
        for i, line in enumerate(lines):
            f.write(line)
            f.flush()
            if i in (1000, 2000):
                await assert_eventually(lambda: len(got) > 0, timeout=20)
                await asyncio.to_thread(daemon.kill, signal.SIGKILL)
                await asyncio.to_thread(daemon.start)
    await assert_eventually(lambda: bytes(got) == b"".join(lines), timeout=30)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_a_follow_quiet_for_longer_than_the_patience_still_waits_out_a_restart(
        daemon: DaemonProcess, tmp_path: pathlib.Path) -> None:
    # The patience is counted from the first failed try after the follow last had the daemon,
    # not from the last chunk: an agent that thinks for minutes is not a daemon that stopped
    # answering. The daemon restarts twice, a quiet while apart, with no chunk in between: the
    # follow it took again after the first restart starts a fresh patience for the second.
    patience = 10.0
    client = daemon.client()
    client.patience = patience
    path = tmp_path / "journals" / "quiet.ndjson"
    path.write_bytes(b"first\n")
    task, got = _follow_into(client, path, 0)
    try:
        await assert_eventually(lambda: bytes(got) == b"first\n", timeout=20)
        await asyncio.to_thread(daemon.kill, signal.SIGKILL)
        await asyncio.to_thread(daemon.start)
        # Not a wait for an event: the follow must stay quiet for longer than its patience.
        await asyncio.sleep(patience + 0.5)
        await asyncio.to_thread(daemon.kill, signal.SIGKILL)
        await asyncio.to_thread(daemon.start)
        with path.open("ab") as f:
            f.write(b"second\n")
        await assert_eventually(lambda: bytes(got) == b"first\nsecond\n" or task.done(), timeout=30)
        assert not task.done(), task.exception()
        assert bytes(got) == b"first\nsecond\n"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.close()
