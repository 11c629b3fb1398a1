"""A takeover uses the provider the run's sandbox handle names, not the successor host's own
``BATON_PROVIDER``: a host set to ``local`` takes kubernetes runs over through the pods'
daemons, with a kubernetes provider built from its ``BATON_K8S_*`` settings; a host that
cannot build one (no kubeconfig) refuses the run, releasing its claim, and another host
takes it. Every baton process real, the cluster the stand-in (tests/k8s/conftest.py)."""
from __future__ import annotations

import pytest

from baton_tools.testing.kube import StandinCluster
from tests.faults.harness import eventually
from tests.k8s.test_k8s_faults import Factory, _host_env, k8s_cluster, no_pods_left  # noqa: F401 -- the fixture

pytestmark = [pytest.mark.servers]


@pytest.mark.timeout(300)
async def test_a_host_set_to_local_takes_kubernetes_runs_over_with_their_provider(
        kube: StandinCluster, k8s_cluster: Factory) -> None:
    c = await k8s_cluster(hosts=1)
    runs = await c.start_runs(2, seconds=10, detached=1)
    await c.wait_progress(runs, 15)
    successor = await c.add_host(**{**_host_env(kube), "BATON_PROVIDER": "local"})
    victim = c.hosts[0]
    async with c.fault(f"host {victim.host_id} SIGKILL; the only successor is set to local"):
        victim.kill_now()
    await c.finish(runs)
    await c.check(runs)
    assert "sandbox provider 'kubernetes' built" in successor.log_text()
    assert not any(c.sandbox_dir.glob("*/.baton")), "the successor built local sandboxes"
    await no_pods_left(kube, c)


@pytest.mark.timeout(300)
async def test_a_host_that_cannot_reach_the_provider_refuses_and_another_takes_the_run(
        kube: StandinCluster, k8s_cluster: Factory) -> None:
    c = await k8s_cluster(hosts=1)
    runs = await c.start_runs(2, seconds=10)
    await c.wait_progress(runs, 15)
    blind = await c.add_host(**{**_host_env(kube), "BATON_PROVIDER": "local",
                                "BATON_K8S_KUBECONFIG": str(c.tmp / "no-such-kubeconfig")})
    victim = c.hosts[0]
    async with c.fault(f"host {victim.host_id} SIGKILL; the only other host cannot reach kubernetes"):
        victim.kill_now()
        await eventually(lambda: "cannot reach its sandbox provider 'kubernetes'" in blind.log_text(), 60)
        for r in runs:  # refused, not failed
            assert (await c.view(r.run_id)).get("status") == "running"
        await c.add_host(**_host_env(kube))
    await c.finish(runs)
    await c.check(runs)
    assert not any(c.sandbox_dir.glob("*/.baton")), "the refusing host built local sandboxes"
    await no_pods_left(kube, c)
