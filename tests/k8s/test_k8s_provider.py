"""The kubernetes provider on the stand-in cluster (tests/k8s/conftest.py): a pod per sandbox
with its daemon inside, found by run from any host, destroyed with its deletion confirmed."""
from __future__ import annotations

import json
import signal

import pytest

from baton_tools.testing.kube import StandinCluster
from sandbox_host.providers import SandboxHandle, SandboxSpec
from sandbox_host.providers import _k8s_pod as kp
from tests.conftest import assert_eventually
from tests.k8s.conftest import make_provider

pytestmark = [pytest.mark.servers, pytest.mark.timeout(180)]


def spec(run_id: str, **kw: object) -> SandboxSpec:
    return SandboxSpec(provider="kubernetes", env={"BATON_RUN_ID": run_id}, **kw)  # type: ignore[arg-type]


async def test_create_launch_journal_destroy(kube: StandinCluster) -> None:
    async with make_provider(kube) as p:
        h = await p.create("run-a", spec("run-a"))
        (pod,) = kube.pods()
        assert pod["metadata"]["name"] == h.data["pod"] and pod["status"]["phase"] == "Running"
        assert pod["metadata"]["labels"][kp.LABEL_RUN] == kp.label_hash("run-a")
        assert pod["metadata"]["annotations"][kp.ANN_RUN] == "run-a"
        assert h.data["daemon"] == f"{pod['status']['podIP']}:7300"
        await p.copy_in(h, "hello.txt", b"hi there\n")
        launched = await p.launch(h, ["sh", "-c", 'cat hello.txt; echo "{\\"env\\": \\"$BATON_RUN_ID $API_KEY\\"}"'],
                                  nonce="0a0b0c", env={"BATON_RUN_ID": "run-a"}, secrets={"API_KEY": "k3y"})
        h = SandboxHandle(**{**h.__dict__, "data": {**h.data, **launched}})

        async def ended() -> bytes:
            data = await p.read_file(h, h.journal_path)
            assert b'"__exit":0' in data, data
            return data
        journal = await assert_eventually(ended, timeout=30)
        lines = journal.decode().splitlines()
        assert lines[0] == "hi there" and json.loads(lines[1]) == {"env": "run-a k3y"}
        assert json.loads(lines[-1]) == {"__exit": 0, "__nonce": "0a0b0c"}
        assert await p.file_size(h, h.journal_path) == len(journal)

        async def exited() -> bool:
            # The wrapper appends the exit line, then exits: alive for a moment after it.
            return not await p.processes_alive(h)
        await assert_eventually(exited, timeout=10)
        assert await p.exists(h)
        assert await p.destroy(h) is True
        assert kube.pods() == [] and not kube.kubelet.pods  # gone from the API and from its node
        assert not await p.exists(h)
        assert await p.destroy(h) is False


async def test_any_host_reopens_a_sandbox_from_its_handle_and_follows_it(kube: StandinCluster) -> None:
    async with make_provider(kube) as first, make_provider(kube) as second:
        h = await first.create("run-b", spec("run-b"))
        launched = await first.launch(h, ["sh", "-c", "for i in 1 2 3; do echo line$i; sleep 0.2; done"], nonce="0d0e0f")
        await first.close()  # the first host is gone; the handle is what the registry kept
        h = SandboxHandle(**{**h.__dict__, "data": {**h.data, **launched}})
        got = b""
        async for chunk in second.follow(h, h.journal_path, 0):
            got += chunk.data
            if b"__exit" in got:
                break
        assert got.startswith(b"line1\nline2\nline3\n")
        assert await second.destroy(h)


async def test_a_killed_agent_and_the_pods_processes(kube: StandinCluster) -> None:
    async with make_provider(kube) as p:
        h = await p.create("run-c", spec("run-c"))
        launched = await p.launch(h, ["sleep", "600"], nonce="0d0e0f")
        h = SandboxHandle(**{**h.__dict__, "data": {**h.data, **launched}})
        assert await p.processes_alive(h)
        assert await p.kill(h, signal.SIGTERM)
        async def dead() -> bool:
            return not await p.processes_alive(h)
        await assert_eventually(dead, timeout=20)
        await p.destroy(h)


async def test_leftovers_of_a_run_are_found_by_label_and_removed(kube: StandinCluster) -> None:
    async with make_provider(kube) as p:
        keep = await p.create("run-d#2", spec("run-d"))
        await p.create("run-d", spec("run-d"))
        other = await p.create("run-x", spec("run-x"))
        assert len(kube.pods()) == 3
        assert await p.destroy_leftovers("run-d", keep_key="run-d#2") == 1
        names = {pod["metadata"]["name"] for pod in kube.pods()}
        assert names == {keep.data["pod"], other.data["pod"]}
        assert await p.destroy_leftovers("run-d", keep_key=None) == 1
        assert await p.destroy_leftovers("run-x", keep_key=None) == 1
        assert kube.pods() == []


async def test_with_the_agent_sandbox_crd_a_sandbox_resource_makes_the_pod(kube_crd: StandinCluster) -> None:
    async with make_provider(kube_crd) as p:
        h = await p.create("run-s", spec("run-s"))
        assert h.data["sandbox_resource"] is True
        (sb,) = kube_crd.store.list("sandboxes.agents.x-k8s.io", "default")
        (pod,) = kube_crd.pods()
        assert sb["metadata"]["name"] == pod["metadata"]["name"] == h.data["pod"]
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "Sandbox"
        assert await p.destroy(h)
        assert kube_crd.pods() == [] and kube_crd.store.list("sandboxes.agents.x-k8s.io", "default") == []
        await p.create("run-s2", spec("run-s2"))
        assert await p.destroy_leftovers("run-s2", None) == 1
        assert kube_crd.pods() == [] and kube_crd.store.list("sandboxes.agents.x-k8s.io", "default") == []


async def test_a_threads_agent_gets_an_absolute_home_in_the_pod(kube: StandinCluster, tmp_path: object) -> None:
    """A thread's sandbox has an agent home (``home/`` beside ``work/``): the agent's HOME is
    that directory's absolute path in the pod, not ``home`` taken from its working directory,
    so what it keeps there (its session store) is in the tree's ``home/``."""
    import io
    import tarfile

    async with make_provider(kube) as p:
        h = await p.create("run-h", spec("run-h", thread_dir="thread-h"))
        assert h.data["home"]
        script = ('echo "{\\"home\\": \\"$HOME\\", \\"codex\\": \\"$CODEX_HOME\\"}"; '
                  'mkdir -p "$HOME/.claude" && echo kept > "$HOME/.claude/session"')
        launched = await p.launch(h, ["sh", "-c", script], nonce="0a0b0d")
        h = SandboxHandle(**{**h.__dict__, "data": {**h.data, **launched}})

        async def ended() -> bytes:
            data = await p.read_file(h, h.journal_path)
            assert b'"__exit":0' in data, data
            return data
        got = json.loads((await assert_eventually(ended, timeout=30)).decode().splitlines()[0])
        assert got["home"].startswith("/") and got["home"].endswith("/home"), got
        assert got["codex"] == got["home"] + "/.codex"
        with tarfile.open(fileobj=io.BytesIO(await p.export_tree(h))) as tar:
            names = set(tar.getnames())
        assert "home/.claude/session" in names and "work/home/.claude/session" not in names, names
        assert await p.destroy(h)
