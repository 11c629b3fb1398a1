"""Local sandboxes' daemons forked by the machine's fork server: what they serve is what a
daemon started as a command serves, they outlive the server, a server that is not there or
not safe to use leaves the start to the command, and bad requests get an error."""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
import shutil
import signal
import socket
import tempfile
from typing import AsyncIterator, Iterator

import grpc
import pytest

from baton.v1 import sandbox_daemon_pb2 as pb
from baton.v1 import sandbox_daemon_pb2_grpc as pb_grpc
from sandbox_host.daemon import _procs, forkserver
from sandbox_host.journal import new_nonce
from sandbox_host.providers import SandboxHandle, SandboxSpec
from sandbox_host.providers._local_daemon import ADDR_FILE, meta_dir
from sandbox_host.providers.local import LocalProvider
from tests.conftest import assert_eventually
from tests.sandbox.conftest import with_data

pytestmark = [pytest.mark.servers, pytest.mark.timeout(120)]


@pytest.fixture
def server_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    """A fork server address of this test's own (a short ``0700`` directory: a Unix
    socket's path is short); the server started there is killed afterwards."""
    top = pathlib.Path(tempfile.mkdtemp(prefix="bfs-"))
    monkeypatch.setattr(forkserver, "address", lambda stamp: (str(top), str(top / "sock")))
    try:
        yield top
    finally:
        pid = _server_pid(top)
        if pid:
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(top, ignore_errors=True)


def _server_pid(top: pathlib.Path) -> int | None:
    try:
        pid = int((top / "spawned").read_text())
    except (OSError, ValueError):
        return None
    st = _procs.proc_stat(pid)
    return pid if st is not None and st[0] != "Z" else None


def _ppid(pid: int) -> int:
    return int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _daemon_pid(h: SandboxHandle) -> int:
    return int((pathlib.Path(meta_dir(h)) / ADDR_FILE).read_text().split()[1])


@pytest.fixture
async def host(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LocalProvider]:
    monkeypatch.setenv("BATON_INTERNAL_TOKEN", "cluster-token-for-the-fork-server-test")
    p = LocalProvider(str(tmp_path / "sandboxes"), str(tmp_path / "journals"), idle_check=0.05)
    try:
        yield p
    finally:
        await p.close()


async def _ran(host: LocalProvider, h: SandboxHandle, text: str) -> None:
    h = with_data(h, await host.launch(h, ["sh", "-c", f"echo {text}"], nonce=new_nonce()))

    async def done() -> bool:
        return text.encode() in await host.read_file(h, h.journal_path)
    await assert_eventually(done, timeout=30)


async def _daemon_of_server(host: LocalProvider, server_dir: pathlib.Path, key: str) -> tuple[SandboxHandle, int]:
    """A sandbox whose daemon the fork server forked → (handle, the server's pid). The
    first start on a new address goes as a command and starts the server."""
    first = await host.create(f"{key}-first", SandboxSpec())
    await host._daemons.resolve(first)
    await assert_eventually(lambda: (server_dir / "sock").exists() and _server_pid(server_dir), timeout=60)
    await host.destroy(first)
    h = await host.create(key, SandboxSpec())
    await host._daemons.resolve(h)
    server = _server_pid(server_dir)
    assert server is not None and _ppid(_daemon_pid(h)) == server  # forked by it
    return h, server


async def test_a_forked_daemon_serves_its_sandbox_under_its_own_command_and_token(
        host: LocalProvider, server_dir: pathlib.Path) -> None:
    h, _ = await _daemon_of_server(host, server_dir, "forked-run")
    try:
        pid = _daemon_pid(h)
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
        assert b"-m sandbox_host.daemon --listen" in cmdline and meta_dir(h).encode() in cmdline
        assert os.readlink(f"/proc/{pid}/cwd") == meta_dir(h)
        assert os.getsid(pid) == pid  # a session of its own, as a started command's
        await _ran(host, h, "forked-daemon-ran")
        # Its environment is the request's: the sandbox's token, which a call without it lacks.
        addr = (pathlib.Path(meta_dir(h)) / ADDR_FILE).read_text().split()[0]
        async with grpc.aio.insecure_channel(addr, options=[("grpc.enable_http_proxy", 0)]) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await pb_grpc.SandboxDaemonStub(ch).FileSize(pb.FileSizeRequest(path=h.journal_path))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await host.destroy(h)


async def test_a_forked_daemon_outlives_its_fork_server_and_the_next_start_needs_none(
        host: LocalProvider, server_dir: pathlib.Path) -> None:
    h, server = await _daemon_of_server(host, server_dir, "outliving-run")
    try:
        os.kill(server, signal.SIGKILL)
        await assert_eventually(lambda: _server_pid(server_dir) is None, timeout=30)
        await _ran(host, h, "after-the-server-died")  # the same daemon, still serving
        later = await host.create("after-the-server", SandboxSpec())
        try:
            await _ran(host, later, "started-without-a-server")
        finally:
            await host.destroy(later)
    finally:
        await host.destroy(h)


async def test_no_fork_server_in_a_directory_others_may_write(host: LocalProvider, server_dir: pathlib.Path) -> None:
    server_dir.chmod(0o777)
    h = await host.create("shared-dir-run", SandboxSpec())
    try:
        await _ran(host, h, "started-as-a-command")
        assert not (server_dir / "sock").exists() and _server_pid(server_dir) is None
    finally:
        await host.destroy(h)


def _ask(sock: pathlib.Path, payload: bytes) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(sock))
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        return json.loads(s.makefile("rb").readline())


async def test_bad_requests_get_an_error_and_the_server_serves_on(
        host: LocalProvider, server_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    h, server = await _daemon_of_server(host, server_dir, "bad-requests-run")
    await host.destroy(h)
    sock = server_dir / "sock"
    bad = [b"not json\n", b"[1, 2]\n", b'{"argv": "x", "env": {}, "cwd": "/", "log": "/tmp/l"}\n',
           b'{"argv": [], "env": {"A": 1}, "cwd": "/", "log": "/tmp/l"}\n',
           b'{"argv": [], "env": {}, "cwd": "relative", "log": "/tmp/l"}\n',
           b"\xff\xfe\n", b"{" + b" " * (forkserver.MAX_REQUEST + 10) + b"\n"]
    for payload in bad:
        answer = await asyncio.to_thread(_ask, sock, payload)
        assert set(answer) == {"error"}, (payload[:40], answer)
    # Still serving: a good request forks a daemon that serves.
    root = tmp_path / "root"
    (root / ".baton").mkdir(parents=True)
    addr = root / "addr"
    request = {"argv": ["--listen", "127.0.0.1:0", "--root", str(root), "--addr-file", str(addr)],
               "env": {"PATH": os.environ["PATH"]}, "cwd": str(root), "log": str(root / "log")}
    answer = await asyncio.to_thread(_ask, sock, json.dumps(request).encode() + b"\n")
    try:
        await assert_eventually(addr.exists, timeout=30)
        assert addr.read_text().split()[1] == str(answer["pid"]) and _server_pid(server_dir) == server
    finally:
        os.kill(answer["pid"], signal.SIGKILL)
