"""Helpers of the coding-session tests (docs/design.md §4.3): hosts started with the stand-in
CLIs (``baton_tools/standins``) first on ``PATH``, a thread's turn as a chat client takes it,
and what a user reads of a run.

Used by tests/gateway/test_sessions.py, tests/gateway/test_session_errors.py and
tests/docker/test_docker_sessions.py (their fixtures come from tests/gateway/conftest.py).
"""
from __future__ import annotations

import os
import pathlib
from typing import Any

import httpx
import pytest

from baton_tools.standins import STANDINS_DIR
from tests.conftest import unique
from tests.gateway.conftest import Gateway, read_stream
from tests.sandbox.gitrepos import Repo


class Cluster:
    """Sandbox hosts of one test module, all with the same ``BATON_*`` settings, restartable.

    Args:
        tmp: the module's directory (``sandboxes/``, ``journals/``, ``logs/`` under it).
        repo: the module's git repository (a bare repository under ``allowed``).
        allowed: the directory ``BATON_WORKSPACE_DIRS`` names.
        coordinator: the coordinator handle (``.address``).
        nats: the nats-server (``.url``).
        settings: the hosts' ``BATON_*`` settings.
    """

    def __init__(self, tmp: pathlib.Path, repo: Repo, allowed: pathlib.Path, coordinator: Any, nats: Any,
                 settings: dict[str, str]) -> None:
        self.tmp, self.repo, self.allowed = tmp, repo, allowed
        self.coordinator, self.nats, self.settings = coordinator, nats, settings
        self.hosts: list[Any] = []

    async def add_host(self) -> Any:
        """Start one more host (the stand-ins first on its ``PATH``, API keys set)."""
        from baton_tools.testing.cluster import start_host

        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("PATH", f"{STANDINS_DIR}:{os.environ['PATH']}")
            mp.setenv("ANTHROPIC_API_KEY", "test-key")
            mp.setenv("OPENAI_API_KEY", "test-key")
            h = await start_host(self.coordinator.address, self.nats.url, log_dir=self.tmp / "logs", **self.settings)
        self.hosts.append(h)
        return h

    async def kill(self, host_id: str) -> None:
        """SIGKILL the host ``host_id`` (its agents live on, detached)."""
        h = next(h for h in self.hosts if h.host_id == host_id)
        await h.kill()
        self.hosts.remove(h)

    async def stop(self) -> None:
        for h in self.hosts:
            await h.stop()
        self.hosts.clear()


def chat_body(thread: str, kind: str, prompt: str, history: list[dict[str, Any]],
              workspace: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``POST /api/chat`` body as a chat client sends it: the thread's messages so far,
    then the new one."""
    body: dict[str, Any] = {"threadId": thread, "agent": {"kind": kind},
                            "messages": [*history, {"id": unique("u"), "role": "user", "content": prompt}]}
    if workspace is not None:
        body["workspace"] = workspace
    return body


async def history(http: httpx.AsyncClient, gw: Gateway, thread: str) -> list[dict[str, Any]]:
    """The thread's saved transcript (``[]`` before its first run ends)."""
    saved = await http.get(f"{gw.url}/api/threads/{thread}/messages")
    return list(saved.json()["messages"]) if saved.status_code == 200 else []


async def turn(http: httpx.AsyncClient, gw: Gateway, thread: str, kind: str, prompt: str,
               workspace: dict[str, Any] | None = None) -> tuple[str, list[dict[str, Any]]]:
    """One turn of ``thread``, read to its end: ``(run id, its chunks)``."""
    run_id = unique("run-")
    body = chat_body(thread, kind, prompt, await history(http, gw, thread), workspace)
    got = await read_stream(http, "POST", f"{gw.url}/api/chat?runId={run_id}", json=body)
    assert got.status == 200, got
    assert got.ended
    return run_id, [c for _, c in got.events]


async def refused_turn(http: httpx.AsyncClient, gw: Gateway, thread: str, kind: str, prompt: str,
                       workspace: dict[str, Any] | None) -> tuple[str, httpx.Response]:
    """A turn the gateway or host refuses before the run exists: ``(run id, the response)``."""
    run_id = unique("run-")
    body = chat_body(thread, kind, prompt, await history(http, gw, thread), workspace)
    return run_id, await http.post(f"{gw.url}/api/chat?runId={run_id}", json=body)


def texts(chunks: list[dict[str, Any]]) -> str:
    """Everything the user reads: text deltas and tool results."""
    out = []
    for c in chunks:
        if c["type"] == "TEXT_MESSAGE_CONTENT":
            out.append(c["delta"])
        elif c["type"] == "TEXT_MESSAGE_END":
            out.append("\n")
        elif c["type"] == "TOOL_CALL_RESULT":
            out.append(f"{c.get('content')}\n")
    return "".join(out)


def terminal(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's terminal chunk (``RUN_FINISHED`` or ``RUN_ERROR``)."""
    return next(c for c in reversed(chunks) if c["type"] in ("RUN_FINISHED", "RUN_ERROR"))


async def driver_of(http: httpx.AsyncClient, gw: Gateway, run_id: str) -> str:
    """The host driving (or that last drove) the run."""
    view = (await http.get(f"{gw.url}/api/runs/{run_id}")).json()
    return str(view["driverHost"])
