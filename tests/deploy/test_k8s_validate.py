"""Every Kubernetes object baton ships or makes validates, with ``kubernetes-validate``, against
the OpenAPI schemas of three Kubernetes versions (strict: unknown fields are errors): the files
of deploy/k8s, the kustomization rendered alone and with every component, and the sandbox pod
and Secret the kubernetes provider creates."""
from __future__ import annotations

import pathlib
import shutil
import subprocess
from typing import Any

import kubernetes_validate
import pytest
import yaml

from sandbox_host.providers import _k8s_pod as kp
from tests.conftest import require
from tests.deploy.conftest import K8S

#: Kubernetes versions checked: the kubernetes-validate release's oldest of the supported
#: window, a middle one and its newest.
VERSIONS = ("1.33.0", "1.35.0", "1.37.0")
#: Kinds of CRDs the schemas do not have (their own tests check them: test_k8s_hardening.py).
FOREIGN = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("kustomize.config.k8s.io/v1beta1", "Kustomization"),
           ("kustomize.config.k8s.io/v1alpha1", "Component")}


def _shipped() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):  # components/ hold patches: validated rendered
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc and (doc.get("apiVersion"), doc.get("kind")) not in FOREIGN:
                docs.append((str(path.relative_to(K8S)), doc))
    return docs


def _sandbox_pod() -> dict[str, Any]:
    settings = kp.PodSettings(image="registry.example.com/baton:1.2.3", cpu="1", memory="2Gi", disk="10Gi",
                              service_account="baton-sandbox")
    name = kp.pod_name("run-1#2", "abc123")
    return kp.pod_manifest(name, key="run-1#2", run_id="run-1", token="0123456789abcdef",
                           env={"BATON_RUN_ID": "run-1"}, settings=settings, secret=name, with_token=True,
                           with_tls=True)


def _sandbox_secret() -> dict[str, Any]:
    settings = kp.PodSettings(image="registry.example.com/baton:1.2.3")
    secret = kp.secret_manifest(kp.pod_name("run-1#2", "abc123"), key="run-1#2", run_id="run-1",
                                token="0123456789abcdef", settings=settings, daemon_token="0" * 64,
                                cert=b"-----BEGIN CERTIFICATE-----\n", cert_key=b"-----BEGIN PRIVATE KEY-----\n")
    secret["metadata"]["ownerReferences"] = [kp.owner_reference({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": secret["metadata"]["name"],
                                                        "uid": "6f1c1e9a-0000-4000-8000-000000000001"}})]
    return secret


@pytest.mark.parametrize("version", VERSIONS)
def test_every_shipped_manifest_validates(version: str) -> None:
    docs = _shipped()
    assert {d["kind"] for _, d in docs} >= {"Deployment", "Role", "RoleBinding", "ServiceAccount", "NetworkPolicy"}
    for name, doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name}: {doc['kind']} {doc['metadata'].get('name')} invalid for {version}: {exc.message} "
                        f"at {'.'.join(map(str, exc.path))}")


@pytest.mark.parametrize("version", VERSIONS)
def test_the_providers_sandbox_pod_and_secret_validate(version: str) -> None:
    kubernetes_validate.validate(_sandbox_pod(), version, strict=True)
    kubernetes_validate.validate(_sandbox_secret(), version, strict=True)


def test_the_check_refuses_a_misspelled_field() -> None:
    pod = _sandbox_pod()
    pod["spec"]["containers"][0]["imagePulPolicy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, VERSIONS[-1], strict=True)


def _render(target: pathlib.Path) -> list[dict[str, Any]]:
    exe = shutil.which("kubectl")
    require(exe is not None, "kubectl not installed (apt-get install kubernetes-client)")
    assert exe is not None
    out = subprocess.run([exe, "kustomize", str(target)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.mark.servers  # runs kubectl
@pytest.mark.parametrize("version", VERSIONS)
def test_the_rendered_kustomization_validates_alone_and_with_every_component(version: str, tmp_path: pathlib.Path) -> None:
    base = pathlib.Path(shutil.copytree(K8S, tmp_path / "k8s"))
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": ["k8s"],
        "components": [f"k8s/components/{c.name}" for c in sorted((base / "components").iterdir())]}))
    for rendered in (_render(K8S), _render(tmp_path)):
        assert any(d["kind"] == "RoleBinding" for d in rendered)
        for doc in rendered:
            if (doc["apiVersion"], doc["kind"]) not in FOREIGN:
                kubernetes_validate.validate(doc, version, strict=True)
