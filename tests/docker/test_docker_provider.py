"""The docker provider against a real engine (create, replay, follow, kill, destroy,
attach from a second client; failing setup; secrets).

Each test builds its own container(s) from the offline ``baton-sandbox`` image and removes
them at the end.
"""
from __future__ import annotations

import asyncio
import contextlib
import pathlib
import signal
import subprocess

import docker
import pytest

from baton.errors import SandboxBuildFailed
from sandbox_host.agents import load_files, prepare_agent
from sandbox_host.journal import JournalDeleted, JournalExit, JournalLine, JournalTruncated, new_nonce
from sandbox_host.providers import SandboxSpec, provider_for
from sandbox_host.providers.docker import LABEL_KEY, LABEL_RUN, DockerProvider
from sandbox_host.translate import translate_bytes, translator_for
from tests.conftest import assert_eventually, unique
from tests.docker.conftest import DOCKER_MARKS, container_processes, follow_all, roundtrip, with_data

pytestmark = DOCKER_MARKS

REPO = pathlib.Path(__file__).resolve().parents[2]
CODEX_JOURNAL = REPO / "corpus" / "codex-exec-json" / "zsh-commands-and-file-change.jsonl"
CLAUDE_JOURNAL = REPO / "corpus" / "claude-stream-json" / "local-command-synthetic-message-v2.1.285.jsonl"
SPEC = SandboxSpec(provider="docker")


def corpus_lines(path: pathlib.Path) -> list[bytes]:
    """The recorded journal's complete lines, as a follower must yield them."""
    return path.read_bytes().split(b"\n")[:-1]


async def launch_replay(provider: DockerProvider, handle, journal: pathlib.Path, *, delay: float, nonce: str):
    """Copy the replay agent and its journal in, launch it; the handle with its pgid."""
    launch = prepare_agent("replay", {"journal": str(journal), "speed": 1, "delay": delay})
    for rel, (content, mode) in (await load_files(launch)).items():
        await provider.copy_in(handle, rel, content, mode)
    data = await provider.launch(handle, launch.argv, nonce=nonce, stdin=launch.stdin, env=launch.env)
    return with_data(handle, data)


async def test_create_replay_follow_destroy(docker_provider: DockerProvider, containers, tmp_path: pathlib.Path) -> None:
    """A corpus journal replayed in a container is followed byte for byte to the sentinel."""
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "main.py").write_text("print('hello')\n")
    key = unique("dk-run-")
    handle = await docker_provider.create(
        key, SandboxSpec(provider="docker", workspace=str(ws), setup=("cp src/main.py copied.py", "echo built > stamp"))
    )
    containers.append(handle)
    assert handle.provider == "docker" and handle.key == key
    assert handle.journal_path == f"/tmp/baton-runs/{key}.ndjson"
    # The workspace was copied in, and the setup commands ran in order inside it.
    assert await docker_provider.read_file(handle, "/workspace/copied.py") == b"print('hello')\n"
    assert await docker_provider.read_file(handle, "/workspace/stamp") == b"built\n"
    info = docker.from_env()
    try:
        labels = info.api.inspect_container(handle.data["container_id"])["Config"]["Labels"]
    finally:
        info.close()
    assert labels[LABEL_KEY] == key and labels[LABEL_RUN] == key
    assert await docker_provider.find(key) == [handle.data["container_id"]]

    nonce = new_nonce()
    handle = await launch_replay(docker_provider, handle, CODEX_JOURNAL, delay=0.01, nonce=nonce)
    items = await follow_all(docker_provider, handle, nonce)

    lines = [it for it in items if isinstance(it, JournalLine)]
    assert [ln.data for ln in lines] == corpus_lines(CODEX_JOURNAL)
    assert lines[0].offset == 0 and all(a.end == b.offset for a, b in zip(lines, lines[1:]))
    assert isinstance(items[-1], JournalExit) and items[-1].code == 0
    assert items[-1].offset == CODEX_JOURNAL.stat().st_size
    # What a user sees: the chunks from the container equal those of the recorded journal.
    tr = translator_for("codex-exec-json", run_id=key, thread_id="th-1")
    chunks = [c for ln in lines for c in tr.feed(ln.data)] + tr.finish(items[-1].code, None)
    expected = translate_bytes("codex-exec-json", CODEX_JOURNAL.read_bytes(), key, "th-1", exit_code=0)
    assert chunks == expected
    assert chunks[0]["type"] == "RUN_STARTED" and chunks[-1]["type"] == "RUN_FINISHED"
    assert await docker_provider.file_size(handle, handle.journal_path) == items[-1].end
    assert await docker_provider.read_file(handle, handle.stderr_path) == b""
    await assert_eventually(lambda: _not(docker_provider.processes_alive(handle)), timeout=10)
    # No follow exec (tail) outlives its stream.
    await assert_eventually(lambda: _lacks(docker_provider, handle, "tail"), timeout=10)

    assert await docker_provider.destroy(handle) is True
    assert await docker_provider.exists(handle) is False
    assert await docker_provider.destroy(handle) is False
    assert await docker_provider.find(key) == []


async def _not(aw) -> bool:
    return not await aw


async def _lacks(provider: DockerProvider, handle, comm: str) -> bool:
    return comm not in await container_processes(provider, handle)


async def test_attach_from_second_client(docker_provider: DockerProvider, containers) -> None:
    """A host that never saw the sandbox re-opens it by handle (new SDK client) and follows it.

    The first provider's client is closed before the second one attaches, as when the
    first host died; the second follows from 0 and, separately, from a line start.
    """
    first = DockerProvider()
    nonce = new_nonce()
    try:
        handle = await first.create(unique("dk-attach-"), SPEC)
        containers.append(handle)
        handle = await launch_replay(first, handle, CLAUDE_JOURNAL, delay=0.02, nonce=nonce)
    finally:
        first.close()
    stored = roundtrip(handle)

    second = provider_for("docker")
    try:
        assert isinstance(second, DockerProvider)
        assert second.killable_processes and second.can_follow
        assert await second.exists(stored)
        items = await follow_all(second, stored, nonce)
        expected = corpus_lines(CLAUDE_JOURNAL)
        assert [it.data for it in items if isinstance(it, JournalLine)] == expected
        assert isinstance(items[-1], JournalExit) and items[-1].code == 0
        # Resume from the start of the third line: exactly the rest, same offsets.
        lines = [it for it in items if isinstance(it, JournalLine)]
        rest = await follow_all(second, stored, nonce, offset=lines[2].offset)
        assert [(it.offset, it.data) for it in rest if isinstance(it, JournalLine)] == [
            (ln.offset, ln.data) for ln in lines[2:]
        ]
        assert rest[-1] == items[-1]
    finally:
        second.close()


async def test_kill_process_group(docker_provider: DockerProvider, containers) -> None:
    """SIGTERM stops the agent and the wrapper writes its status; SIGKILL leaves no sentinel."""
    agent = ["python3", "-c", "import time\nprint('{\"up\":1}', flush=True)\nwhile True: time.sleep(0.05)"]

    nonce = new_nonce()
    handle = await docker_provider.create(unique("dk-term-"), SPEC)
    containers.append(handle)
    handle = with_data(handle, await docker_provider.launch(handle, agent, nonce=nonce))
    await assert_eventually(lambda: docker_provider.file_size(handle, handle.journal_path), timeout=10)
    assert await docker_provider.processes_alive(handle)
    assert await docker_provider.kill(handle, signal.SIGTERM) is True
    items = await follow_all(docker_provider, handle, nonce)
    assert [type(it) for it in items] == [JournalLine, JournalExit]
    assert items[0].data == b'{"up":1}'
    assert items[1].code == 128 + signal.SIGTERM
    await assert_eventually(lambda: _not(docker_provider.processes_alive(handle)), timeout=10)
    assert await docker_provider.kill(handle, signal.SIGTERM) is False
    assert await docker_provider.exists(handle)  # a kill is not a destroy

    nonce = new_nonce()
    handle2 = await docker_provider.create(unique("dk-kill-"), SPEC)
    containers.append(handle2)
    handle2 = with_data(handle2, await docker_provider.launch(handle2, agent, nonce=nonce))
    await assert_eventually(lambda: docker_provider.file_size(handle2, handle2.journal_path), timeout=10)
    assert await docker_provider.kill(handle2, signal.SIGKILL) is True
    items = await follow_all(docker_provider, handle2, nonce)
    assert [(type(it), getattr(it, "data", None)) for it in items] == [(JournalLine, b'{"up":1}')]


async def test_an_inbox_the_agent_made_a_fifo_refuses_inputs_for_good(docker_provider: DockerProvider,
                                                                     containers) -> None:
    """An agent that put a FIFO where its inbox was: the input is refused at once, as one the
    inbox takes for good (``PermissionError``), not as a sandbox lost (which is tried again)."""
    handle = await docker_provider.create(unique("dk-fifo-"), SPEC)
    containers.append(handle)
    handle = with_data(handle, await docker_provider.launch(handle, ["sleep", "30"], nonce=new_nonce(),
                                                            interactive=True))
    inbox = handle.data["inbox"]
    code, _, err = await docker_provider._exec(handle.data["container_id"],
                                               ["sh", "-c", 'rm -f "$1" && mkfifo "$1"', "sh", inbox])
    assert code == 0, err
    async with asyncio.timeout(30):
        with pytest.raises(PermissionError, match="not a regular file"):
            await docker_provider.send_input(handle, "i1", b'{"answer":"yes"}')


async def test_destroy_is_the_end_of_a_running_agent(docker_provider: DockerProvider, containers) -> None:
    """Destroying mid-run removes container and agent; a follow in progress ends cleanly."""
    agent = ["sh", "-c", "while :; do echo '{\"tick\":1}'; sleep 0.05; done"]
    nonce = new_nonce()
    handle = await docker_provider.create(unique("dk-destroy-"), SPEC)
    containers.append(handle)
    handle = with_data(handle, await docker_provider.launch(handle, agent, nonce=nonce))

    got: list[object] = []

    async def consume() -> None:
        async for it in _follow(docker_provider, handle, nonce):
            got.append(it)

    task = asyncio.create_task(consume())
    try:
        await assert_eventually(lambda: len(got) >= 3, timeout=10)
        assert await docker_provider.destroy(handle) is True
        # The follower notices the container is gone: a clear error, not a hang.
        with pytest.raises(JournalDeleted):
            async with asyncio.timeout(15):
                await task
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert await docker_provider.exists(handle) is False
    assert await docker_provider.processes_alive(handle) is False
    assert await docker_provider.kill(handle, signal.SIGKILL) is False


async def test_removals_that_race_each_other_all_succeed(docker_provider: DockerProvider, containers) -> None:
    """A run's final sweep and a failed build may remove one container at once: the engine
    answers the later ones 409 "removal already in progress" or 404, and neither is an error."""
    run_id = unique("dk-race-")
    handle = await docker_provider.create(f"{run_id}#1", SandboxSpec(provider="docker", env={"BATON_RUN_ID": run_id}))
    containers.append(handle)
    done = await asyncio.gather(docker_provider.destroy(handle), docker_provider.destroy(handle),
                                docker_provider.destroy_leftovers(run_id, None), docker_provider.destroy(handle))
    assert sum(1 for d in done if d) >= 1  # one of them removed it; the others found it gone or going
    await assert_eventually(lambda: _gone(docker_provider, handle), timeout=15)


async def _gone(provider: DockerProvider, handle) -> bool:
    return not await provider.exists(handle)


async def _follow(provider, handle, nonce):
    from sandbox_host.journal import follow_journal

    async with contextlib.aclosing(
        follow_journal(provider, handle, handle.journal_path, nonce=nonce, poll_interval=0.05)
    ) as items:
        async for it in items:
            yield it


async def test_failing_setup_command_fails_the_build_redacted(docker_provider: DockerProvider) -> None:
    """A non-zero setup command fails the build with its stderr tail, secrets redacted,
    and leaves no container behind."""
    secret = "sk-test-9f8e7d6c5b4a"
    key = unique("dk-setup-")
    spec = SandboxSpec(
        provider="docker",
        setup=("true", 'echo "token is $API_TOKEN" >&2; echo "boom: missing dep" >&2; exit 7', "touch never"),
        secrets={"API_TOKEN": secret},
    )
    with pytest.raises(SandboxBuildFailed) as info:
        await docker_provider.create(key, spec)
    exc = info.value
    assert exc.step == "setup[1]"
    assert "exit 7" in exc.detail and "boom: missing dep" in exc.detail
    assert "token is [REDACTED]" in exc.detail
    for text in (str(exc), exc.detail, repr(exc), repr(spec)):
        assert secret not in text
    assert await docker_provider.find(key) == []


async def test_missing_image_fails_the_build(docker_provider: DockerProvider) -> None:
    key = unique("dk-noimg-")
    with pytest.raises(SandboxBuildFailed) as info:
        await docker_provider.create(key, SandboxSpec(provider="docker", image="baton-no-such-image:0"))
    assert info.value.step == "container"
    assert "baton-no-such-image" in info.value.detail


async def test_secrets_reach_only_the_agent(docker_provider: DockerProvider, containers) -> None:
    """Secrets are in the agent's environment, not in the container's config or the exec's."""
    secret = "ghp_secretvalue123456"
    nonce = new_nonce()
    handle = await docker_provider.create(unique("dk-secret-"), SandboxSpec(provider="docker", env={"MODE": "plain"}))
    containers.append(handle)
    agent = ["sh", "-c", 'printf \'{"mode":"%s","has_token":%s}\\n\' "$MODE" "$( [ -n "$TOKEN" ] && echo true || echo false)"']
    data = await docker_provider.launch(handle, agent, nonce=nonce, env={"MODE": "agent"}, secrets={"TOKEN": secret})
    handle = with_data(handle, data)
    items = await follow_all(docker_provider, handle, nonce)
    assert items[0] == JournalLine(0, items[0].end, b'{"mode":"agent","has_token":true}')
    assert isinstance(items[-1], JournalExit) and items[-1].code == 0

    client = docker.from_env()
    try:
        inspected = client.api.inspect_container(handle.data["container_id"])
    finally:
        client.close()
    assert "MODE=plain" in inspected["Config"]["Env"]
    assert secret not in repr(inspected)
    assert secret not in repr(handle)


async def test_git_workspace_at_ref(docker_provider: DockerProvider, containers, tmp_path: pathlib.Path) -> None:
    """A git URL (a local bare repository) is cloned at the ref and copied in."""
    bare = tmp_path / "origin.git"
    work = tmp_path / "work"
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}

    def git(*args: str, cwd: pathlib.Path | None = None) -> None:
        subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)

    git("init", "--bare", "--initial-branch=main", str(bare))
    git("clone", str(bare), str(work))
    (work / "VERSION").write_text("1\n")
    git("add", "VERSION", cwd=work)
    git("commit", "-m", "one", cwd=work)
    git("tag", "v1", cwd=work)
    (work / "VERSION").write_text("2\n")
    git("commit", "-am", "two", cwd=work)
    git("push", "origin", "main", "v1", cwd=work)

    h1 = await docker_provider.create(unique("dk-git-"), SandboxSpec(provider="docker", workspace=str(bare), git_ref="v1"))
    containers.append(h1)
    h2 = await docker_provider.create(unique("dk-git-"), SandboxSpec(provider="docker", workspace=str(bare)))
    containers.append(h2)
    assert await docker_provider.read_file(h1, "/workspace/VERSION") == b"1\n"
    assert await docker_provider.read_file(h2, "/workspace/VERSION") == b"2\n"

    with pytest.raises(SandboxBuildFailed) as info:
        await docker_provider.create(unique("dk-git-"), SandboxSpec(provider="docker", workspace=str(bare), git_ref="nope"))
    assert info.value.step == "workspace"


async def test_files_offsets_and_hostile_lines(docker_provider: DockerProvider, containers) -> None:
    """read_file/file_size/copy_in semantics, and a 2 MiB line, invalid UTF-8, CRLF and a
    forged sentinel through the exec'd tail."""
    nonce = new_nonce()
    handle = await docker_provider.create(unique("dk-files-"), SPEC)
    containers.append(handle)

    await docker_provider.copy_in(handle, "dir/sub/file.bin", b"0123456789", 0o600)
    assert await docker_provider.read_file(handle, "/workspace/dir/sub/file.bin") == b"0123456789"
    assert await docker_provider.read_file(handle, "/workspace/dir/sub/file.bin", 3, 4) == b"3456"
    assert await docker_provider.read_file(handle, "/workspace/dir/sub/file.bin", 10) == b""
    assert await docker_provider.file_size(handle, "/workspace/dir/sub/file.bin") == 10
    assert await docker_provider.file_size(handle, "/workspace/absent") is None
    with pytest.raises(FileNotFoundError):
        await docker_provider.read_file(handle, "/workspace/absent")
    with pytest.raises(FileNotFoundError):
        async with contextlib.aclosing(docker_provider.follow(handle, "/workspace/absent", 0)) as stream:
            await stream.__anext__()

    big = b'{"big":"' + b"x" * (2 << 20) + b'"}'
    program = (
        "import sys,time\n"
        "o=sys.stdout.buffer\n"
        f"o.write({big!r}+b'\\n'); o.flush(); time.sleep(0.05)\n"
        "o.write(b'\\xff\\xfe not utf-8\\n'); o.write(b'{\"crlf\":1}\\r\\n')\n"
        "o.write(b'{\"__exit\":0,\"__nonce\":\"0000\"}\\n'); o.write(b'{\"frag')\n"
    )
    await docker_provider.copy_in(handle, "agent.py", program.encode())
    handle = with_data(handle, await docker_provider.launch(handle, ["python3", "agent.py"], nonce=nonce))
    items = await follow_all(docker_provider, handle, nonce)
    assert [it.data for it in items[:4]] == [big, b"\xff\xfe not utf-8", b'{"crlf":1}', b'{"__exit":0,"__nonce":"0000"}']
    # The fragment without "\n" is glued to the wrapper's sentinel: reported, not repaired.
    assert items[4] == JournalTruncated(items[3].end, b'{"frag')
    assert isinstance(items[5], JournalExit) and items[5].code == 0 and len(items) == 6


async def test_journal_deleted_mid_follow(docker_provider: DockerProvider, containers) -> None:
    nonce = new_nonce()
    handle = await docker_provider.create(unique("dk-del-"), SPEC)
    containers.append(handle)
    agent = ["sh", "-c", "while :; do echo '{\"tick\":1}'; sleep 0.05; done"]
    handle = with_data(handle, await docker_provider.launch(handle, agent, nonce=nonce))
    got: list[object] = []

    async def consume() -> None:
        async for it in _follow(docker_provider, handle, nonce):
            got.append(it)

    task = asyncio.create_task(consume())
    try:
        await assert_eventually(lambda: len(got) >= 2, timeout=10)
        code, _, _ = await docker_provider._exec(handle.data["container_id"], ["rm", handle.journal_path])
        assert code == 0
        with pytest.raises(JournalDeleted):
            async with asyncio.timeout(15):
                await task
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert all(isinstance(it, JournalLine) and it.data == b'{"tick":1}' for it in got)
    await assert_eventually(lambda: _lacks(docker_provider, handle, "tail"), timeout=10)


async def test_follow_outlasts_the_client_timeout(containers) -> None:
    """An agent silent for longer than the SDK client's timeout is still followed to its
    end: no byte lost or doubled, offsets exact, no tail left in the container."""
    provider = DockerProvider(docker.from_env(timeout=3))
    client = provider._client
    try:
        nonce = new_nonce()
        handle = await provider.create(unique("dk-idle-"), SPEC)
        containers.append(handle)
        # The agent's own pacing (inside the container), not a test sleep.
        agent = ["sh", "-c", "echo '{\"n\":1}'; sleep 3.5; echo '{\"n\":2}'; sleep 3.2; echo '{\"n\":3}'"]
        handle = with_data(handle, await provider.launch(handle, agent, nonce=nonce))
        items = await follow_all(provider, handle, nonce)
        assert [(it.offset, it.data) for it in items if isinstance(it, JournalLine)] == [
            (0, b'{"n":1}'), (8, b'{"n":2}'), (16, b'{"n":3}')
        ]
        assert isinstance(items[-1], JournalExit) and items[-1].code == 0 and len(items) == 4
    finally:
        await provider.aclose()
        client.close()


async def test_follow_resumes_when_the_daemon_dies(docker_provider: DockerProvider, containers) -> None:
    """When the container's daemon dies under a follow (the container's main loop starts it
    again; the agent lives on), the follow goes on from its offset: every line exactly once,
    in order."""
    nonce = new_nonce()
    handle = await docker_provider.create(unique("dk-resume-"), SPEC)
    containers.append(handle)
    agent = ["sh", "-c", 'i=0; while [ $i -lt 60 ]; do echo "{\\"i\\":$i}"; i=$((i+1)); sleep 0.03; done']
    handle = with_data(handle, await docker_provider.launch(handle, agent, nonce=nonce))
    got: list[object] = []

    async def consume() -> None:
        async for it in _follow(docker_provider, handle, nonce):
            got.append(it)

    task = asyncio.create_task(consume())
    try:
        await assert_eventually(lambda: len(got) >= 5, timeout=10)
        killer = (
            "for p in /proc/[0-9]*; do [ \"$(cat $p/comm 2>/dev/null)\" = python ] && kill -9 ${p#/proc/} && echo killed; done; :"
        )
        code, out, _ = await docker_provider._exec(handle.data["container_id"], ["sh", "-c", killer])
        assert (code, out) == (0, b"killed\n")
        async with asyncio.timeout(20):
            await task
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    lines = [it for it in got if isinstance(it, JournalLine)]
    assert [ln.data for ln in lines] == [b'{"i":%d}' % i for i in range(60)]
    assert all(a.end == b.offset for a, b in zip(lines, lines[1:]))
    assert isinstance(got[-1], JournalExit) and got[-1].code == 0


async def test_cancelled_create_leaves_no_container(docker_provider: DockerProvider) -> None:
    """A host cancelled in the middle of building a sandbox removes what it built."""
    key = unique("dk-cancel-")
    task = asyncio.create_task(docker_provider.create(key, SandboxSpec(provider="docker", setup=("sleep 30",))))
    try:
        await assert_eventually(lambda: docker_provider.find(key), timeout=10)
    finally:
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await docker_provider.find(key) == []
