"""The run record names its sandbox's provider (``RunRecord.sandbox_provider``): a host that
dies after creating a run's sandbox pod but before registering it leaves a successor no
registry entry, and the successor still builds on the run's provider (kubernetes), not its
own ``BATON_PROVIDER`` (local), or refuses the run with ``PROVIDER_UNREACHABLE`` when it
cannot reach that provider. The first host is held inside its pod's creation by the
stand-in's ``hang`` image (a daemon that never serves). Every baton process real, the
cluster the stand-in (tests/k8s/conftest.py)."""
from __future__ import annotations

import pytest

from baton.coordinator_client import CoordinatorClient
from baton_tools.testing.cluster import HostProcess
from baton_tools.testing.kube import StandinCluster
from sandbox_host.providers import _k8s_pod as kp
from tests.faults.harness import FaultCluster, FaultRun, eventually
from tests.k8s.conftest import HANG
from tests.k8s.test_k8s_faults import Factory, _host_env, k8s_cluster, no_pods_left  # noqa: F401 -- the fixture

pytestmark = [pytest.mark.servers]


async def _host_stuck_in_create(kube: StandinCluster, k8s_cluster: Factory) -> tuple[FaultCluster, list[FaultRun]]:
    """One kubernetes host whose sandbox pods never serve: its runs are started (input
    durable) and their pods exist, but none is registered, and their records say so."""
    c = await k8s_cluster(hosts=1, host_env={"BATON_K8S_IMAGE": HANG, "BATON_K8S_READY_TIMEOUT": "600"})
    runs = await c.start_runs(2, seconds=10)
    hashes = {kp.label_hash(r.run_id) for r in runs}

    def pods_made() -> bool:
        made = {p["metadata"]["labels"].get(kp.LABEL_RUN) for p in kube.pods()}
        assert hashes <= made, made
        return True
    await eventually(pods_made, 60)
    assert c.coordinator is not None
    async with CoordinatorClient(c.coordinator.address, token=c.env["BATON_INTERNAL_TOKEN"]) as cc:
        for r in runs:
            rec = (await cc.get_run(r.run_id)).record
            assert (rec.sandbox_provider, rec.sandbox_key) == ("kubernetes", ""), rec
    return c, runs


async def _kill(c: FaultCluster, victim: HostProcess, what: str) -> None:
    async with c.fault(f"host {victim.host_id} SIGKILL while creating its pods; {what}"):
        victim.kill_now()


@pytest.mark.timeout(300)
async def test_a_successor_set_to_local_builds_an_unregistered_runs_sandbox_on_its_provider(
        kube: StandinCluster, k8s_cluster: Factory) -> None:
    c, runs = await _host_stuck_in_create(kube, k8s_cluster)
    successor = await c.add_host(**{**_host_env(kube), "BATON_PROVIDER": "local"})
    await _kill(c, c.hosts[0], "the only successor is set to local")
    await c.finish(runs)
    await c.check(runs)
    assert "sandbox provider 'kubernetes' built" in successor.log_text()
    assert not any(c.sandbox_dir.glob("*/.baton")), "the successor built local sandboxes"
    await no_pods_left(kube, c)  # the first host's pods too (the run's leftovers, by label)


@pytest.mark.timeout(300)
async def test_a_successor_that_cannot_reach_the_records_provider_refuses_the_run(
        kube: StandinCluster, k8s_cluster: Factory) -> None:
    c, runs = await _host_stuck_in_create(kube, k8s_cluster)
    blind = await c.add_host(**{**_host_env(kube), "BATON_PROVIDER": "local",
                                "BATON_K8S_KUBECONFIG": str(c.tmp / "no-such-kubeconfig")})
    await _kill(c, c.hosts[0], "the only other host cannot reach kubernetes")
    await eventually(lambda: "cannot reach its sandbox provider 'kubernetes'" in blind.log_text(), 60)
    for r in runs:  # refused, not failed, and nothing built on the wrong provider
        assert (await c.view(r.run_id)).get("status") == "running"
    assert not any(c.sandbox_dir.glob("*/.baton")), "the refusing host built local sandboxes"
    await c.add_host(**_host_env(kube))
    await c.finish(runs)
    await c.check(runs)
    assert not any(c.sandbox_dir.glob("*/.baton")), "the refusing host built local sandboxes"
    await no_pods_left(kube, c)
