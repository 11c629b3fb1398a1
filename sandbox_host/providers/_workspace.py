"""Building a sandbox's workspace on the host: git clone/checkout, copy, limits, budget.

Shared by the local provider (which builds in place) and the docker provider (which builds
in a temporary directory and copies the result in), so both refuse, name and redact the
same failures.

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
from typing import AsyncIterator, Mapping
from urllib.parse import urlsplit

from baton.errors import SandboxBuildFailed
from sandbox_host.providers._base import SandboxSpec, run_host_command
from sandbox_host.providers._redact import redact

#: Secret names a git credential is passed under (host → provider, never to the agent).
GIT_USERNAME_ENV = "BATON_GIT_USERNAME"
GIT_TOKEN_ENV = "BATON_GIT_TOKEN"
CREDENTIAL_ENV = (GIT_USERNAME_ENV, GIT_TOKEN_ENV)
#: Bytes of a failing step's stderr kept in ``SandboxBuildFailed.detail``.
STDERR_TAIL = 2000
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


def _tail(err: bytes) -> str:
    return err[-STDERR_TAIL:].decode("utf-8", "replace").strip()


__all__ = ["BuildSteps", "CREDENTIAL_ENV", "GIT_TOKEN_ENV", "GIT_USERNAME_ENV", "build_budget", "build_tree",
           "check_size", "clone", "git_env", "is_git_workspace", "redactions", "setup_env", "tree_size"]
