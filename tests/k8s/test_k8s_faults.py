"""The kubernetes provider end to end, with every baton process real and the cluster a stand-in
(tests/k8s/conftest.py: an API server and a kubelet that runs each pod's daemon as local
processes at its own loopback address; nothing here ran against a real cluster).

Each case runs whole runs through the gateway (the replay agent, launched by each pod's
sandbox daemon) and compares them with the uninterrupted replay of their journals
(:meth:`tests.faults.harness.FaultCluster.check`: 0 chunks lost or duplicated, equal
transcripts); then no sandbox pod of the runs is left.
"""
from __future__ import annotations

import asyncio
import pathlib
import signal
from typing import Any, AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio

from baton_tools.testing.kube import StandinCluster
from sandbox_host.providers import _k8s_pod as kp
from tests.faults.harness import SHORT, FaultCluster, eventually
from tests.k8s.conftest import IMAGE

pytestmark = [pytest.mark.servers]

Factory = Callable[..., Awaitable[FaultCluster]]


def _host_env(kube: StandinCluster) -> dict[str, str]:
    return {"BATON_PROVIDER": "kubernetes", "BATON_K8S_KUBECONFIG": str(kube.kubeconfig),
            "BATON_K8S_NAMESPACE": "default", "BATON_K8S_IMAGE": IMAGE, "BATON_K8S_SERVICE_ACCOUNT": "",
            "BATON_K8S_GRACE": "3", "BATON_K8S_READY_TIMEOUT": "60"}


@pytest_asyncio.fixture
async def k8s_cluster(kube: StandinCluster, tmp_path: pathlib.Path,
                      request: pytest.FixtureRequest) -> AsyncIterator[Factory]:
    """``c = await k8s_cluster(hosts=3)``: a FaultCluster whose hosts use the kubernetes
    provider on the stand-in; closed at the end, after which no pod of its runs may be left."""
    made: list[FaultCluster] = []

    async def make(**kw: Any) -> FaultCluster:
        c = FaultCluster(tmp_path / "cluster", request.node.name)
        made.append(c)
        return await c.start(host_env={**_host_env(kube), **kw.pop("host_env", {})}, **kw)

    yield make
    for c in made:
        await c.close()


async def no_pods_left(kube: StandinCluster, c: FaultCluster) -> None:
    """Every run's sandbox pod is gone from the API and from the node."""
    ids = {kp.label_hash(r.run_id) for r in c.runs}

    def gone() -> bool:
        left = [p["metadata"]["name"] for p in kube.pods() if p["metadata"]["labels"].get(kp.LABEL_RUN) in ids]
        assert not left, f"sandbox pods left: {left}"
        return True
    await eventually(gone, 60)


def _pod_of(kube: StandinCluster, run_id: str) -> dict[str, Any]:
    (pod,) = [p for p in kube.pods() if p["metadata"]["annotations"].get(kp.ANN_RUN) == run_id
              and not p["metadata"].get("deletionTimestamp")]
    return pod


@pytest.mark.timeout(300)
async def test_host_sigkill_then_takeover_then_cancel(kube: StandinCluster, k8s_cluster: Factory) -> None:
    """create → launch → journal → the driving host SIGKILLed → another host takes the runs over
    (reading each journal from its pod's daemon) → they finish equal to the uninterrupted
    replay; then a run cancelled mid-way: its pod is deleted and confirmed gone."""
    c = await k8s_cluster(hosts=3)
    runs = await c.start_runs(2, seconds=10, detached=1)
    await c.wait_progress(runs, 15)
    assert len([p for p in kube.pods() if p["status"].get("phase") == "Running"]) >= 2
    victim, _ = await c.busiest_host(runs)
    async with c.fault(f"host {victim.host_id} SIGKILL"):
        victim.kill_now()
    await c.finish(runs)
    await c.check(runs)
    await no_pods_left(kube, c)

    (run,) = await c.start_runs(1, seconds=30)
    await c.wait_progress([run], 10)
    pod = _pod_of(kube, run.run_id)["metadata"]["name"]
    resp = await c.http.post(f"{c.url}/api/chat/cancel", json={"runId": run.run_id})
    assert resp.status_code == 202, resp.text
    await c.finish([run])
    assert (await c.view(run.run_id)).get("status") in ("cancelled", "aborted")
    await eventually(lambda: pod not in {p["metadata"]["name"] for p in kube.pods()}, 60)
    await no_pods_left(kube, c)


@pytest.mark.timeout(300)
async def test_a_paused_host_wakes_after_its_successors_finished(kube: StandinCluster, k8s_cluster: Factory) -> None:
    c = await k8s_cluster(hosts=1)
    runs = await c.start_runs(3, SHORT, seconds=10, detached=1)
    await c.add_host(**_host_env(kube))
    zombie = c.hosts[0]
    async with c.fault(f"host {zombie.host_id} SIGSTOP until its runs ended elsewhere, SIGCONT"):
        zombie.sigstop()
        try:
            await c.finish(timeout=150)
        finally:
            zombie.sigcont()
    await eventually(lambda: "lost" in zombie.log_text(), 30)
    await c.check(runs)
    await no_pods_left(kube, c)


@pytest.mark.timeout(300)
async def test_drain_hands_the_runs_over(kube: StandinCluster, k8s_cluster: Factory) -> None:
    c = await k8s_cluster(hosts=2)
    runs = await c.start_runs(2, seconds=10)
    await c.wait_progress(runs, 15)
    drained, _ = await c.busiest_host(runs)
    async with c.fault(f"host {drained.host_id} SIGTERM (drain)"):
        assert drained.proc is not None
        drained.proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(drained.proc.wait, 60)
    await c.finish(runs)
    await c.check(runs)
    await no_pods_left(kube, c)


@pytest.mark.timeout(300)
async def test_a_restarted_daemon_is_read_on_from_where_it_was(kube: StandinCluster, k8s_cluster: Factory) -> None:
    """The sandbox daemon of each run killed mid-run: the pod's supervisor starts it again,
    the agent (in its own session) never noticed, and the host's follow resumes at the
    offset it had reached."""
    c = await k8s_cluster(hosts=2)
    runs = await c.start_runs(2, seconds=10)
    await c.wait_progress(runs, 15)
    async with c.fault("every sandbox daemon SIGKILL (restarted in its pod)"):
        for r in runs:
            pod = _pod_of(kube, r.run_id)["metadata"]["name"]
            assert kube.kubelet.kill("default", pod, match="python -m sandbox_host.daemon") == 1
    await c.finish(runs)
    await c.check(runs)
    await no_pods_left(kube, c)


@pytest.mark.timeout(300)
async def test_a_killed_sandbox_pod_fails_the_run_clearly(kube: StandinCluster, k8s_cluster: Factory) -> None:
    c = await k8s_cluster(hosts=2)
    (run,) = await c.start_runs(1, seconds=30)
    await c.wait_progress([run], 10)
    pod = _pod_of(kube, run.run_id)["metadata"]["name"]
    async with c.fault(f"sandbox pod {pod}: every process SIGKILL (the container died)"):
        assert kube.kubelet.kill("default", pod) >= 1
    await c.finish([run], timeout=120)
    view = await c.view(run.run_id)
    assert view.get("status") == "failed", view
    assert run.reader is not None
    errors = [ch for _, ch, _ in run.reader.got.items if ch.get("type") == "RUN_ERROR"]
    assert len(errors) == 1, errors
    assert errors[0].get("message"), errors[0]
    # The reader got every chunk exactly once, in order, up to the error.
    offs = run.reader.got.offsets
    assert len(offs) == len(set(offs)) and offs == sorted(offs, key=int)
    await no_pods_left(kube, c)
