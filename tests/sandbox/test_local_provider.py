"""The local provider: workspace sources, setup commands, secrets, launch, kill, destroy,
and the agent surviving a SIGKILL of the host process that launched it."""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
import subprocess
import sys
from typing import Any

import pytest

from baton.errors import SandboxBuildFailed
from baton_tools.testing.servers import env_without_proxy
from sandbox_host.journal import JournalExit, JournalLine, new_nonce
from sandbox_host.providers import SandboxHandle, SandboxSpec, provider_for, redact
from sandbox_host.providers.local import LocalProvider
from tests.conftest import REPO, assert_eventually
from tests.sandbox.conftest import CORPUS, follow_all, with_data


def test_registry_and_redact() -> None:
    p = provider_for("local", base_dir="/tmp/x", journal_dir="/tmp/y")
    assert isinstance(p, LocalProvider) and p.killable_processes and p.can_follow
    with pytest.raises(ValueError):
        provider_for("nope")
    assert redact("key=sk-abcdef and sk-abcdef-long", {"K": "sk-abcdef", "L": "sk-abcdef-long"}) == (
        "key=[REDACTED] and [REDACTED]"
    )


@pytest.mark.servers  # starts processes: not a unit test
async def test_local_path_workspace_and_setup_in_order(
    local_provider: LocalProvider, sandboxes: list, tmp_path: pathlib.Path
) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "a.txt").write_text("hello")
    spec = SandboxSpec(workspace=str(src), setup=("echo one >> order.txt", "echo two >> order.txt"),
                       env={"GREETING": "hi"})
    h = await local_provider.create("ws-copy", spec)
    sandboxes.append(h)
    assert (pathlib.Path(h.workdir) / "sub" / "a.txt").read_text() == "hello"
    assert (pathlib.Path(h.workdir) / "order.txt").read_text() == "one\ntwo\n"
    assert h.journal_path.endswith("/ws-copy.ndjson") and h.data["dir"]
    assert await local_provider.exists(h)
    assert await local_provider.destroy(h)
    assert not await local_provider.exists(h) and not os.path.exists(h.journal_path)
    assert src.exists()


@pytest.mark.servers  # starts processes: not a unit test
async def test_git_workspace_at_ref(local_provider: LocalProvider, sandboxes: list, tmp_path: pathlib.Path) -> None:
    bare = tmp_path / "repo.git"
    work = tmp_path / "work"
    env = {**env_without_proxy(), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e"}

    def git(*args: str, cwd: pathlib.Path | None = None) -> str:
        return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout

    git("init", "-q", "--bare", str(bare))
    git("clone", "-q", str(bare), str(work))
    (work / "f.txt").write_text("v1")
    git("add", ".", cwd=work)
    git("commit", "-qm", "v1", cwd=work)
    git("tag", "v1", cwd=work)
    (work / "f.txt").write_text("v2")
    git("commit", "-qam", "v2", cwd=work)
    git("push", "-q", "origin", "HEAD", "--tags", cwd=work)
    first = git("rev-parse", "v1", cwd=work).strip()

    for key, ref, want in [("g-tag", "v1", "v1"), ("g-sha", first, "v1"), ("g-head", None, "v2")]:
        h = await local_provider.create(key, SandboxSpec(workspace=str(bare), git_ref=ref))
        sandboxes.append(h)
        assert (pathlib.Path(h.workdir) / "f.txt").read_text() == want

    with pytest.raises(SandboxBuildFailed) as ei:
        await local_provider.create("g-bad", SandboxSpec(workspace=str(bare), git_ref="no-such-ref"))
    assert ei.value.step == "workspace" and "no-such-ref" in ei.value.detail
    assert not (pathlib.Path(local_provider.base_dir) / "g-bad").exists()


@pytest.mark.servers  # starts processes: not a unit test
async def test_failing_setup_fails_build_with_redacted_stderr(local_provider: LocalProvider) -> None:
    secret = "sk-live-0123456789"
    spec = SandboxSpec(setup=("true", 'echo "token $API_KEY rejected" >&2; exit 3', "touch never"),
                       secrets={"API_KEY": secret})
    assert secret not in repr(spec)
    with pytest.raises(SandboxBuildFailed) as ei:
        await local_provider.create("setup-fails", spec)
    assert ei.value.step == "setup[1]"
    assert ei.value.detail == "exit 3: token [REDACTED] rejected"
    assert secret not in str(ei.value)
    assert not (pathlib.Path(local_provider.base_dir) / "setup-fails").exists()


@pytest.mark.servers  # starts processes: not a unit test
async def test_launch_hides_nonce_and_passes_secrets_as_env(local_provider: LocalProvider, sandboxes: list) -> None:
    """The agent sees its secrets in env, never the nonce (env, argv or the nonce file)."""
    nonce = new_nonce()
    h = await local_provider.create("nonce", SandboxSpec())
    sandboxes.append(h)
    script = (
        'printf "%s\\n" "$SECRET_X"; env; printf "%s\\n" "$@"; cat /proc/$PPID/cmdline | tr "\\0" " ";'
        ' echo; ls -a ../.baton; cat; echo; echo err >&2'
    )
    data = await local_provider.launch(h, ["sh", "-c", script, "agent"], nonce=nonce, stdin=b"the prompt",
                                       env={"PLAIN": "1"}, secrets={"SECRET_X": "s3cr3t-value"})
    h = with_data(h, dict(data))
    sandboxes[-1] = h
    assert isinstance(data["pgid"], int)
    items = await follow_all(local_provider, h, nonce)
    assert isinstance(items[-1], JournalExit) and items[-1].code == 0
    out = b"\n".join(i.data for i in items if isinstance(i, JournalLine)).decode()
    assert out.startswith("s3cr3t-value\n")
    assert "PLAIN=1" in out and "the prompt" in out
    assert nonce not in out
    lines = out.split("\n")
    assert "wrapper.sh" in lines and any(n.startswith("stdin-") for n in lines)  # the `ls -a ../.baton` listing
    assert not [ln for ln in lines if ln.startswith("nonce-")]  # deleted before the agent started
    assert pathlib.Path(h.stderr_path).read_text() == "err\n"


@pytest.mark.servers  # starts processes: not a unit test
async def test_kill_group_and_destroy(local_provider: LocalProvider, sandboxes: list) -> None:
    nonce = new_nonce()
    h = await local_provider.create("kill", SandboxSpec())
    sandboxes.append(h)
    h = with_data(h, dict(await local_provider.launch(h, ["sh", "-c", "sleep 60 & sleep 60"], nonce=nonce)))
    sandboxes[-1] = h
    assert await local_provider.processes_alive(h)
    assert await local_provider.kill(h, signal.SIGTERM)
    # SIGTERM: the agent dies, the wrapper survives it and writes the sentinel (143).
    items = await follow_all(local_provider, h, nonce)
    assert items == [JournalExit(143, 0, os.path.getsize(h.journal_path))]
    # The sentinel is the wrapper's last write; it exits right after.
    await assert_eventually(lambda: _not(local_provider.processes_alive(h)))
    assert not await local_provider.kill(h, signal.SIGTERM)
    assert await local_provider.destroy(h)
    assert not await local_provider.destroy(h)


@pytest.mark.servers  # starts processes: not a unit test
async def test_destroy_removes_a_journal_the_agent_made_a_directory(local_provider: LocalProvider,
                                                                    sandboxes: list) -> None:
    """An agent that replaced its journal with a directory (files in it) leaves nothing
    behind its destroy: neither that directory nor its stderr file."""
    nonce = new_nonce()
    h = await local_provider.create("journal-dir", SandboxSpec())
    sandboxes.append(h)
    script = 'rm -f "$J"; mkdir -p "$J/sub"; echo x > "$J/sub/f"; echo err >&2'
    h = with_data(h, dict(await local_provider.launch(h, ["sh", "-c", script], nonce=nonce,
                                                     env={"J": h.journal_path})))
    await assert_eventually(lambda: os.path.isfile(os.path.join(h.journal_path, "sub", "f")))
    await assert_eventually(lambda: _not(local_provider.processes_alive(h)))
    assert os.path.exists(h.stderr_path)
    assert await local_provider.destroy(h)
    assert not os.path.exists(h.journal_path) and not os.path.exists(h.stderr_path)
    assert not os.path.exists(h.data["dir"])


@pytest.mark.servers  # starts processes: not a unit test
async def test_liveness_is_looked_up_on_this_machine_without_the_daemon(
        local_provider: LocalProvider, sandboxes: list) -> None:
    """``processes_alive`` reads the agent's group here: a member that outlived the group's
    leader counts, and the sandbox's daemon is neither asked nor started again (it is down;
    on the machine, none ever ran)."""
    from sandbox_host.daemon import _procs
    from sandbox_host.providers._local_daemon import _running_and_addr, meta_dir

    h = await local_provider.create("alive", SandboxSpec())
    sandboxes.append(h)
    h = with_data(h, dict(await local_provider.launch(h, ["sh", "-c", "sleep 60 & sleep 60"], nonce=new_nonce())))
    sandboxes[-1] = h
    pgid = int(h.data["pgid"])
    assert await local_provider._daemons.stop(h) == (local_provider.sandbox_io == "daemon")

    def daemon_running() -> bool:
        return bool(_running_and_addr(meta_dir(h))[0])

    await assert_eventually(lambda: not daemon_running())
    # Both sleeps started (the launch returns once the wrapper leads its group, maybe
    # before the agent's shell forked them): killed sooner, no member would outlive it.
    await assert_eventually(lambda: _members(pgid, "sleep") == 2, timeout=30)
    os.kill(pgid, signal.SIGKILL)  # the group's leader (the wrapper); its sleeps live on
    await assert_eventually(lambda: (_procs.proc_stat(pgid) or ("Z",))[0] == "Z")
    assert await local_provider.processes_alive(h)
    os.killpg(pgid, signal.SIGKILL)
    await assert_eventually(lambda: _not(local_provider.processes_alive(h)))
    assert not daemon_running()


def _members(pgid: int, comm: str) -> int:
    """Live processes of group ``pgid`` named ``comm`` (from ``/proc``)."""
    n = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            raw = pathlib.Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2:].split()
        own = raw[raw.find(b"(") + 1:raw.rfind(b")")].decode(errors="replace")
        n += own == comm and int(fields[2]) == pgid and fields[0] != b"Z"
    return n


async def _not(value: "asyncio.Future[bool] | Any") -> bool:
    return not await value


_LAUNCHER = """
import asyncio, json, sys
from sandbox_host.agents import load_files, prepare_agent
from sandbox_host.providers import SandboxSpec
from sandbox_host.providers.local import LocalProvider

async def main():
    base, journals, nonce = sys.argv[1:4]
    p = LocalProvider(base, journals)
    launch = prepare_agent("replay", {"journal": "codex-exec-json/command-with-stderr-noise-v0.46.jsonl",
                                      "delay": 0.15, "speed": 1})
    h = await p.create("survivor", SandboxSpec())
    for path, (content, mode) in (await load_files(launch)).items():
        await p.copy_in(h, path, content, mode)
    data = await p.launch(h, list(launch.argv), nonce=nonce)
    print(json.dumps({"journal_path": h.journal_path, "stderr_path": h.stderr_path, "workdir": h.workdir,
                      "data": {**h.data, **data}}), flush=True)
    await asyncio.Event().wait()  # stay alive until the test SIGKILLs this stand-in host

asyncio.run(main())
"""


@pytest.mark.servers  # starts processes: not a unit test
async def test_agent_survives_sigkill_of_launching_host(tmp_path: pathlib.Path) -> None:
    """The host process is SIGKILLed right after launch; this process follows to the end."""
    nonce = new_nonce()
    base, journals = str(tmp_path / "sb"), str(tmp_path / "jr")
    host = subprocess.Popen([sys.executable, "-c", _LAUNCHER, base, journals, nonce], cwd=REPO,
                            env=env_without_proxy(), stdout=subprocess.PIPE)
    try:
        assert host.stdout is not None
        async with asyncio.timeout(30):
            line = await asyncio.to_thread(host.stdout.readline)
        info = json.loads(line)
        host.send_signal(signal.SIGKILL)
        host.wait()
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
        if host.stdout is not None:
            host.stdout.close()
    provider = LocalProvider(base, journals, idle_check=0.05)
    h = SandboxHandle("local", "survivor", info["journal_path"], info["stderr_path"], info["workdir"], info["data"])
    try:
        assert await provider.processes_alive(h)  # still running after the host died
        items = await follow_all(provider, h, nonce, timeout=30)
        expected = (CORPUS / "codex-exec-json" / "command-with-stderr-noise-v0.46.jsonl").read_bytes()
        assert [i.data for i in items[:-1]] == expected.split(b"\n")[:-1]  # type: ignore[union-attr]
        assert items[-1] == JournalExit(0, len(expected), os.path.getsize(h.journal_path))
    finally:
        await provider.destroy(h)


@pytest.fixture
def slow_setsid(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``setsid`` found first on PATH takes 0.5 s before it makes its group: the window a
    loaded machine opens between the launcher's fork and the agent leading its group."""
    shim = tmp_path / "slow-bin"
    shim.mkdir()
    (shim / "setsid").write_text('#!/bin/sh\nsleep 0.5\nexec /usr/bin/setsid "$@"\n')
    (shim / "setsid").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.usefixtures("slow_setsid")
@pytest.mark.servers  # starts processes: not a unit test
async def test_the_pgid_record_only_ever_names_a_group_leader(local_provider: LocalProvider, sandboxes: list) -> None:
    """A successor that reads ``.baton/pgid`` during a launch SIGKILLs that group: a record
    naming a process not yet leading its group made the kill miss the agent (a
    run failed with "agent processes survived SIGKILL")."""
    h = await local_provider.create("slow-setsid", SandboxSpec())
    sandboxes.append(h)
    record = pathlib.Path(h.data["dir"]) / ".baton" / "pgid"
    launching = asyncio.create_task(local_provider.launch(h, ["sleep", "60"], nonce=new_nonce()))
    seen = 0
    while not launching.done():
        text = record.read_text().strip() if record.exists() else ""
        if text:
            pgid = int(text)
            stat = pathlib.Path(f"/proc/{pgid}/stat").read_text().rsplit(")", 1)[1].split()
            assert int(stat[2]) == pgid, "the record names a process that does not lead its group yet"
            seen += 1
        await asyncio.sleep(0.01)
    sandboxes[-1] = with_data(h, dict(await launching))
    assert await local_provider.processes_alive(sandboxes[-1])
    assert seen > 0 or record.exists()



_OWN_GROUP = """
import asyncio, os, signal, sys
from sandbox_host.providers import SandboxSpec
from sandbox_host.providers.local import LocalProvider

async def main():
    p = LocalProvider(sys.argv[1] + "/s", sys.argv[1] + "/j", idle_check=0.05, sandbox_io="direct")
    h = await p.create("own-group", SandboxSpec())  # registered, never launched: no pgid
    record = os.path.join(h.data["dir"], ".baton", "pgid")
    os.makedirs(os.path.dirname(record), exist_ok=True)
    answers = []
    for named in (str(os.getpgrp()), "1", "0", "-1"):  # what an agent could write there
        with open(record, "w") as f:
            f.write(named)
        answers.append([await p.processes_alive(h), await p.kill(h, signal.SIGKILL)])
    await p.destroy(h)
    await p.close()
    print(answers, "survived", flush=True)

asyncio.run(main())
"""


@pytest.mark.servers  # starts processes: not a unit test
async def test_a_recorded_group_that_cannot_be_the_agents_is_never_signalled(tmp_path: pathlib.Path) -> None:
    """``.baton/pgid`` is what ``kill`` and ``destroy`` act on when a handle has no pgid (its
    host died during the launch), and the agent can write it. Naming the group of the host
    that reads it, 1, 0 or below is no record: nothing is signalled and the host lives on.
    (In a process of its own: this one would die with the bug.)"""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _OWN_GROUP, str(tmp_path), cwd=str(REPO), start_new_session=True,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env_without_proxy())
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert out.decode().strip() == "[[False, False], [False, False], [False, False], [False, False]] survived"


@pytest.mark.servers  # through the daemon, starts one
async def test_a_fifo_or_link_at_the_pgid_record_is_no_record(local_provider: LocalProvider,
                                                              sandboxes: list, tmp_path: pathlib.Path) -> None:
    """A FIFO the agent put at ``.baton/pgid`` would hold a plain ``open`` (on the host's
    event loop, or the daemon's) until a writer came; a link would name any file: both are
    read as no record, at once."""
    h = await local_provider.create("fifo-pgid", SandboxSpec())
    sandboxes.append(h)
    record = pathlib.Path(h.data["dir"]) / ".baton" / "pgid"
    record.parent.mkdir(parents=True, exist_ok=True)
    elsewhere = tmp_path / "a-group"
    elsewhere.write_text(str(os.getpid()))
    for make in (lambda: os.mkfifo(record), lambda: os.symlink(elsewhere, record)):
        record.unlink(missing_ok=True)
        make()
        async with asyncio.timeout(30):
            assert await local_provider.processes_alive(h) is False
            assert await local_provider.kill(h, signal.SIGTERM) is False
