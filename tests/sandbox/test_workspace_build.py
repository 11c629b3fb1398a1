"""Workspaces built by the local provider with real git: refs, failures named by their step,
limits, credentials through the environment only, per-thread directories, tree export."""
from __future__ import annotations

import io
import os
import pathlib
import tarfile

import pytest

from baton.errors import SandboxBuildFailed
from sandbox_host.journal import JournalLine, new_nonce
from sandbox_host.providers import SandboxHandle, SandboxSpec
from sandbox_host.providers._workspace import GIT_TOKEN_ENV, GIT_USERNAME_ENV
from sandbox_host.providers.local import LocalProvider
from tests.sandbox.conftest import follow_all, with_data
from tests.sandbox.gitrepos import Repo, git, git_http_server, make_repo

pytestmark = [pytest.mark.servers, pytest.mark.timeout(60)]  # real git and providers


@pytest.fixture
def repo(tmp_path: pathlib.Path) -> Repo:
    return make_repo(tmp_path / "git")


def _git_spec(url: str, ref: str | None = None, **kw: object) -> SandboxSpec:
    return SandboxSpec(workspace=url, workspace_is_git=True, git_ref=ref, **kw)  # type: ignore[arg-type]


def _files(root: str) -> set[str]:
    return {str(p.relative_to(root)) for p in pathlib.Path(root).rglob("*")
            if ".git" not in p.relative_to(root).parts}


@pytest.mark.parametrize("ref, want", [
    (None, {"README.md", "src", "src/app.py"}),
    ("feature", {"README.md", "src", "src/app.py", "FEATURE"}),
    ("v1", {"README.md"}),
])
async def test_a_git_workspace_checks_out_its_ref(local_provider: LocalProvider, sandboxes: list[SandboxHandle],
                                                  repo: Repo, ref: str | None, want: set[str]) -> None:
    h = await local_provider.create("r1", _git_spec(str(repo.bare), ref))
    sandboxes.append(h)
    assert _files(h.workdir) == want


async def test_a_commit_ref_falls_back_to_a_full_clone(local_provider: LocalProvider,
                                                       sandboxes: list[SandboxHandle], repo: Repo) -> None:
    # Over file:// so git really would clone shallow (it ignores --depth for a plain path).
    h = await local_provider.create("r1", _git_spec(f"file://{repo.bare}", repo.first[:12]))
    sandboxes.append(h)
    assert _files(h.workdir) == {"README.md"}
    assert git("rev-parse", "HEAD", cwd=pathlib.Path(h.workdir)) == repo.first


async def test_an_unknown_ref_fails_naming_it(local_provider: LocalProvider, repo: Repo,
                                              tmp_path: pathlib.Path) -> None:
    with pytest.raises(SandboxBuildFailed) as failed:
        await local_provider.create("r1", _git_spec(str(repo.bare), "no-such-branch"))
    assert failed.value.step == "workspace"
    assert failed.value.detail.startswith("unknown ref 'no-such-branch'")
    assert os.listdir(tmp_path / "sandboxes") == []  # nothing left behind


async def test_an_unreachable_url_fails_naming_the_clone(local_provider: LocalProvider) -> None:
    with pytest.raises(SandboxBuildFailed) as failed:
        await local_provider.create("r1", _git_spec("http://127.0.0.1:9/nothing.git", "main"))
    assert failed.value.step == "workspace"
    assert failed.value.detail.startswith("git clone exit 128:")


async def test_a_workspace_over_the_size_limit_is_refused(local_provider: LocalProvider, repo: Repo) -> None:
    with pytest.raises(SandboxBuildFailed) as failed:
        await local_provider.create("r1", _git_spec(str(repo.bare), max_workspace_bytes=100))
    assert failed.value.step == "workspace"
    assert failed.value.detail.startswith("over the size limit:")


async def test_a_failing_setup_command_is_named_by_its_index(local_provider: LocalProvider, repo: Repo) -> None:
    spec = _git_spec(str(repo.bare), setup=("test -f README.md", "echo boom >&2; exit 3"))
    with pytest.raises(SandboxBuildFailed) as failed:
        await local_provider.create("r1", spec)
    assert failed.value.step == "setup[1]"
    assert failed.value.detail == "exit 3: boom"


async def test_the_build_budget_names_the_step_that_ran_out(local_provider: LocalProvider, repo: Repo) -> None:
    spec = _git_spec(str(repo.bare), setup=("true", "sleep 30"), build_timeout=1.0)
    with pytest.raises(SandboxBuildFailed) as failed:
        await local_provider.create("r1", spec)
    assert failed.value.step == "setup[1]"
    assert "timed out" in failed.value.detail


async def test_a_dir_workspace_is_copied(local_provider: LocalProvider, sandboxes: list[SandboxHandle],
                                         tmp_path: pathlib.Path) -> None:
    src = tmp_path / "proj"
    (src / "lib").mkdir(parents=True)
    (src / "lib" / "x.txt").write_text("x")
    h = await local_provider.create("r1", SandboxSpec(workspace=str(src), workspace_is_git=False,
                                                      setup=("test -f lib/x.txt",)))
    sandboxes.append(h)
    assert _files(h.workdir) == {"lib", "lib/x.txt"}


async def test_a_credential_reaches_git_through_the_environment_only(
        local_provider: LocalProvider, sandboxes: list[SandboxHandle], repo: Repo) -> None:
    token = "tok-SECRET-0123456789"
    with git_http_server(repo.bare.parent, "ci-bot", token) as server:
        secrets = {GIT_USERNAME_ENV: "ci-bot", GIT_TOKEN_ENV: token}
        h = await local_provider.create("r1", _git_spec(server.url(), "feature", secrets=secrets,
                                                        setup=('test -z "$BATON_GIT_TOKEN"',)))
        sandboxes.append(h)
        assert "FEATURE" in _files(h.workdir)
        assert any(a.startswith("Basic ") for a in server.authorizations)
        config = (pathlib.Path(h.workdir) / ".git" / "config").read_text()
        assert token not in config and "Basic" not in config and "extraHeader" not in config
        assert server.url() in config  # the remote is the URL as given, nothing added

        # A wrong token fails the clone; the error shows neither token nor header.
        with pytest.raises(SandboxBuildFailed) as failed:
            await local_provider.create("r2", _git_spec(server.url(), "main",
                                                        secrets={GIT_TOKEN_ENV: "wrong-token-value"}))
    assert failed.value.step == "workspace"
    assert "wrong-token-value" not in str(failed.value)
    assert token not in str(failed.value)


async def test_a_thread_keeps_its_directory_and_home_across_sandboxes(
        local_provider: LocalProvider, sandboxes: list[SandboxHandle], repo: Repo, tmp_path: pathlib.Path) -> None:
    spec = _git_spec(str(repo.bare), thread_dir="thread-1", setup=("echo built >> .built",))
    first = await local_provider.create("r1", spec)
    work, home = local_provider.thread_paths("thread-1")
    assert first.workdir == work and first.data["home"] == home
    (pathlib.Path(work) / "edited.txt").write_text("turn 1")
    assert await local_provider.destroy(first)
    assert os.path.isdir(work)  # the thread's directory outlives the sandbox

    second = await local_provider.create("r2", spec)
    sandboxes.append(second)
    assert second.workdir == work
    assert (pathlib.Path(work) / "edited.txt").read_text() == "turn 1"
    assert (pathlib.Path(work) / ".built").read_text() == "built\n"  # neither cloned nor set up again

    # The agent runs with the thread's home.
    nonce = new_nonce()
    data = await local_provider.launch(second, ["sh", "-c", 'printf "%s|%s|%s\\n" "$PWD" "$HOME" "$CODEX_HOME"'],
                                       nonce=nonce)
    items = await follow_all(local_provider, with_data(second, dict(data)), nonce)
    line = next(i.data for i in items if isinstance(i, JournalLine)).decode().strip()
    assert line == f"{work}|{home}|{home}/.codex"

    assert await local_provider.remove_thread_dir("thread-1")
    assert not os.path.exists(work)


async def test_export_and_import_round_trip(local_provider: LocalProvider, sandboxes: list[SandboxHandle],
                                            repo: Repo) -> None:
    a = await local_provider.create("r1", _git_spec(str(repo.bare), thread_dir="t-a"))
    sandboxes.append(a)
    pathlib.Path(a.data["home"], ".claude").mkdir()
    pathlib.Path(a.data["home"], ".claude", "session.json").write_text("{}")
    os.symlink("README.md", os.path.join(a.workdir, "link"))
    tar = await local_provider.export_tree(a)
    names = tarfile.open(fileobj=io.BytesIO(tar)).getnames()
    assert names[0] == "work" and "work/src/app.py" in names and "home/.claude/session.json" in names
    assert all(not n.startswith("/") for n in names)
    assert await local_provider.export_tree(a) == tar  # the same tree, the same bytes

    b = await local_provider.create("r2", SandboxSpec(thread_dir="t-b"))
    sandboxes.append(b)
    await local_provider.import_tree(b, tar)
    assert _files(b.workdir) == _files(a.workdir)
    assert os.readlink(os.path.join(b.workdir, "link")) == "README.md"
    assert pathlib.Path(b.data["home"], ".claude", "session.json").read_text() == "{}"
    assert git("rev-parse", "HEAD", cwd=pathlib.Path(b.workdir)) == repo.second


@pytest.mark.parametrize("name", ["/etc/passwd", "work/../../escape", "other/file", "../x"])
async def test_import_refuses_members_outside_the_tree(local_provider: LocalProvider,
                                                       sandboxes: list[SandboxHandle], name: str) -> None:
    h = await local_provider.create("r1", SandboxSpec(thread_dir="t"))
    sandboxes.append(h)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        ok = tarfile.TarInfo("work/fine.txt")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"ok"))
        bad = tarfile.TarInfo(name)
        bad.size = 3
        tar.addfile(bad, io.BytesIO(b"bad"))
    with pytest.raises(SandboxBuildFailed) as refused:
        await local_provider.import_tree(h, buf.getvalue())
    assert refused.value.step == "import"
    assert not os.path.exists(os.path.join(h.workdir, "fine.txt"))  # refused whole, before writing
