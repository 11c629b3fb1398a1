"""The sandbox daemon's ``Exec`` (a workspace's setup command) through its client, on a real
daemon process: exit codes, the output's bounded and redacted tail, the environment, the
timeout and the caller's cancel killing the whole process group, confined paths, the token."""
from __future__ import annotations

import asyncio
import pathlib
from typing import AsyncIterator, Iterator

import grpc
import pytest

from baton.errors import SandboxBuildFailed
from sandbox_host.daemon import sandbox_token
from sandbox_host.providers._daemon_client import DaemonClient
from tests.conftest import assert_eventually, process_state
from tests.sandbox.daemon_support import DaemonProcess, running

pytestmark = [pytest.mark.timeout(120), pytest.mark.servers]
TOKEN = sandbox_token("cluster-secret", "sbx-exec")


@pytest.fixture
def daemon(tmp_path: pathlib.Path) -> Iterator[DaemonProcess]:
    for d in ("work", "home"):
        (tmp_path / d).mkdir()
    yield from running(DaemonProcess([tmp_path / "work", tmp_path / "home"], token=TOKEN))


@pytest.fixture
async def client(daemon: DaemonProcess) -> AsyncIterator[DaemonClient]:
    c = daemon.client()
    yield c
    await c.close()


async def test_a_command_runs_in_the_workspace_with_the_agents_environment(
        client: DaemonClient, tmp_path: pathlib.Path) -> None:
    got = await client.exec(
        ["sh", "-c", 'echo "$PWD|$HOME|$CODEX_HOME|$MODE|${BATON_INTERNAL_TOKEN:-none}"; echo err >&2; '
                     "echo made > made.txt; exit 3"],
        timeout=60, env={"MODE": "setup"}, home=str(tmp_path / "home"))
    work, home = tmp_path / "work", tmp_path / "home"
    assert got.exit_code == 3 and not got.timed_out
    assert got.output.decode().splitlines() == [f"{work}|{home}|{home}/.codex|setup|none", "err"]
    assert got.output_bytes == len(got.output)
    assert (work / "made.txt").read_text() == "made\n"


async def test_the_output_kept_is_its_tail_and_secrets_never_show(client: DaemonClient) -> None:
    secret = "tok-0123456789abcdef-SECRET"
    # 300 KB of output, then the secret twice.
    script = 'head -c 300000 /dev/zero | tr "\\0" x; echo; echo "$API_KEY"; printf "%s" "$API_KEY"; echo " end"'
    got = await client.exec(["sh", "-c", script], timeout=60, secrets={"API_KEY": secret}, output_limit=1000)
    assert got.exit_code == 0 and got.output_bytes == 300001 + 2 * (len(secret) + 1) + 4
    assert len(got.output) <= 1000 and secret.encode() not in got.output
    assert got.output.decode().endswith("[REDACTED]\n[REDACTED] end\n")
    # A tail that begins inside a secret shows none of it either.
    for limit in range(len(secret) - 6, len(secret) + 12, 3):
        cut = await client.exec(["sh", "-c", 'printf "%s-" "$API_KEY"; echo done'], timeout=60,
                                secrets={"API_KEY": secret}, output_limit=limit)
        assert cut.output.endswith(b"done\n")
        assert not any(secret[i:].encode() in cut.output for i in range(1, len(secret) - 2))


async def test_the_timeout_kills_the_whole_process_group(client: DaemonClient, tmp_path: pathlib.Path) -> None:
    pid_file = tmp_path / "work" / "child.pid"
    got = await client.exec(["sh", "-c", f"sleep 300 & echo $! > {pid_file}; echo started; wait"], timeout=1.0)
    assert got.timed_out and got.exit_code == -9 and got.output == b"started\n"
    child = int(pid_file.read_text())
    await assert_eventually(lambda: _dead(child), timeout=30)


async def test_a_cancelled_call_kills_the_command(client: DaemonClient, tmp_path: pathlib.Path) -> None:
    pid_file = tmp_path / "work" / "cmd.pid"
    call = asyncio.ensure_future(client.exec(["sh", "-c", f"echo $$ > {pid_file}; exec sleep 300"], timeout=600))
    await assert_eventually(lambda: pid_file.exists() and pid_file.read_text().strip() != "", timeout=30)
    pid = int(pid_file.read_text())
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await assert_eventually(lambda: _dead(pid), timeout=30)


async def test_paths_are_confined_and_bad_commands_refused_clearly(client: DaemonClient, tmp_path: pathlib.Path) -> None:
    for workdir, words in (("/etc", "outside"), ("../x", "climbs out")):
        with pytest.raises(SandboxBuildFailed) as refused:
            await client.exec(["true"], timeout=10, workdir=workdir)
        assert refused.value.step == "exec" and words in refused.value.detail
    with pytest.raises(SandboxBuildFailed) as missing:
        await client.exec(["/no/such/program-hush-hush"], timeout=10, secrets={"S": "hush-hush"})
    assert "did not start" in missing.value.detail and "hush-hush" not in str(missing.value)
    with pytest.raises(SandboxBuildFailed, match="argv must not be empty"):
        await client.exec([], timeout=10)


async def test_the_sandbox_token_is_required(daemon: DaemonProcess, tmp_path: pathlib.Path) -> None:
    wrong = daemon.client(token="not-it")
    try:
        with pytest.raises(SandboxBuildFailed) as refused:
            await wrong.exec(["sh", "-c", "touch ran"], timeout=10)
        assert grpc.StatusCode.UNAUTHENTICATED.name in refused.value.detail
    finally:
        await wrong.close()
    assert not (tmp_path / "work" / "ran").exists()


def _dead(pid: int) -> bool:
    """Gone (``""``: its ``/proc`` entry vanished, even between open and read) or a zombie
    (nobody reaps it: it runs no more)."""
    return process_state(pid) in ("", "Z", "X")
