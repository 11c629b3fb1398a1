"""Coding sessions with the ``docker`` provider (real engine): three turns of a thread, for
``claude-code`` and ``codex``, across a host SIGKILL and the loss of every container.

The hosts run their sandboxes from an image derived offline from ``baton-sandbox:latest``
with the stand-in CLIs (``baton_tools/standins``) in ``/usr/local/bin``
(``BATON_DOCKER_IMAGE``). git runs on the host (the clone is copied into ``/workspace``), so
a local ``file://`` bare repository under ``BATON_WORKSPACE_DIRS`` is the thread's
workspace. Turn 2 runs after the host that drove turn 1 was SIGKILLed; turn 3 after that
host is gone too and every container of the thread's runs removed, so the workspace and the
agent's session (``/home/agent``) come back from the snapshot in JetStream's Object Store.

Skipped (failed under ``CI=true``) unless ``BATON_TEST_DOCKER=1``.
"""
from __future__ import annotations

import asyncio
import contextlib
import pathlib
import shutil
from typing import Any, AsyncIterator, Iterator

import httpx
import pytest

from baton.log import LogConfig
from baton_tools.standins import STANDINS
from tests.conftest import assert_eventually, unique
from tests.docker.conftest import DOCKER_MARKS
# The gateway suite's fixtures: one coordinator, delivery-log stream and replay dir per session.
from tests.gateway.conftest import (  # noqa: F401
    Gateway, coordinator, host_settings, http, log_cfg, make_gateway, replay_dir,
)
from tests.sandbox.gitrepos import make_repo
from tests.sessions_support import Cluster, driver_of, terminal, texts, turn

pytestmark = [*DOCKER_MARKS, pytest.mark.timeout(300)]

IMAGE = "baton-sandbox-standins:test"
BASE_IMAGE = "baton-sandbox:latest"


@pytest.fixture(scope="module")
def standins_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The sandbox image with the stand-ins on ``PATH`` (built offline from the local base).

    At the module's end no container of it is left (a host killed between a run's close and
    its sandbox's removal leaves one, as may a failed test)."""
    import docker
    import docker.errors

    ctx = tmp_path_factory.mktemp("standins-image")
    for name, path in STANDINS.items():
        shutil.copy(path, ctx / name)
        (ctx / name).chmod(0o755)
    (ctx / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nCOPY {' '.join(sorted(STANDINS))} /usr/local/bin/\n")
    client = docker.from_env()
    try:
        client.images.build(path=str(ctx), tag=IMAGE, pull=False, rm=True, forcerm=True)
        yield IMAGE
        for c in client.containers.list(all=True, sparse=True, filters={"ancestor": IMAGE}):
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                c.remove(force=True, v=True)
    finally:
        client.close()


@pytest.fixture(scope="module")
async def cluster(standins_image: str, coordinator: Any, nats: Any, log_cfg: LogConfig, replay_dir: pathlib.Path,
                  tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    root = tmp_path_factory.mktemp("dsessions")
    allowed = root / "allowed"
    allowed.mkdir()
    repo = make_repo(allowed)
    settings = {**host_settings(log_cfg, replay_dir, root), "BATON_PROVIDER": "docker",
                "BATON_DOCKER_IMAGE": standins_image, "BATON_WORKSPACE_DIRS": str(allowed),
                "BATON_WORKSPACE_OBJECTS": unique("ws-objects"), "BATON_WORKSPACE_HEADS": unique("ws-heads")}
    c = Cluster(root, repo, allowed, coordinator, nats, settings)
    await c.add_host()
    await c.add_host()
    try:
        yield c
    finally:
        await c.stop()


@pytest.fixture
async def gw(cluster: Cluster, make_gateway: Any) -> Gateway:
    return await make_gateway(keepalive=0.5, workspace_dirs=(str(cluster.allowed.resolve()),))


async def remove_containers(run_ids: list[str]) -> None:
    """``docker rm -f`` every container labelled with one of the runs (``baton.run_id``),
    and wait until none is left (a host may be removing one at the same time)."""
    import docker
    import docker.errors

    from sandbox_host.providers.docker import LABEL_RUN

    client = docker.from_env()

    async def left() -> list[Any]:
        found: list[Any] = []
        for run_id in run_ids:
            found += await asyncio.to_thread(client.containers.list, all=True, sparse=True,
                                             filters={"label": f"{LABEL_RUN}={run_id}"})
        return found

    try:
        for c in await left():
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):  # 409: being removed
                await asyncio.to_thread(c.remove, force=True, v=True)

        async def none_left() -> bool:
            return await left() == []
        await assert_eventually(none_left, timeout=30)
    finally:
        client.close()


@pytest.mark.parametrize("kind", ["claude-code", "codex"])
async def test_three_turns_across_a_killed_host_and_lost_containers(
        kind: str, cluster: Cluster, gw: Gateway, http: httpx.AsyncClient) -> None:
    thread = unique(f"d-{kind}-thr-")
    ws = {"git": f"file://{cluster.repo.bare}", "ref": "main"}

    run1, c1 = await turn(http, gw, thread, kind, "write notes.txt turn one\nrun cat README.md; pwd", ws)
    assert terminal(c1)["type"] == "RUN_FINISHED", terminal(c1)
    seen1 = texts(c1)
    assert "hello" in seen1 and "/workspace" in seen1  # the repository's README, in the container

    # The host that drove turn 1 dies; a fresh host takes its place.
    await cluster.kill(await driver_of(http, gw, run1))
    await cluster.add_host()

    run2, c2 = await turn(http, gw, thread, kind, "recall\nrun cat notes.txt\nappend notes.txt turn two")
    assert terminal(c2)["type"] == "RUN_FINISHED", terminal(c2)
    seen2 = texts(c2)
    assert "turn one" in seen2  # turn 1's file
    assert "write notes.txt turn one" in seen2  # turn 1's prompt, remembered: the session resumed

    # That host goes too, and every container of the thread's runs: turn 3 starts from the
    # snapshot alone.
    await cluster.kill(await driver_of(http, gw, run2))
    await remove_containers([run1, run2])
    await cluster.add_host()

    run3, c3 = await turn(http, gw, thread, kind, "recall\nrun cat notes.txt src/app.py")
    assert terminal(c3)["type"] == "RUN_FINISHED", terminal(c3)
    seen3 = texts(c3)
    assert "turn one\nturn two" in seen3 and "print('app')" in seen3
    assert "write notes.txt turn one" in seen3 and "append notes.txt turn two" in seen3

    msgs = (await http.get(f"{gw.url}/api/threads/{thread}/messages")).json()["messages"]
    users = [m["content"] for m in msgs if m["role"] == "user"]
    assert users == ["write notes.txt turn one\nrun cat README.md; pwd",
                     "recall\nrun cat notes.txt\nappend notes.txt turn two",
                     "recall\nrun cat notes.txt src/app.py"]
    assert [m for m in msgs if m["role"] == "assistant"]  # the agent's replies are kept too
