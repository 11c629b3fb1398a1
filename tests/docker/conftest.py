"""Fixtures of the docker-provider tests: a real engine, one SDK client per provider.

Every test here needs a running Docker engine and the offline sandbox image
(``scripts/docker_setup.sh`` provides both; ``.ci/run`` calls it and exports
``BATON_TEST_DOCKER=1`` when it succeeded). Without that variable the tests are skipped
with the reason below (failed under ``CI=true``: tests/conftest.py ``require``); with it, a
missing engine is a failure, not a skip.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
from typing import AsyncIterator, Mapping, TYPE_CHECKING

import pytest

from sandbox_host.journal import JournalItem, follow_journal
from sandbox_host.providers import Provider, SandboxHandle

if TYPE_CHECKING:
    from sandbox_host.providers.docker import DockerProvider

DOCKER_ENABLED = os.environ.get("BATON_TEST_DOCKER") == "1"
SKIP_REASON = (
    "docker tests need a Docker engine and the baton-sandbox image: "
    "run scripts/docker_setup.sh and set BATON_TEST_DOCKER=1 (as .ci/run does)"
)


#: Put on every docker test module: ``pytestmark = DOCKER_MARKS``.
DOCKER_MARKS = [pytest.mark.docker, pytest.mark.requires(DOCKER_ENABLED, reason=SKIP_REASON)]


@pytest.fixture
async def docker_provider() -> AsyncIterator["DockerProvider"]:
    """A provider with its own SDK client and daemon channels (closed at the end)."""
    from sandbox_host.providers.docker import DockerProvider

    provider = DockerProvider()
    yield provider
    await provider.aclose()


@pytest.fixture
async def containers(docker_provider: "DockerProvider") -> AsyncIterator[list[SandboxHandle]]:
    """Handles the test created; each container is removed at the end (no strays)."""
    handles: list[SandboxHandle] = []
    yield handles
    for h in handles:
        with contextlib.suppress(Exception):
            await docker_provider.destroy(h)


def with_data(handle: SandboxHandle, data: Mapping[str, object]) -> SandboxHandle:
    """The handle with provider data from ``launch`` merged in (what the driver stores)."""
    return SandboxHandle(
        handle.provider, handle.key, handle.journal_path, handle.stderr_path, handle.workdir,
        {**handle.data, **data},
    )


def roundtrip(handle: SandboxHandle) -> SandboxHandle:
    """The handle as another host gets it back from etcd (JSON, no live objects)."""
    raw = json.loads(json.dumps(dataclasses.asdict(handle)))
    return SandboxHandle(**raw)


async def follow_all(
    provider: Provider, handle: SandboxHandle, nonce: str, *, offset: int = 0, timeout: float = 30.0
) -> list[JournalItem]:
    """Every item the journal follower yields until it ends (bounded by ``timeout`` s)."""

    async def run() -> list[JournalItem]:
        out: list[JournalItem] = []
        async with contextlib.aclosing(
            follow_journal(provider, handle, handle.journal_path, offset=offset, nonce=nonce, poll_interval=0.05)
        ) as items:
            async for it in items:
                out.append(it)
        return out

    async with asyncio.timeout(timeout):
        return await run()


async def container_processes(provider: "DockerProvider", handle: SandboxHandle) -> list[str]:
    """Command names of the processes in the sandbox's container (the image has no ps)."""
    code, out, _ = await provider._exec(
        handle.data["container_id"],
        ["sh", "-c", "for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done"],
    )
    assert code == 0
    return out.decode().split()
