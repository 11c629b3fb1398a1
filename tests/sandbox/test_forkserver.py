"""Local sandboxes' daemons forked by the machine's fork server: what they serve is what a
daemon started as a command serves, they outlive the server, a server that is not there or
not safe to use leaves the start to the command, and bad requests get an error."""
from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import pathlib
import resource
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from typing import AsyncIterator, Iterator

import grpc
import pytest

from baton.v1 import sandbox_daemon_pb2 as pb
from baton.v1 import sandbox_daemon_pb2_grpc as pb_grpc
from sandbox_host.daemon import forkserver
from sandbox_host.journal import new_nonce
from sandbox_host.providers import SandboxHandle, SandboxSpec
from sandbox_host.providers import _local_daemon
from sandbox_host.providers._local_daemon import ADDR_FILE, meta_dir
from sandbox_host.providers.local import LocalProvider
from tests.conftest import assert_eventually, require
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
    """The live fork server's pid: the holder of its lock."""
    return _local_daemon._lock_holder(str(top / "lock"))


def _ppid(pid: int) -> int:
    return int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _daemon_pid(h: SandboxHandle) -> int:
    return int((pathlib.Path(meta_dir(h)) / ADDR_FILE).read_text().split()[1])


@pytest.fixture
async def host(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LocalProvider]:
    monkeypatch.setenv("BATON_INTERNAL_TOKEN", "cluster-token-for-the-fork-server-test")
    p = LocalProvider(str(tmp_path / "sandboxes"), str(tmp_path / "journals"), idle_check=0.05, sandbox_io="daemon")
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
        command = [sys.executable, "-m", "sandbox_host.daemon", *host._daemons._argv(h, meta_dir(h))]
        assert len(" ".join(command)) > 380  # more than a title fits without the server's room for it
        assert cmdline.rstrip(b"\0") == " ".join(command).encode()  # all of it, as ps shows it
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


def _no_answer_server(sock: pathlib.Path, connections: list[float]) -> socket.socket:
    """A listener at ``sock`` that takes connections (their times into ``connections``) and
    never answers: a hung fork server. Closed by the caller."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock))
    listener.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the test is over
                for c in held:
                    c.close()
                return
            connections.append(time.monotonic())
            held.append(conn)
    threading.Thread(target=accept, daemon=True).start()
    return listener


async def test_a_hung_fork_server_delays_one_start_then_is_left_alone(
        host: LocalProvider, server_dir: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_local_daemon, "FORK_TIMEOUT", 1.0)
    connections: list[float] = []
    listener = _no_answer_server(server_dir / "sock", connections)
    try:
        first = await host.create("hung-server-first", SandboxSpec())
        second = await host.create("hung-server-second", SandboxSpec())
        try:
            await _ran(host, first, "started-after-the-wait")
            await _ran(host, second, "started-without-asking")
        finally:
            await host.destroy(first)
            await host.destroy(second)
        assert len(connections) == 1  # asked once, then left alone for FORKSERVER_RESTART
    finally:
        listener.close()


async def test_silent_connections_to_the_fork_server_delay_no_start(
        host: LocalProvider, server_dir: pathlib.Path) -> None:
    """Clients that connect and say nothing (or half a request), more of them than the
    server reads at once, are read beside the others and make room for the next: a host's
    start is still forked at once, not left to the command after its timeout."""
    h, server = await _daemon_of_server(host, server_dir, "before-the-silent-ones")
    await host.destroy(h)
    silent = []
    try:
        for i in range(forkserver.MAX_PENDING + 100):
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(str(server_dir / "sock"))
            if i % 2:
                c.sendall(b'{"argv": [')
            silent.append(c)
        later = await host.create("beside-the-silent-ones", SandboxSpec())
        try:
            await host._daemons.resolve(later)
            assert _ppid(_daemon_pid(later)) == server  # forked, not started as a command
            await _ran(host, later, "forked-beside-silent-clients")
        finally:
            await host.destroy(later)
    finally:
        for c in silent:
            c.close()


async def test_a_fork_server_that_keeps_not_answering_is_left_alone_longer_each_time(
        host: LocalProvider, server_dir: pathlib.Path, tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(_local_daemon, "FORK_TIMEOUT", 0.2)
    monkeypatch.setattr(_local_daemon, "FORKSERVER_RESTART", 0.2)
    connections: list[float] = []
    listener = _no_answer_server(server_dir / "sock", connections)
    # The lock held: the servers the host starts after each miss exit at once, leaving the
    # hung one in place.
    lock = os.open(server_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    meta = tmp_path / "meta"
    meta.mkdir()
    daemons = host._daemons
    try:
        for _ in range(4):
            await assert_eventually(lambda: time.monotonic() >= daemons._forkserver_off, timeout=30)
            with caplog.at_level(logging.WARNING, logger=_local_daemon.__name__):
                assert await daemons._fork(["--help"], {}, str(meta)) is None
    finally:
        listener.close()
        os.close(lock)
    assert len(connections) == 4
    offs = [r.getMessage().rsplit(" for ", 1)[1] for r in caplog.records if "did not answer" in r.getMessage()]
    assert offs == ["0.2 s", "0.4 s", "0.8 s", "1.6 s"]  # doubled at each miss in a row


async def test_starts_waiting_on_one_hung_server_count_one_miss(
        host: LocalProvider, server_dir: pathlib.Path, tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A burst of starts that all wait on the same hung server leaves it alone for the first
    miss's time, not for as many doublings as there were starts; the starts queued behind
    the ones asking (FORK_ASKS) do not ask it again."""
    monkeypatch.setattr(_local_daemon, "FORK_TIMEOUT", 0.5)
    connections: list[float] = []
    listener = _no_answer_server(server_dir / "sock", connections)
    lock = os.open(server_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # no server of the host's replaces the hung one
    meta = tmp_path / "meta"
    meta.mkdir()
    try:
        with caplog.at_level(logging.WARNING, logger=_local_daemon.__name__):
            n = _local_daemon.FORK_ASKS + 10
            answers = await asyncio.gather(*[host._daemons._fork(["--help"], {}, str(meta)) for _ in range(n)])
    finally:
        listener.close()
        os.close(lock)
    # At most the FORK_ASKS open at once asked (fewer when the first miss came before all
    # had connected, on a loaded machine); the ten queued behind them never did.
    assert answers == [None] * n and 0 < len(connections) <= _local_daemon.FORK_ASKS
    misses = [r.getMessage() for r in caplog.records if "did not answer" in r.getMessage()]
    assert len(misses) == 1 and misses[0].endswith(" for 10 s"), misses


async def test_a_server_that_goes_away_with_the_request_is_replaced_not_waited_out(
        host: LocalProvider, server_dir: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    """A connection the server ends unanswered (it was killed, or is stopping) is not a hung
    server: no back-off, and a server is started for the next daemons."""
    sock = server_dir / "sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock))
    listener.listen(16)

    def close_each() -> None:
        with listener:
            conn, _ = listener.accept()
            conn.close()
    closer = threading.Thread(target=close_each, daemon=True)
    closer.start()
    with caplog.at_level(logging.WARNING, logger=_local_daemon.__name__):
        first = await host.create("server-went-away", SandboxSpec())
    try:
        await _ran(host, first, "started-as-a-command")
        closer.join(timeout=30)
        assert not [r for r in caplog.records if "did not answer" in r.getMessage()]
        # The server the host started replaced the dead one's socket: the next start is forked.
        await assert_eventually(lambda: _server_pid(server_dir) is not None and _listening(sock), timeout=60)
        server = _server_pid(server_dir)
        later = await host.create("after-the-replacement", SandboxSpec())
        try:
            await host._daemons.resolve(later)
            assert _ppid(_daemon_pid(later)) == server
        finally:
            await host.destroy(later)
    finally:
        await host.destroy(first)


def _listening(sock: pathlib.Path) -> bool:
    """Whether something listens at ``sock`` (the file alone may be a dead listener's)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        try:
            c.connect(str(sock))
        except OSError:
            return False
    return True


def _server_command(top: pathlib.Path, idle_exit: float = 60) -> list[str]:
    return [sys.executable, "-m", "sandbox_host.daemon.forkserver", "--socket", str(top / "sock"),
            "--lock", str(top / "lock"), "--idle-exit", str(idle_exit)]


async def test_sigterm_stops_the_server_in_the_middle_of_a_burst(server_dir: pathlib.Path,
                                                                 tmp_path: pathlib.Path) -> None:
    """SIGTERM ends the server while it forks (a handler that raised could run inside fork's
    hooks, which drop the exception: the server went on until its idle exit)."""
    proc = await asyncio.create_subprocess_exec(*_server_command(server_dir), stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.DEVNULL)
    try:
        await assert_eventually(lambda: (server_dir / "sock").exists(), timeout=60)
        request = json.dumps({"argv": ["--help"], "env": {"PATH": os.environ["PATH"]}, "cwd": str(tmp_path),
                              "log": str(tmp_path / "log"), "until": time.time() + 600}).encode() + b"\n"
        stop = threading.Event()

        def burst() -> None:
            while not stop.is_set():
                try:
                    _ask(server_dir / "sock", request)
                except (OSError, ValueError):
                    return  # it stopped
        threads = [threading.Thread(target=burst, daemon=True) for _ in range(2)]
        for t in threads:
            t.start()
        await assert_eventually(lambda: (tmp_path / "log").exists(), timeout=30)  # forking
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await proc.wait() == 0
        assert not (server_dir / "sock").exists()
    finally:
        stop.set()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_burst_of_starts_past_what_the_server_reads_at_once_is_forked_in_full(
        host: LocalProvider, server_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """More starts at once from one host than the server reads at once are all forked: the
    host keeps FORK_ASKS open (under asyncio every start's connect came before any start's
    bytes, and a loaded host sent them later than the server waits for a silent one), the
    server leaves the rest in its backlog."""
    h, server = await _daemon_of_server(host, server_dir, "before-the-burst")
    await host.destroy(h)
    meta = tmp_path / "meta"
    meta.mkdir()
    n = forkserver.MAX_PENDING + 60
    env = {"PATH": os.environ["PATH"]}
    pids = await asyncio.gather(*[host._daemons._fork(["--help"], env, str(meta)) for _ in range(n)])
    assert all(isinstance(pid, int) for pid in pids), sum(pid is None for pid in pids)
    assert len(set(pids)) == n and _server_pid(server_dir) == server


async def test_a_new_server_waits_for_the_lock_a_stopping_one_still_holds(server_dir: pathlib.Path) -> None:
    """Hosts start the next server as soon as the old one's socket is gone, which is before
    its exit frees the lock: the new one waits that moment out instead of leaving."""
    lock = os.open(server_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # the stopping server's
    proc = await asyncio.create_subprocess_exec(*_server_command(server_dir), stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.DEVNULL)
    try:
        await assert_eventually(lambda: _sleeping(proc.pid), timeout=30)  # it waits on the lock
        os.close(lock)  # the old one's exit
        await assert_eventually(lambda: (server_dir / "sock").exists(), timeout=30)
        assert _server_pid(server_dir) == proc.pid and proc.returncode is None
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


def _sleeping(pid: int) -> bool:
    return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "S"


async def test_with_few_descriptors_silent_connections_make_room_for_a_start(
        server_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """Under a low open-file limit the server reads fewer connections at once, and the
    silent ones make room: a start is answered within a host's wait (FORK_TIMEOUT), not
    after every silent one timed out."""
    def few_fds() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    proc = await asyncio.create_subprocess_exec(*_server_command(server_dir), stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.DEVNULL, preexec_fn=few_fds)
    silent = []
    try:
        await assert_eventually(lambda: (server_dir / "sock").exists(), timeout=60)
        for _ in range(300):
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.setblocking(False)
            try:
                c.connect(str(server_dir / "sock"))
            except BlockingIOError:
                pass  # in the backlog
            silent.append(c)
        request = {"argv": ["--help"], "env": {"PATH": os.environ["PATH"]}, "cwd": str(tmp_path),
                   "log": str(tmp_path / "log"), "until": time.time() + _local_daemon.FORK_TIMEOUT}
        answer = await asyncio.to_thread(_ask, server_dir / "sock", json.dumps(request).encode() + b"\n",
                                         _local_daemon.FORK_TIMEOUT)
        assert isinstance(answer.get("pid"), int), answer
    finally:
        for c in silent:
            c.close()
        proc.kill()
        await proc.wait()


def _foreign_listener(sock: pathlib.Path, record: pathlib.Path) -> int:
    """Fork a child that binds ``sock`` and opens ``record`` as this user, then becomes
    ``nobody`` and listens (the peer credentials a client sees are the listener's at
    ``listen``), takes one connection and writes what it sent into ``record`` → its pid."""
    pid = os.fork()
    if pid == 0:
        try:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(sock))
            out = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.setgid(65534)
            os.setuid(65534)
            listener.listen(4)
            listener.settimeout(60)
            conn, _ = listener.accept()
            conn.settimeout(5)
            data = b""
            try:
                while part := conn.recv(65536):
                    data += part
            except OSError:
                pass
            os.write(out, b"connected\n" + data)
        finally:
            os._exit(0)
    return pid


async def test_a_socket_another_user_listens_on_gets_no_request(
        host: LocalProvider, server_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """The request holds the sandbox's token: a listener of another user never sees it."""
    require(os.geteuid() == 0, "needs root (to listen as another user)")
    sock, record = server_dir / "sock", tmp_path / "record"
    pid = _foreign_listener(sock, record)
    try:
        await assert_eventually(sock.exists, timeout=30)
        h = await host.create("foreign-listener-run", SandboxSpec())
        try:
            await _ran(host, h, "started-as-a-command")
        finally:
            await host.destroy(h)
        await assert_eventually(lambda: record.exists() and record.read_bytes(), timeout=30)
        assert record.read_bytes() == b"connected\n"  # it saw who listens, and sent nothing
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)


def _ask(sock: pathlib.Path, payload: bytes, timeout: float = 30) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
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
           b'{"argv": [], "env": {}, "cwd": "/nonexistent/dir", "log": "/tmp/l", "until": 1e12}\n',
           b"\xff\xfe\n", b"{" + b" " * (forkserver.MAX_REQUEST + 10) + b"\n", b"[" * 100_000 + b"\n",
           b'{"argv": [], "env": {}, "cwd": "/", "log": "/tmp/l", "until": 1}\n']
    for payload in bad:
        answer = await asyncio.to_thread(_ask, sock, payload)
        assert set(answer) == {"error"}, (payload[:40], answer)
    # Still serving: a good request forks a daemon that serves.
    root = tmp_path / "root"
    (root / ".baton").mkdir(parents=True)
    addr = root / "addr"
    request = {"argv": ["--listen", "127.0.0.1:0", "--root", str(root), "--addr-file", str(addr)],
               "env": {"PATH": os.environ["PATH"]}, "cwd": str(root), "log": str(root / "log"),
               "until": time.time() + 30}
    answer = await asyncio.to_thread(_ask, sock, json.dumps(request).encode() + b"\n")
    try:
        await assert_eventually(addr.exists, timeout=30)
        assert addr.read_text().split()[1] == str(answer["pid"]) and _server_pid(server_dir) == server
    finally:
        os.kill(answer["pid"], signal.SIGKILL)


async def test_a_socket_path_too_long_for_unix_leaves_starts_to_the_command(
        host: LocalProvider, monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    top = tmp_path / ("d" * 120)
    monkeypatch.setattr(forkserver, "address", lambda stamp: (str(top), str(top / "sock")))
    h = await host.create("long-socket-path-run", SandboxSpec())
    try:
        await _ran(host, h, "started-as-a-command")
        assert not host._daemons.forkserver and not top.exists()  # no server tried
    finally:
        await host.destroy(h)
