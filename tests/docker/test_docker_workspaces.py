"""Workspaces in docker sandboxes (real engine, real git on the host): a ref checked out into
``/workspace``, failures named by their step (a setup command's through the container's
daemon, with its output's tail and no secret), a credential that stays on the host, the
thread's agent home, and the tree export/import round trip through the daemon (the same
tree the engine's own archive holds: the same snapshot)."""
from __future__ import annotations

import hashlib
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


async def test_a_failing_setup_command_shows_its_output_tail_without_secrets(docker_provider: DockerProvider) -> None:
    key, secret = unique("ws-"), "docker-setup-SECRET-91ab"
    spec = SandboxSpec(provider="docker", secrets={"API_KEY": secret},
                       setup=('echo "key=$API_KEY in $PWD"; echo "npm: not found" >&2; exit 127',))
    with pytest.raises(SandboxBuildFailed) as failed:
        await docker_provider.create(key, spec)
    assert failed.value.step == "setup[0]"
    assert failed.value.detail == "exit 127: key=[REDACTED] in /workspace\nnpm: not found"
    assert secret not in str(failed.value)
    assert await docker_provider.find(key) == []


def _entries(tar: bytes, rename: dict[str, str] | None = None) -> dict[str, tuple[object, ...]]:
    """What a workspace snapshot keeps of each member (baton/workspaces/_packing.py: kind,
    mode, mtime, size, content digest, link target), by name (``rename``: top names)."""
    out: dict[str, tuple[object, ...]] = {}
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as t:
        for m in t:
            f = t.extractfile(m) if m.isfile() else None
            out[_renamed(m.name, rename)] = (
                m.type, m.mode & 0o7777, int(m.mtime), m.size if m.isfile() else 0,
                hashlib.sha256(f.read()).hexdigest() if f is not None else "",
                _renamed(m.linkname, rename) if m.islnk() else m.linkname)
    return out


def _renamed(name: str, rename: dict[str, str] | None) -> str:
    top, _, rest = name.partition("/")
    return (rename or {}).get(top, top) + (f"/{rest}" if rest else "")


async def test_an_export_through_the_daemon_is_the_tree_the_engine_archives(
        docker_provider: DockerProvider, containers: list[SandboxHandle], repo: Repo) -> None:
    h = await docker_provider.create(unique("ws-"), SandboxSpec(
        provider="docker", workspace=str(repo.bare), workspace_is_git=True, thread_dir="t",
        setup=("chmod 0750 src && chmod 0600 README.md && ln -s README.md link && mkdir -p deep/er "
               "&& echo x > deep/er/f && ln deep/er/f hard && mkdir -p /home/agent/.claude "
               "&& echo '{}' > /home/agent/.claude/s.json",)))
    containers.append(h)
    via_daemon = _entries(await docker_provider.export_tree(h))
    api, cid = docker_provider._api, h.data["container_id"]
    engine: dict[str, tuple[object, ...]] = {}
    for path, top in (("/workspace", "work"), ("/home/agent", "home")):
        stream, _ = api.get_archive(cid, path)
        engine.update(_entries(b"".join(stream), {path.rsplit("/", 1)[1]: top}))
    assert via_daemon == engine
    assert via_daemon["work/src"][1] == 0o750 and via_daemon["work/link"][5] == "README.md"


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
