"""Fixtures of the sandbox-host tests: local providers in temp dirs, corpus paths."""
from __future__ import annotations

import asyncio
import contextlib
import pathlib
from typing import AsyncIterator

import pytest

from sandbox_host.journal import JournalItem, follow_journal
from sandbox_host.providers import Provider, SandboxHandle
from sandbox_host.providers.local import LocalProvider

REPO = pathlib.Path(__file__).resolve().parents[2]
CORPUS = REPO / "corpus"
CLAUDE_FILES = sorted((CORPUS / "claude-stream-json").glob("*.jsonl"))
CODEX_FILES = sorted((CORPUS / "codex-exec-json").glob("*.jsonl"))
AGUI_FILES = sorted((CORPUS / "ag-ui").glob("*.jsonl"))


@pytest.fixture(params=["direct", "daemon"])
def local_provider(tmp_path: pathlib.Path, request: pytest.FixtureRequest) -> LocalProvider:
    """A local provider whose sandboxes and journals live under this test's tmp dir, each
    test run both ways a host reaches a local sandbox (``BATON_LOCAL_SANDBOX_IO``): on the
    machine, and through the sandbox's daemon as docker and kubernetes sandboxes are."""
    return LocalProvider(str(tmp_path / "sandboxes"), str(tmp_path / "journals"), idle_check=0.05,
                         sandbox_io=request.param)


@pytest.fixture
async def sandboxes(local_provider: LocalProvider) -> AsyncIterator[list[SandboxHandle]]:
    """A list tests append handles to; every one is destroyed at the end (no stray agents)."""
    handles: list[SandboxHandle] = []
    yield handles
    for h in handles:
        await local_provider.destroy(h)


def with_data(handle: SandboxHandle, data: dict[str, object]) -> SandboxHandle:
    """The handle with provider data from ``launch`` merged in (what the driver stores)."""
    return SandboxHandle(handle.provider, handle.key, handle.journal_path, handle.stderr_path,
                         handle.workdir, {**handle.data, **data})


async def follow_all(provider: Provider, handle: SandboxHandle, nonce: str, *, offset: int = 0,
                     timeout: float = 20.0) -> list[JournalItem]:
    """Every item the follower yields until it ends (bounded by ``timeout`` seconds)."""
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
