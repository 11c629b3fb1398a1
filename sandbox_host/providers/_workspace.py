"""Building a sandbox's workspace on the host: git clone/checkout, copy, limits, budget.

Shared by the local provider (which builds in place, on its own machine) and the docker and
kubernetes providers (which build in a temporary directory and send the result through the
sandbox's daemon: :func:`fill`), so all refuse, name and redact the same failures; every
provider runs the setup commands through the sandbox's daemon (:func:`run_setup`).

Credentials: a git workspace's credential reaches git through the environment only, as the
secrets :data:`GIT_USERNAME_ENV` and :data:`GIT_TOKEN_ENV` of the spec; git gets them as an
``Authorization`` header scoped to the repository's origin
(``http.<origin>/.extraHeader``, passed as ``GIT_CONFIG_COUNT``/``GIT_CONFIG_KEY_0``/
``GIT_CONFIG_VALUE_0``): never on a command line, never in the URL, and never written to the
clone's ``.git/config`` (an environment setting is not persisted). The token, the encoded
header and the header line are redacted from every error. Setup commands do not get them
(:func:`setup_env`): the user who wrote the setup commands names the credential, it does not
read it.

Git runs with ``HOME`` in a fresh temporary directory and no system config, so the host
user's own git configuration and credential helpers never serve a request.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import shutil
import tempfile
from typing import TYPE_CHECKING, AsyncIterator, Mapping
from urllib.parse import urlsplit

from baton.errors import SandboxBuildFailed
from sandbox_host.providers._base import SandboxSpec, run_host_command
from sandbox_host.providers._redact import redact

if TYPE_CHECKING:
    from sandbox_host.providers._daemon_client import DaemonClient

#: Secret names a git credential is passed under (host → provider, never to the agent).
GIT_USERNAME_ENV = "BATON_GIT_USERNAME"
GIT_TOKEN_ENV = "BATON_GIT_TOKEN"
CREDENTIAL_ENV = (GIT_USERNAME_ENV, GIT_TOKEN_ENV)
#: Bytes of a failing step's stderr (a setup command's output) kept in ``SandboxBuildFailed.detail``.
STDERR_TAIL = 2000
#: Seconds a setup command may run when the build has no budget (the daemon's own maximum).
SETUP_TIMEOUT = 3600.0
_SHA = re.compile(r"^[0-9a-fA-F]{7,64}$")
_ALLOWED_PROTOCOLS = "https:http:ssh:git:file"


class BuildSteps:
    """The build step running now (``workspace``, ``setup[i]``), so a timeout names it."""

    def __init__(self) -> None:
        self.current = "workspace"


@contextlib.asynccontextmanager
async def build_budget(seconds: float | None, steps: BuildSteps) -> AsyncIterator[None]:
    """Bound a build (clone, checkout, copy, setup) to ``seconds`` (``None``/0 = no bound).

    Raises:
        SandboxBuildFailed: the budget ran out; ``step`` is the step that was running.
    """
    cm = asyncio.timeout(seconds or None)
    try:
        async with cm:
            yield
    except TimeoutError:
        if not cm.expired():
            raise
        raise SandboxBuildFailed(
            steps.current, f"timed out: the workspace build took more than {seconds:g}s "
                           "(BATON_WORKSPACE_BUILD_TIMEOUT)") from None


def is_git_workspace(spec: SandboxSpec) -> bool:
    """Whether ``spec.workspace`` is cloned (else copied)."""
    if spec.workspace_is_git is not None:
        return spec.workspace_is_git
    src = spec.workspace or ""
    if spec.git_ref:
        return True
    return "://" in src or src.startswith("git@") or src.rstrip("/").endswith(".git")


def setup_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the git credential (setup commands never see it)."""
    return {k: v for k, v in env.items() if k not in CREDENTIAL_ENV}


def redactions(secrets: Mapping[str, str]) -> list[str]:
    """Every value to redact for ``secrets``: the values, and a credential's encodings."""
    values = [v for v in secrets.values() if v]
    header = _auth_header(secrets)
    if header is not None:
        values += [header, header.removeprefix("Authorization: Basic ")]
    return values


def _auth_header(secrets: Mapping[str, str]) -> str | None:
    token = secrets.get(GIT_TOKEN_ENV)
    if not token:
        return None
    user = secrets.get(GIT_USERNAME_ENV) or "x-access-token"
    return "Authorization: Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()


def git_env(url: str, secrets: Mapping[str, str], home: str) -> dict[str, str]:
    """The environment of every git command of a build (see the module docstring)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "HOME": home,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_ALLOW_PROTOCOL": _ALLOWED_PROTOCOLS,
        "GIT_SSH_COMMAND": "ssh -o BatchMode=yes",
    }
    header = _auth_header(secrets)
    if header is not None:
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}/"
        env.update({"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": f"http.{origin}.extraHeader",
                    "GIT_CONFIG_VALUE_0": header})
    return env


def tree_size(path: str) -> int:
    """Apparent size in bytes of every regular file under ``path`` (links not followed)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            total += st.st_size if not os.path.islink(os.path.join(dirpath, name)) else 0
    return total


async def check_size(path: str, spec: SandboxSpec) -> None:
    """Refuse a workspace over ``spec.max_workspace_bytes`` (``None``/0 = no limit).

    Raises:
        SandboxBuildFailed: ``workspace``, over the size limit.
    """
    limit = spec.max_workspace_bytes
    if not limit:
        return
    size = await asyncio.to_thread(tree_size, path)
    if size > limit:
        raise SandboxBuildFailed("workspace", f"over the size limit: {size} bytes > {limit} "
                                              "(BATON_WORKSPACE_MAX_BYTES)")


async def build_tree(spec: SandboxSpec, dest: str) -> None:
    """Fill ``dest`` (which must not exist) from ``spec.workspace``: clone, or copy a directory.

    Raises:
        SandboxBuildFailed: ``workspace``, with the redacted reason: ``git clone exit N:
            …``, ``unknown ref '…'``, ``git checkout exit N: …``, ``copy failed: …``, or
            ``over the size limit: …``.
    """
    src = spec.workspace
    assert src is not None
    if is_git_workspace(spec):
        await clone(src, spec.git_ref, dest, spec.secrets)
    else:
        try:
            await asyncio.to_thread(shutil.copytree, src, dest, symlinks=True)
        except (OSError, shutil.Error) as exc:
            raise SandboxBuildFailed("workspace", redact(f"copy failed: {exc}", redactions(spec.secrets))) from exc
    await check_size(dest, spec)


async def clone(url: str, ref: str | None, dest: str, secrets: Mapping[str, str]) -> None:
    """``git clone`` ``url`` into ``dest`` and check out ``ref``.

    A named ref (not a commit id) is first cloned shallow (``--depth 1 --branch``); when
    that fails (a commit id, an unknown name, or the server refused) a full clone follows,
    whose failure is the one reported, then ``ref`` is resolved and checked out.

    Raises:
        SandboxBuildFailed: ``workspace`` (see :func:`build_tree`); a partial clone is removed.
    """
    hide = redactions(secrets)
    home = await asyncio.to_thread(tempfile.mkdtemp, prefix="baton-git-home-")
    try:
        env = git_env(url, secrets, home)
        if ref and not _SHA.match(ref):
            code, _ = await run_host_command(
                ["git", "clone", "--quiet", "--depth", "1", "--branch", ref, "--", url, dest], None, env)
            if code == 0:
                return
            await asyncio.to_thread(shutil.rmtree, dest, True)
        argv = ["git", "clone", "--quiet", *(["--no-checkout"] if ref else []), "--", url, dest]
        code, err = await run_host_command(argv, None, env)
        if code != 0:
            raise SandboxBuildFailed("workspace", redact(f"git clone exit {code}: {_tail(err)}", hide))
        if not ref:
            return
        found = None
        for candidate in (f"{ref}^{{commit}}", f"origin/{ref}^{{commit}}"):
            code, _ = await run_host_command(["git", "rev-parse", "--verify", "--quiet", candidate], dest, env)
            if code == 0:
                found = candidate
                break
        if found is None:
            raise SandboxBuildFailed("workspace", redact(
                f"unknown ref {ref!r}: no branch, tag or commit of that name in the repository", hide))
        code, err = await run_host_command(
            ["git", "-c", "advice.detachedHead=false", "checkout", "--quiet", ref, "--"], dest, env)
        if code != 0:
            raise SandboxBuildFailed("workspace", redact(f"git checkout {ref!r} exit {code}: {_tail(err)}", hide))
    except BaseException:
        await asyncio.shield(asyncio.to_thread(shutil.rmtree, dest, True))
        raise
    finally:
        await asyncio.shield(asyncio.to_thread(shutil.rmtree, home, True))


async def fill(client: "DaemonClient", spec: SandboxSpec, *, workdir: str, home: str = "") -> None:
    """Fill a new sandbox's working directory (and a thread's agent home) through its daemon:
    the workspace is built on the host (cloned in a temporary directory, so no git and no
    credential need be in the sandbox; or a directory checked), then sent as one tree
    (``ImportTree``).

    Raises:
        SandboxBuildFailed: ``workspace`` (see :func:`build_tree`; ``not a directory: …``,
            ``copy failed: …``), redacted.
    """
    from sandbox_host.providers import _tree

    tmp = await asyncio.to_thread(tempfile.mkdtemp, prefix="baton-clone-")
    try:
        src = spec.workspace
        if src is not None and is_git_workspace(spec):
            src = os.path.join(tmp, "repo")
            await build_tree(spec, src)
        elif src is not None and not os.path.isdir(src):  # noqa: ASYNC240 -- one stat
            raise SandboxBuildFailed("workspace", redact(f"not a directory: {src}", redactions(spec.secrets)))
        elif src is not None:
            await check_size(src, spec)
        try:
            tar = await asyncio.to_thread(_tree.workspace_tar, src, bool(home))
            await client.import_tree(tar, workdir=workdir, home=home)
        except SandboxBuildFailed as exc:
            raise SandboxBuildFailed("workspace", redact(f"copy failed: {exc.detail}", redactions(spec.secrets))) from None
        except OSError as exc:
            raise SandboxBuildFailed("workspace", redact(f"copy failed: {exc}", redactions(spec.secrets))) from exc
    finally:
        await asyncio.shield(asyncio.to_thread(shutil.rmtree, tmp, True))


async def run_setup(client: "DaemonClient", spec: SandboxSpec, steps: BuildSteps, *, workdir: str,
                    home: str = "") -> None:
    """Run ``spec.setup`` in order, each as ``sh -c``, through the sandbox's daemon (``Exec``):
    in ``workdir``, with the agent's environment (``home``'s ``HOME``/``CODEX_HOME``,
    ``spec.env`` and ``spec.secrets``, less the git credential: :func:`setup_env`). The same
    for every provider. Call it inside :func:`build_budget`: a budget that runs out cancels
    the call, and the daemon kills the command's process group.

    Raises:
        SandboxBuildFailed: ``setup[i]`` for the first command that did not exit 0 (``exit N:
            <its output's tail>``, ``killed by signal N: …``) or could not be run; the
            detail is redacted (the secrets and the git credential's encodings).
    """
    hide = redactions(spec.secrets)
    env, secrets = setup_env(spec.env), setup_env(spec.secrets)
    for i, cmd in enumerate(spec.setup):
        steps.current = f"setup[{i}]"
        try:
            got = await client.exec(["sh", "-c", cmd], timeout=spec.build_timeout or SETUP_TIMEOUT, workdir=workdir,
                                    env=env, secrets=secrets, home=home, output_limit=STDERR_TAIL)
        except SandboxBuildFailed as exc:
            raise SandboxBuildFailed(f"setup[{i}]", redact(exc.detail, hide)) from None
        if got.exit_code != 0 or got.timed_out:
            tail = _tail(got.output)
            how = (f"timed out after {spec.build_timeout or SETUP_TIMEOUT:g}s" if got.timed_out
                   else f"killed by signal {-got.exit_code}" if got.exit_code < 0 else f"exit {got.exit_code}")
            raise SandboxBuildFailed(f"setup[{i}]", redact(f"{how}: {tail}" if tail else how, hide))


def _tail(err: bytes) -> str:
    return err[-STDERR_TAIL:].decode("utf-8", "replace").strip()


__all__ = ["BuildSteps", "CREDENTIAL_ENV", "GIT_TOKEN_ENV", "GIT_USERNAME_ENV", "build_budget", "build_tree",
           "check_size", "fill", "run_setup", "clone", "git_env", "is_git_workspace", "redactions", "setup_env", "tree_size"]
