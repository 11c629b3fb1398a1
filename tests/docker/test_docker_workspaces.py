"""Workspaces in docker sandboxes (real engine, real git on the host): a ref checked out into
``/workspace``, failures named by their step, a credential that stays on the host, the
thread's agent home, and the tree export/import round trip."""
from __future__ import annotations

import io
import pathlib
import tarfile

import pytest

from baton.errors import SandboxBuildFailed
from sandbox_host.journal import JournalLine, new_nonce
from sandbox_host.providers import SandboxHandle, SandboxSpec
from sandbox_host.providers._workspace import GIT_TOKEN_ENV, GIT_USERNAME_ENV
from sandbox_host.providers.docker import DockerProvider
from tests.conftest import unique
from tests.docker.conftest import DOCKER_MARKS, follow_all, with_data
from tests.sandbox.gitrepos import Repo, git_http_server, make_repo

pytestmark = [*DOCKER_MARKS, pytest.mark.timeout(120)]


@pytest.fixture
def repo(tmp_path: pathlib.Path) -> Repo:
    return make_repo(tmp_path / "git")


async def _run(provider: DockerProvider, h: SandboxHandle, script: str) -> str:
    nonce = new_nonce()
    data = await provider.launch(h, ["sh", "-c", script], nonce=nonce)
    items = await follow_all(provider, with_data(h, dict(data)), nonce)
    return "\n".join(i.data.decode() for i in items if isinstance(i, JournalLine))


async def test_a_git_ref_is_checked_out_into_the_workspace_with_the_threads_home(
        docker_provider: DockerProvider, containers: list[SandboxHandle], repo: Repo) -> None:
    spec = SandboxSpec(provider="docker", workspace=str(repo.bare), workspace_is_git=True, git_ref="feature",
                       setup=("test -f FEATURE",), thread_dir="t1")
    h = await docker_provider.create(unique("ws-"), spec)
    containers.append(h)
    out = await _run(docker_provider, h, 'echo "$PWD|$HOME|$CODEX_HOME"; ls -A | sort | tr "\\n" " "; echo')
    assert out.splitlines() == ["/workspace|/home/agent|/home/agent/.codex", ".git FEATURE README.md src "]


@pytest.mark.parametrize("ref, setup, step, words", [
    ("no-such-ref", (), "workspace", "unknown ref 'no-such-ref'"),
    (None, ("true", "exit 4"), "setup[1]", "exit 4"),
])
async def test_a_failed_build_names_its_step(docker_provider: DockerProvider, repo: Repo, ref: str | None,
                                             setup: tuple[str, ...], step: str, words: str) -> None:
    key = unique("ws-")
    spec = SandboxSpec(provider="docker", workspace=str(repo.bare), workspace_is_git=True, git_ref=ref, setup=setup)
    with pytest.raises(SandboxBuildFailed) as failed:
        await docker_provider.create(key, spec)
    assert failed.value.step == step and failed.value.detail.startswith(words)
    assert await docker_provider.find(key) == []  # the container went with the failure


async def test_a_credential_clones_on_the_host_and_never_enters_the_container(
        docker_provider: DockerProvider, containers: list[SandboxHandle], repo: Repo) -> None:
    token = "tok-SECRET-docker-42"
    with git_http_server(repo.bare.parent, "bot", token) as server:
        spec = SandboxSpec(provider="docker", workspace=server.url(), workspace_is_git=True, git_ref="main",
                           secrets={GIT_USERNAME_ENV: "bot", GIT_TOKEN_ENV: token},
                           setup=('test -z "$BATON_GIT_TOKEN"',))
        h = await docker_provider.create(unique("ws-"), spec)
        containers.append(h)
    out = await _run(docker_provider, h, "cat .git/config; env")
    assert "[remote \"origin\"]" in out and token not in out and "Basic" not in out


async def test_export_and_import_round_trip(docker_provider: DockerProvider, containers: list[SandboxHandle],
                                            repo: Repo) -> None:
    a = await docker_provider.create(unique("ws-"), SandboxSpec(
        provider="docker", workspace=str(repo.bare), workspace_is_git=True, thread_dir="t",
        setup=("mkdir -p /home/agent/.claude && echo '{}' > /home/agent/.claude/session.json",)))
    containers.append(a)
    tar = await docker_provider.export_tree(a)
    names = tarfile.open(fileobj=io.BytesIO(tar)).getnames()
    assert "work/src/app.py" in names and "home/.claude/session.json" in names
    assert all(n == r or n.startswith(f"{r}/") for n in names for r in [n.split("/")[0]] if r in ("work", "home"))

    b = await docker_provider.create(unique("ws-"), SandboxSpec(provider="docker", thread_dir="t"))
    containers.append(b)
    await docker_provider.import_tree(b, tar)
    out = await _run(docker_provider, b, "cat src/app.py /home/agent/.claude/session.json .git/HEAD")  # no git in the image
    assert out.splitlines() == ["print('app')", "{}", "ref: refs/heads/main"]

    bad = io.BytesIO()
    with tarfile.open(fileobj=bad, mode="w") as t:
        info = tarfile.TarInfo("work/../../etc/evil")
        info.size = 1
        t.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(SandboxBuildFailed) as refused:
        await docker_provider.import_tree(b, bad.getvalue())
    assert refused.value.step == "import"
