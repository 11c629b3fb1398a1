"""Fixtures of the kubernetes provider's tests: the stand-in cluster (API server and kubelet,
:mod:`baton_tools.testing.kube`: nothing here runs against a real cluster) and providers on it."""
from __future__ import annotations

import pathlib
from typing import Any, AsyncIterator

import pytest
import pytest_asyncio
import yaml
from lightkube import AsyncClient, KubeConfig

from baton_tools.testing.kube import StandinCluster
from sandbox_host.providers import _k8s_pod as kp
from sandbox_host.providers.kubernetes import KubernetesProvider

pytestmark = pytest.mark.servers

#: The sandbox image: runs the pod's command (the daemon). HANG: a daemon that never serves.
IMAGE = "baton:standin"
HANG = "baton:hang"
TOKEN = "k8s-test-internal-token"


def shipped_role() -> dict[str, set[str]]:
    """deploy/k8s/rbac.yaml's Role of the hosts as the stand-in's :attr:`Store.allowed`: every
    test runs with the verbs the shipped Role grants, and no more."""
    path = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "rbac.yaml"
    (role,) = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "Role"]
    allowed: dict[str, set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                allowed.setdefault(f"{res}.{group}" if group else res, set()).update(rule["verbs"])
    return allowed


@pytest_asyncio.fixture
async def kube(tmp_path: pathlib.Path) -> AsyncIterator[StandinCluster]:
    async with StandinCluster(tmp_path / "kube", {IMAGE: "run", HANG: "hang"}) as c:
        c.store.allowed = shipped_role()
        await c.put_secret("default", "baton-internal", {"BATON_INTERNAL_TOKEN": TOKEN})
        yield c


@pytest_asyncio.fixture
async def kube_crd(tmp_path: pathlib.Path) -> AsyncIterator[StandinCluster]:
    """The stand-in with the agent-sandbox CRD installed (its controller makes the pods)."""
    async with StandinCluster(tmp_path / "kube", {IMAGE: "run", HANG: "hang"}, agent_sandbox=True) as c:
        c.store.allowed = shipped_role()
        await c.put_secret("default", "baton-internal", {"BATON_INTERNAL_TOKEN": TOKEN})
        yield c


def settings(image: str = IMAGE, **kw: Any) -> kp.PodSettings:
    return kp.PodSettings(image=image, grace=5, **kw)


def make_provider(c: StandinCluster, image: str = IMAGE, ready_timeout: float = 60.0,
                  **kw: Any) -> KubernetesProvider:
    client = AsyncClient(KubeConfig.from_file(str(c.kubeconfig)), trust_env=False)
    p = KubernetesProvider(client, namespace="default", settings=settings(image), ready_timeout=ready_timeout, **kw)
    p._owns_client = True  # the test's provider closes the client it was given
    return p
