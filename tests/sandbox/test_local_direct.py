"""A local sandbox reached on the machine (``BATON_LOCAL_SANDBOX_IO=direct``, the default;
docs/design.md §5.1): its whole life (setup, files, launch, inputs, signals, trees, the
journal) needs no daemon and starts none; other files are confined to the sandbox's roots as
the daemon confines them; a link put where the journal was is never read."""
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
from sandbox_host.providers._local_daemon import LOCK_FILE, _running_and_addr, meta_dir
from sandbox_host.providers.local import LocalProvider
from tests.conftest import assert_eventually
from tests.sandbox.conftest import follow_all, with_data

pytestmark = pytest.mark.servers  # starts the sandbox's agent (and, through the daemon, its daemon)


@pytest.fixture
def local_provider(tmp_path: pathlib.Path) -> LocalProvider:
    """The default provider: on the machine."""
    return LocalProvider(str(tmp_path / "sandboxes"), str(tmp_path / "journals"), idle_check=0.05)


def _daemon_processes(handle: SandboxHandle) -> list[int]:
    """Pids of processes running the sandbox daemon's code for this sandbox."""
    out = []
    for name in os.listdir("/proc"):
        try:
            cmd = pathlib.Path(f"/proc/{name}/cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if b"sandbox_host.daemon" in cmd and str(handle.data["dir"]).encode() in cmd:
            out.append(int(name))
    return out


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
    with pytest.raises(ValueError, match="BATON_LOCAL_SANDBOX_IO must be one of direct, daemon, not 'nfs'"):
        LocalProvider(str(tmp_path / "s"), str(tmp_path / "j"), sandbox_io="nfs")


async def test_a_sandbox_lives_its_whole_life_without_a_daemon(local_provider: LocalProvider,
                                                               sandboxes: list[SandboxHandle]) -> None:
    """Files in, a launch that reads an input from its inbox, the journal followed to its
    sentinel, a tree out and in, a signal: every result as through the daemon, and no daemon
    ever started for the sandbox (no process, no address, no lock)."""
    assert local_provider.sandbox_io == "direct"
    nonce = new_nonce()
    h = await local_provider.create("no-daemon", SandboxSpec(workspace=None))
    sandboxes.append(h)
    await local_provider.copy_in(h, "notes.txt", b"copied in\n")
    await local_provider.copy_in(h, "setup.txt", b"built\n", 0o600)
    assert await local_provider.read_file(h, "notes.txt") == b"copied in\n"
    assert os.stat(os.path.join(h.workdir, "setup.txt")).st_mode & 0o777 == 0o600
    assert await local_provider.file_size(h, "setup.txt") == len(b"built\n")
    # The agent prints its files, then each line of its inbox until "stop".
    script = ('cat setup.txt notes.txt; i=0; while [ $i -lt 40 ]; do echo "line $i"; i=$((i+1)); sleep 0.02; done; '
              'while read -r l; do echo "got $l"; [ "$l" = stop ] && break; done')
    data = dict(await local_provider.launch(h, ["sh", "-c", script], nonce=nonce, interactive=True))
    assert "daemon" not in data and data["pgid"]
    h = with_data(h, data)
    sandboxes[-1] = h
    await local_provider.send_input(h, "i1", b"stop")
    items = await follow_all(local_provider, h, nonce, timeout=30)
    # The relay notes the input it passed on in the journal, where it passed it.
    lines = [i.data for i in items if isinstance(i, JournalLine) and not i.data.startswith(b'{"type":"baton_input"')]
    assert sum(1 for i in items if isinstance(i, JournalLine) and b'"id":"i1"' in i.data) == 1
    assert lines[:2] == [b"built", b"copied in"]
    assert lines[2:42] == [f"line {n}".encode() for n in range(40)]
    assert lines[-1].startswith(b"got ") and b"stop" in lines[-1]
    assert isinstance(items[-1], JournalExit) and items[-1].code == 0
    # Read whole and in part, and sized, on the machine.
    whole = pathlib.Path(h.journal_path).read_bytes()
    assert await local_provider.read_file(h, h.journal_path) == whole
    assert await local_provider.read_file(h, h.journal_path, 7, 6) == whole[7:13]
    assert await local_provider.read_file(h, h.journal_path, 5, 0) == b""
    assert await local_provider.file_size(h, h.journal_path) == len(whole)
    tar = await local_provider.export_tree(h)
    (pathlib.Path(h.workdir) / "notes.txt").write_text("changed\n")
    await local_provider.import_tree(h, tar, replace=True)
    assert (pathlib.Path(h.workdir) / "notes.txt").read_text() == "copied in\n"
    assert not (pathlib.Path(h.workdir) / ".baton").exists()  # the state directory is not the tree's
    sleeper = with_data(h, dict(await local_provider.launch(h, ["sleep", "60"], nonce=new_nonce())))
    assert await local_provider.processes_alive(sleeper)
    assert await local_provider.kill(sleeper, signal.SIGTERM)
    await assert_eventually(lambda: _not_alive(local_provider, sleeper))
    meta = meta_dir(h)
    assert not _running_and_addr(meta)[0] and not os.path.exists(os.path.join(meta, LOCK_FILE))
    assert _daemon_processes(h) == []


async def _not_alive(provider: LocalProvider, h: SandboxHandle) -> bool:
    return not await provider.processes_alive(h)


async def test_setup_commands_run_under_the_daemon_not_the_host(local_provider: LocalProvider,
                                                                sandboxes: list[SandboxHandle]) -> None:
    """A setup command is a child of whoever runs it (``/proc/$PPID/environ`` is readable to
    it): on the machine too, its parent is the sandbox's daemon, whose environment holds
    none of the host's own, not this process; the daemon goes once the build is done."""
    from sandbox_host.providers.local import _INHERITED_ENV

    # Variables this process started with (what /proc shows) that no sandbox inherits.
    own = {line.split(b"=", 1)[0].decode() for line in pathlib.Path("/proc/self/environ").read_bytes().split(b"\0")
           if b"=" in line} - set(_INHERITED_ENV)
    assert own
    h = await local_provider.create("setup", SandboxSpec(setup=[
        "echo $PPID > ppid.txt; tr '\\0' '\\n' < /proc/$PPID/environ > parent-env.txt"]))
    sandboxes.append(h)
    parent = int((pathlib.Path(h.workdir) / "ppid.txt").read_text())
    assert parent != os.getpid()
    names = {line.split("=", 1)[0] for line in (pathlib.Path(h.workdir) / "parent-env.txt").read_text().splitlines()}
    # (A daemon forked by the fork server shows its title there; one started as a command
    # its environment: neither holds this process's own variables.)
    assert not names & own, names & own
    # The daemon that ran them is gone once the build is done.
    await assert_eventually(lambda: not _running_and_addr(meta_dir(h))[0], timeout=30)
    await assert_eventually(lambda: _daemon_processes(h) == [], timeout=30)  # its lock goes first


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
                             sandbox_io=reads)
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


@pytest.mark.parametrize("way", ["direct", "daemon"])
async def test_other_files_are_confined_to_the_sandbox_as_the_daemon_confines_them(
        tmp_path: pathlib.Path, way: str) -> None:
    """Outside the roots (absolute, or through a link) ``PermissionError``, a ``..``
    ``ValueError``, nothing written or read: the same answers on the machine as through the
    daemon."""
    provider = LocalProvider(str(tmp_path / "sandboxes"), str(tmp_path / "journals"), idle_check=0.05,
                             sandbox_io=way)
    h = await provider.create("confined", SandboxSpec())
    outside = tmp_path / "outside.txt"
    outside.write_text("not the sandbox's\n")
    os.symlink(outside, os.path.join(h.workdir, "out"))
    try:
        for path in (str(outside), "out"):
            with pytest.raises(PermissionError, match="outside the sandbox's roots"):
                await provider.read_file(h, path)
            with pytest.raises(PermissionError, match="outside the sandbox's roots"):
                await provider.copy_in(h, path, b"overwritten\n")
        with pytest.raises(ValueError, match="climbs out"):
            await provider.read_file(h, "../x")
        assert outside.read_text() == "not the sandbox's\n"
        await provider.copy_in(h, "sub/in.txt", b"inside\n")
        assert await provider.read_file(h, "sub/in.txt") == b"inside\n"
    finally:
        await provider.destroy(h)
        await provider.close()


@pytest.mark.parametrize("way", ["direct", "daemon"])
@pytest.mark.parametrize("kind", ["fifo", "link"])
async def test_an_inbox_swapped_for_a_fifo_or_link_is_refused_at_once(tmp_path: pathlib.Path, way: str,
                                                                     kind: str) -> None:
    """An agent may put a FIFO nobody reads, or a link to another file, where its inbox was:
    the input is refused at once (an ``open`` of the FIFO held a worker thread for good), and
    nothing is written through the link."""
    provider = LocalProvider(str(tmp_path / "sandboxes"), str(tmp_path / "journals"), idle_check=0.05,
                             sandbox_io=way)
    h = await provider.create(f"inbox-{kind}", SandboxSpec())
    try:
        h = with_data(h, dict(await provider.launch(h, ["sleep", "30"], nonce=new_nonce(), interactive=True)))
        inbox = h.data["inbox"]
        os.unlink(inbox)
        other = tmp_path / "other.txt"
        other.write_text("")
        os.mkfifo(inbox) if kind == "fifo" else os.symlink(other, inbox)
        async with asyncio.timeout(30):
            with pytest.raises(PermissionError, match="not a regular file" if kind == "fifo" else "symbolic link"):
                await provider.send_input(h, "i1", b'{"answer":"yes"}')
        assert other.read_text() == ""
    finally:
        await provider.destroy(h)
        await provider.close()


@pytest.mark.parametrize("way", ["direct", "daemon"])
async def test_bad_calls_get_the_same_answers_both_ways(tmp_path: pathlib.Path, way: str) -> None:
    """Negative offsets and limits, a directory read, a size below a file, a tar that is no
    tar, a copy onto a directory, NUL in an argument or a variable: one answer both ways, and
    nothing left behind."""
    from baton.errors import SandboxBuildFailed

    provider = LocalProvider(str(tmp_path / "sandboxes"), str(tmp_path / "journals"), idle_check=0.05,
                             sandbox_io=way)
    h = await provider.create("bad-calls", SandboxSpec())
    try:
        await provider.copy_in(h, "afile", b"x")
        os.mkdir(os.path.join(h.workdir, "adir"))
        for offset, limit in ((-1, None), (0, -1)):
            with pytest.raises(ValueError, match="must not be negative"):
                await provider.read_file(h, "afile", offset, limit)
        with pytest.raises(ValueError, match="is a directory"):
            await provider.read_file(h, "adir")
        for path, offset in (("adir", 0), ("afile", -1), ("../x", 0)):  # as the daemon's client says it
            with pytest.raises(OSError, match=f"following {path} failed"):
                async with contextlib.aclosing(provider.follow(h, path, offset)) as chunks:
                    async for _ in chunks:
                        pass
        assert await provider.file_size(h, "afile/x") is None
        with pytest.raises(SandboxBuildFailed, match="not a tar"):
            await provider.import_tree(h, b"no tar at all")
        with pytest.raises(OSError):
            await provider.copy_in(h, "adir", b"onto a directory")
        assert sorted(os.listdir(h.workdir)) == ["adir", "afile"]
        for argv, env in ((["tr\0ue"], None), (["true"], {"A": "x\0secret"}), (["true"], {"A=B": "v"})):
            with pytest.raises(SandboxBuildFailed) as refused:
                await provider.launch(h, argv, nonce=new_nonce(), env=env, stdin=b"first", interactive=True)
            assert refused.value.step == "launch" and "secret" not in str(refused.value)
        # A failed launch leaves none of its files (its nonce above all: the wrapper that
        # would have deleted it never ran).
        left = [name for _, _, names in os.walk(tmp_path) for name in names
                if name.startswith(("nonce-", "stdin-", "inbox-"))]
        assert left == []
    finally:
        await provider.destroy(h)
        await provider.close()


_FDS = """
import asyncio, json, os, sys
import uvloop
from baton.errors import SandboxBuildFailed
from sandbox_host.journal import new_nonce
from sandbox_host.providers import SandboxSpec
from sandbox_host.providers.local import LocalProvider

async def main():
    p = LocalProvider(sys.argv[1] + "/s", sys.argv[1] + "/j", idle_check=0.05, sandbox_io=sys.argv[2])
    h = await p.create("fds", SandboxSpec())
    data = await p.launch(h, ["sh", "-c", "ls -l /proc/$$/fd > ../fds.txt; sleep 30"], nonce=new_nonce())
    path = os.path.join(os.path.dirname(h.workdir), "fds.txt")
    for _ in range(3000):
        if os.path.exists(path) and open(path).read().strip():
            break
        await asyncio.sleep(0.01)
    fds = sorted(line.split("->")[0].split()[-1] + " " + line.split("->")[1].strip().split("/")[-1][:40]
                 for line in open(path) if "->" in line)
    refused = []
    for argv, env in ((["tr\\0ue"], None), (["true"], {"A": "x\\0secret"}), (["true"], {"A=B": "v"})):
        try:
            await p.launch(h, argv, nonce=new_nonce(), env=env)
        except SandboxBuildFailed as exc:
            refused.append("secret" not in str(exc))
    print(json.dumps({"fds": fds, "refused": refused}))
    await p.destroy(h)
    await p.close()

uvloop.run(main())
"""


async def test_the_agent_gets_no_descriptor_of_the_host_under_uvloop(tmp_path: pathlib.Path) -> None:
    """The host's loop is uvloop, which closes no descriptor in a child it spawns and checks
    no argument for NUL: launched on the machine, the agent still holds exactly the
    descriptors it holds launched by the daemon, and a NUL or a ``=`` in a variable's name is
    refused, not cut short."""
    import json
    import subprocess
    import sys

    got = {}
    for way in ("direct", "daemon"):
        # An inheritable descriptor in the host (as a supervisor may pass one down).
        r, w = os.pipe()
        os.set_inheritable(w, True)
        try:
            done = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-c", _FDS, str(tmp_path / way), way], capture_output=True,
                timeout=120, close_fds=False)
        finally:
            os.close(r)
            os.close(w)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        got[way] = json.loads(done.stdout)
    assert got["direct"] == got["daemon"], got
    assert not any(fd.split(" ", 1)[1].startswith(("pipe", "socket")) for fd in got["direct"]["fds"]), got
    assert got["direct"]["refused"] == [True, True, True], got


@pytest.mark.parametrize("way", ["direct", "daemon"])
@pytest.mark.parametrize("where", ["wrapper", "journal"])
async def test_a_fifo_left_by_an_earlier_agent_never_holds_a_launch(tmp_path: pathlib.Path, way: str,
                                                                   where: str) -> None:
    """An agent of an earlier launch (a relaunch's sandbox) put a FIFO nobody reads where the
    next launch writes its wrapper, or its journal: the wrapper is written anew beside it and
    renamed over it, the journal refused, at once either way (an open held the launch for good)."""
    from baton.errors import SandboxBuildFailed

    provider = LocalProvider(str(tmp_path / "sandboxes"), str(tmp_path / "journals"), idle_check=0.05,
                             sandbox_io=way)
    h = await provider.create(f"fifo-{where}", SandboxSpec())
    try:
        first = with_data(h, dict(await provider.launch(h, ["true"], nonce=new_nonce())))
        await assert_eventually(lambda: _not_alive(provider, first))
        before = os.path.getsize(h.journal_path)
        target = os.path.join(meta_dir(h), "wrapper.sh") if where == "wrapper" else h.journal_path
        os.unlink(target)
        os.mkfifo(target)
        nonce = new_nonce()
        async with asyncio.timeout(30):
            if where == "wrapper":
                h = with_data(h, dict(await provider.launch(h, ["sh", "-c", "echo again"], nonce=nonce)))
                items = await follow_all(provider, h, nonce, offset=before)
                assert [i.data for i in items if isinstance(i, JournalLine)] == [b"again"]
            else:
                with pytest.raises(SandboxBuildFailed, match="not a regular file"):
                    await provider.launch(h, ["true"], nonce=nonce)
    finally:
        await provider.destroy(h)
        await provider.close()
