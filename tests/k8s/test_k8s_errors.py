"""Bad input to the kubernetes provider gets a clear SandboxBuildFailed and leaves no pod
behind: a create refused (RBAC, quota), an image that cannot be pulled, a daemon that never
answers. On the stand-in cluster (tests/k8s/conftest.py)."""
from __future__ import annotations

import pytest

from baton.errors import SandboxBuildFailed
from baton_tools.testing.kube import StandinCluster
from sandbox_host.providers import SandboxSpec
from tests.conftest import assert_eventually
from tests.k8s.conftest import HANG, make_provider

pytestmark = [pytest.mark.servers, pytest.mark.timeout(120)]
SPEC = SandboxSpec(provider="kubernetes", env={"BATON_RUN_ID": "run-e"}, secrets={"API_KEY": "s3cret-value"})


@pytest.mark.parametrize("message, hint", [
    ('pods is forbidden: User "system:serviceaccount:baton:baton-sandbox-host" cannot create resource "pods"', "RBAC"),
    ('pods "x" is forbidden: exceeded quota: sandboxes, requested: pods=1, used: pods=10, limited: pods=10', "quota"),
])
async def test_a_refused_create_fails_clearly_and_leaves_nothing(kube: StandinCluster, message: str, hint: str) -> None:
    kube.refuse("create", "pods", 403, "Forbidden", message, times=1)
    async with make_provider(kube) as p:
        with pytest.raises(SandboxBuildFailed) as err:
            await p.create("run-e", SPEC)
    assert err.value.step == "pod"
    assert "403 Forbidden" in err.value.detail and message in err.value.detail and hint in err.value.detail
    assert "s3cret-value" not in str(err.value)
    assert kube.pods() == []


async def test_an_invalid_pod_is_refused_clearly(kube: StandinCluster) -> None:
    kube.refuse("create", "pods", 422, "Invalid", 'Pod "x" is invalid: spec.containers[0].resources', times=1)
    async with make_provider(kube) as p:
        with pytest.raises(SandboxBuildFailed, match="422 Invalid") as err:
            await p.create("run-e", SPEC)
    assert err.value.step == "pod" and kube.pods() == []


async def test_a_missing_image_fails_clearly_and_the_pod_is_deleted(kube: StandinCluster) -> None:
    async with make_provider(kube, image="registry.invalid/nope:1") as p:
        with pytest.raises(SandboxBuildFailed) as err:
            await p.create("run-e", SPEC)
    assert err.value.step == "image"
    assert "ErrImagePull" in err.value.detail and "registry.invalid/nope:1" in err.value.detail
    assert kube.pods() == []


async def test_a_daemon_that_never_answers_fails_after_the_ready_timeout(kube: StandinCluster) -> None:
    async with make_provider(kube, image=HANG, ready_timeout=3) as p:
        with pytest.raises(SandboxBuildFailed) as err:
            await p.create("run-e", SPEC)
    assert err.value.step == "daemon" and "did not answer within 3s" in err.value.detail
    assert kube.pods() == []
    await assert_eventually(lambda: not kube.kubelet.pods, timeout=30)


async def test_a_pod_that_never_runs_fails_after_the_ready_timeout(kube: StandinCluster) -> None:
    kube.kubelet.schedule = False  # no node takes it: Pending without an IP
    async with make_provider(kube, ready_timeout=2) as p:
        with pytest.raises(SandboxBuildFailed) as err:
            await p.create("run-e", SPEC)
    assert err.value.step == "pod" and "did not run within 2s" in err.value.detail
    assert kube.pods() == []
