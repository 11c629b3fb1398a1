"""The stand-in ``claude`` and ``codex`` run in the docker sandbox image (Debian python3 only).

Each stand-in is copied into a container, put first on ``PATH``, launched with baton's real
argv for a turn and for a resumed turn, and its journal translated.
"""
from __future__ import annotations

import pathlib

import pytest

from baton_tools.standins import STANDINS
from sandbox_host.agents import prepare_agent
from sandbox_host.agents.sessions import agent_session_id
from sandbox_host.journal import JournalExit, JournalLine, new_nonce
from sandbox_host.providers import SandboxHandle, SandboxSpec
from sandbox_host.providers.docker import DockerProvider
from sandbox_host.translate import translate_lines, translator_for
from tests.conftest import unique
from tests.docker.conftest import DOCKER_MARKS, follow_all, with_data

pytestmark = DOCKER_MARKS

BIN = ".baton-standins"


@pytest.mark.parametrize("kind", ["claude-code", "codex"])
async def test_standin_turn_and_resume_in_the_sandbox_image(
    docker_provider: DockerProvider, containers: list[SandboxHandle], kind: str
) -> None:
    handle = await docker_provider.create(unique("dk-standin-"), SandboxSpec(provider="docker"))
    containers.append(handle)
    for name, path in STANDINS.items():
        await docker_provider.copy_in(handle, f"{BIN}/{name}", pathlib.Path(path).read_bytes(), 0o755)
    env = {"PATH": f"{handle.workdir}/{BIN}:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp/standin-home"}
    offset = 0
    session: str | None = None
    for prompt in ("write hello.txt from the image\nrun cat hello.txt", "recall"):
        launch = prepare_agent(kind, {}, prompt=prompt, resume=session)
        nonce = new_nonce()
        handle = with_data(handle, dict(await docker_provider.launch(
            handle, launch.argv, nonce=nonce, stdin=launch.stdin, env=env)))
        containers[-1] = handle
        items = await follow_all(docker_provider, handle, nonce, offset=offset)
        exit_item = items[-1]
        assert isinstance(exit_item, JournalExit) and exit_item.code == 0, items
        offset = exit_item.end
        lines = [i.data for i in items if isinstance(i, JournalLine)]
        tr = translator_for(launch.journal_format, "run-1", "thread-1")
        chunks = translate_lines(tr, lines) + tr.finish(0)
        assert chunks[-1]["type"] == "RUN_FINISHED"
        announced = agent_session_id(launch.journal_format, lines[0])
        assert announced is not None and (session is None or announced == session)
        session = announced
    text = "".join(c["delta"] for c in chunks if c["type"] == "TEXT_MESSAGE_CONTENT")
    assert "1. write hello.txt from the image" in text
    assert await docker_provider.read_file(handle, f"{handle.workdir}/hello.txt") == b"from the image\n"


async def _sandbox_with_standins(docker_provider: DockerProvider, containers: list[SandboxHandle]
                                 ) -> tuple[SandboxHandle, dict[str, str]]:
    handle = await docker_provider.create(unique("dk-relay-"), SandboxSpec(provider="docker"))
    containers.append(handle)
    for name, path in STANDINS.items():
        await docker_provider.copy_in(handle, f"{BIN}/{name}", pathlib.Path(path).read_bytes(), 0o755)
    return handle, {"PATH": f"{handle.workdir}/{BIN}:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp/standin-home"}


async def test_an_approval_reaches_the_agent_once_in_a_container(
    docker_provider: DockerProvider, containers: list[SandboxHandle]
) -> None:
    """The wrapper's relay (dash, coreutils tail and mkfifo of the minbase image) and an inbox
    appended by ``docker exec``."""
    from tests.sandbox import relay_support as rs

    handle, env = await _sandbox_with_standins(docker_provider, containers)

    async def read(h: SandboxHandle, rel: str) -> bytes:
        return await docker_provider.read_file(h, f"{h.workdir}/{rel}")

    await rs.approve_once_delivered_once(docker_provider, handle, env, read)
    handle, env = await _sandbox_with_standins(docker_provider, containers)
    await rs.deny_then_steer(docker_provider, handle, env, read)


async def test_a_relaunched_agent_takes_the_answer_in_a_container(
    docker_provider: DockerProvider, containers: list[SandboxHandle]
) -> None:
    """The relaunch in a container: a new inbox (its path in the resume marker), the agent's
    session store kept in the container."""
    from tests.sandbox import relay_support as rs

    handle, env = await _sandbox_with_standins(docker_provider, containers)

    async def read(h: SandboxHandle, rel: str) -> bytes:
        return await docker_provider.read_file(h, f"{h.workdir}/{rel}")

    async def kill_agent(h: SandboxHandle) -> None:
        code, _, err = await docker_provider._exec(docker_provider._cid(h), ["sh", "-c", rs.KILL_AGENT, "sh",
                                                                            h.journal_path])
        assert code == 0, err

    await rs.relaunched_process_gets_the_answer(docker_provider, handle, env, read, kill_agent)
