"""A workspace's setup commands on the kubernetes provider run through the pod's daemon
(``Exec``), as on every provider: in order, in the working directory, with the spec's env and
secrets; a failing one fails the create clearly (its exit code and its output's tail, no
secret) and the pod is deleted. On the stand-in cluster (tests/k8s/conftest.py)."""
from __future__ import annotations

import pathlib
from typing import Any

import pytest

from baton.errors import SandboxBuildFailed
from baton_tools.testing.kube import StandinCluster
from sandbox_host.providers import SandboxSpec
from tests.conftest import assert_eventually
from tests.k8s.conftest import make_provider

pytestmark = [pytest.mark.servers, pytest.mark.timeout(180)]
SECRET = "k8s-setup-SECRET-7f3a9c"


def spec(tmp: pathlib.Path | None, setup: tuple[str, ...], **kw: Any) -> SandboxSpec:
    return SandboxSpec(provider="kubernetes", env={"BATON_RUN_ID": "run-s", "MODE": "built"},
                       secrets={"API_KEY": SECRET}, setup=setup,
                       workspace=str(tmp) if tmp else None, workspace_is_git=False, **kw)


async def test_setup_commands_run_in_order_in_the_workspace(kube: StandinCluster, tmp_path: pathlib.Path) -> None:
    src = tmp_path / "proj"
    src.mkdir()
    (src / "input.txt").write_text("from the host\n")
    async with make_provider(kube) as p:
        h = await p.create("run-s", spec(src, (
            "cat input.txt > steps.txt",
            'echo "$MODE ${#API_KEY} ${BATON_INTERNAL_TOKEN:-no-token}" >> steps.txt',
            'echo "$(basename "$PWD") $(basename "$HOME")" >> steps.txt',
        ), thread_dir="t"))
        try:
            got = await p.read_file(h, f"{h.workdir}/steps.txt")
            assert got.decode().splitlines() == ["from the host", f"built {len(SECRET)} no-token", "work home"]
        finally:
            await p.destroy(h)


async def test_a_failing_setup_command_fails_clearly_and_leaves_nothing(kube: StandinCluster) -> None:
    async with make_provider(kube) as p:
        with pytest.raises(SandboxBuildFailed) as failed:
            await p.create("run-s", spec(None, ("true", 'echo "using $API_KEY"; echo "no such tool" >&2; exit 7')))
    assert failed.value.step == "setup[1]"
    assert failed.value.detail == "exit 7: using [REDACTED]\nno such tool"
    assert SECRET not in str(failed.value)
    assert kube.pods() == []
    await assert_eventually(lambda: not kube.kubelet.pods, timeout=30)


async def test_a_setup_command_out_of_budget_is_killed_and_named(kube: StandinCluster) -> None:
    async with make_provider(kube) as p:
        with pytest.raises(SandboxBuildFailed) as failed:
            await p.create("run-s", spec(None, ("sleep 300",), build_timeout=2.0))
    assert failed.value.step == "setup[0]" and "timed out" in failed.value.detail
    assert kube.pods() == []
