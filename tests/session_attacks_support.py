"""Helpers of the hostile-client tests of coding sessions (tests/gateway/test_session_attacks.py).

The secrets the attacks use (a git token, tenants' API keys, a variable only the hosts'
environment holds), the repositories they clone (one with symlinks out of its tree, one
outside the allow-list), and the sweep that reads every place a secret must never land:
host logs, journals, this process's log records, error bodies, every JetStream message and
every thread head's restored workspace.
"""
from __future__ import annotations

import base64
import logging
import os
import pathlib
from typing import Any

import pytest

from baton_tools.standins import STANDINS_DIR
from tests.sandbox.gitrepos import git, make_repo
from tests.sessions_support import Cluster

GIT_USER = "ci-bot"
GIT_TOKEN = "ghpBRKtoken0123456789SECRETx"  # noqa: S105 -- a test secret
KEY_A = "key-tenantA-APIKEY-7f3c9e1d"
KEY_B = "key-tenantB-APIKEY-0b2d4a8c"
TENANT_A, TENANT_B = "tenant-a", "tenant-b"
HOST_SECRET = "hostonlySECRET91ab"  # in the hosts' environment only (AWS_SECRET_ACCESS_KEY)
OUTSIDE_CONTENT = "OUTSIDE-THE-ALLOW-LIST-4242"


def basic(user: str, token: str) -> str:
    return base64.b64encode(f"{user}:{token}".encode()).decode()


#: Strings that must never appear in a log, journal, record, error body or snapshot.
SECRETS = (GIT_TOKEN, basic(GIT_USER, GIT_TOKEN), KEY_A, KEY_B, HOST_SECRET)


class AttackCluster(Cluster):
    """A :class:`Cluster` whose hosts also hold :data:`HOST_SECRET` in their environment."""

    async def add_host(self) -> Any:
        from baton_tools.testing.cluster import start_host

        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("PATH", f"{STANDINS_DIR}:{os.environ['PATH']}")
            mp.setenv("ANTHROPIC_API_KEY", "test-key")
            mp.setenv("OPENAI_API_KEY", "test-key")
            mp.setenv("AWS_SECRET_ACCESS_KEY", HOST_SECRET)
            h = await start_host(self.coordinator.address, self.nats.url, log_dir=self.tmp / "logs", **self.settings)
        self.hosts.append(h)
        return h


def make_tricks_repo(allowed: pathlib.Path) -> pathlib.Path:
    """A bare repository whose tree holds symlinks out of it (absolute and climbing), one
    inside it, and an executable script."""
    repo = make_repo(allowed, "tricks.git")
    work = allowed.parent / "tricks-edit"
    git("clone", "-q", str(repo.bare), str(work))
    os.symlink("/etc/passwd", work / "passwd")
    os.symlink("../" * 12 + "etc/passwd", work / "climb")
    os.symlink("README.md", work / "inside")
    (work / "tool.sh").write_text("#!/bin/sh\necho EXEC-OK\n")
    (work / "tool.sh").chmod(0o755)
    git("add", "-A", cwd=work)
    git("commit", "-qm", "tricks", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    return repo.bare


def make_outside_repo(root: pathlib.Path) -> pathlib.Path:
    """A bare repository outside the allow-list holding :data:`OUTSIDE_CONTENT`."""
    repo = make_repo(root / "outside", "secret.git")
    work = root / "outside-edit"
    git("clone", "-q", str(repo.bare), str(work))
    (work / "secret.txt").write_text(OUTSIDE_CONTENT + "\n")
    git("add", "-A", cwd=work)
    git("commit", "-qm", "secret", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    return repo.bare


class Records(logging.Handler):
    """Every log record of this process (the in-process gateways), formatted."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(name)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception:  # noqa: BLE001 -- a record that cannot format is not a secret
            pass


def files_holding(root: pathlib.Path, needles: tuple[str, ...]) -> list[str]:
    """``path: needle`` for every file under ``root`` that holds a needle (bytes compared)."""
    found = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = pathlib.Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                continue
            data = path.read_bytes()
            found += [f"{path}: {n}" for n in needles if n.encode() in data]
    return found


async def jetstream_holding(nats_url: str, needles: tuple[str, ...]) -> list[str]:
    """``stream/seq: needle`` for every JetStream message (every stream) holding a needle."""
    import nats
    from nats.js.errors import NotFoundError

    found = []
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        for info in await js.streams_info():
            name, state = str(info.config.name), info.state
            for seq in range(max(state.first_seq, 1), state.last_seq + 1):
                try:
                    msg = await js.get_msg(name, seq)
                except NotFoundError:
                    continue
                data = (msg.data or b"") + repr(msg.headers or {}).encode()
                found += [f"{name}/{seq} {msg.subject}: {n} in ...{_around(data, n)!r}"
                          for n in needles if n.encode() in data]
    finally:
        await nc.close()
    return found


def _around(data: bytes, needle: str) -> bytes:
    i = data.find(needle.encode())
    return data[max(0, i - 160):i]
