"""deploy/k8s: schema-valid manifests that agree with the code's config and entry points."""
from __future__ import annotations

import copy
import pathlib
import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.conftest import require
from tests.deploy.conftest import (
    K8S,
    console_scripts,
    default_port,
    host_of,
    load_yaml_docs,
    package_sources,
    port_of,
    resolve_console_script,
    setting_names,
)

MODELS: dict[tuple[str, str], type] = {
    ("v1", "Namespace"): client.V1Namespace,
    ("v1", "ConfigMap"): client.V1ConfigMap,
    ("v1", "Secret"): client.V1Secret,
    ("v1", "Service"): client.V1Service,
    ("apps/v1", "Deployment"): client.V1Deployment,
    ("policy/v1", "PodDisruptionBudget"): client.V1PodDisruptionBudget,
    ("networking.k8s.io/v1", "NetworkPolicy"): client.V1NetworkPolicy,
    ("autoscaling/v2", "HorizontalPodAutoscaler"): client.V2HorizontalPodAutoscaler,
    ("v1", "ServiceAccount"): client.V1ServiceAccount,
    ("rbac.authorization.k8s.io/v1", "Role"): client.V1Role,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): client.V1RoleBinding,
}
# Environment variables that are not baton settings but are meant to be there.
FOREIGN_ENV = {"POD_NAME", "POD_IP", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"}


def by_kind(docs: list[tuple[pathlib.Path, dict[str, Any]]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in docs if d["kind"] == kind}


def container(deploy: dict[str, Any]) -> dict[str, Any]:
    (c,) = deploy["spec"]["template"]["spec"]["containers"]
    return c


def effective_env(docs: list[tuple[pathlib.Path, dict[str, Any]]], c: dict[str, Any]) -> dict[str, str]:
    """The container's environment: envFrom ConfigMaps/Secrets, then env (later wins)."""
    cms, secrets = by_kind(docs, "ConfigMap"), by_kind(docs, "Secret")
    env: dict[str, str] = {}
    for src in c.get("envFrom", []):
        if "configMapRef" in src:
            env.update(cms[src["configMapRef"]["name"]]["data"])
        if "secretRef" in src:
            env.update(secrets[src["secretRef"]["name"]]["stringData"])
    for e in c.get("env", []):
        env[e["name"]] = e.get("value", "<from-field>")
    return env


def named_port(c: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in c["ports"] if p["name"] == port)


def test_every_manifest_is_listed_in_the_kustomization() -> None:
    (kust,) = load_yaml_docs(K8S / "kustomization.yaml")
    assert kust["kind"] == "Kustomization"
    listed = set(kust["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk


def test_every_manifest_validates_against_the_kubernetes_schema(k8s_docs: list[tuple[pathlib.Path, dict[str, Any]]]) -> None:
    assert k8s_docs, "no manifests found"
    for path, doc in k8s_docs:
        key = (doc["apiVersion"], doc["kind"])
        assert key in MODELS, f"{path.name}: unexpected {key}"
        # Pydantic models of the official client: unknown fields, wrong types and missing
        # required fields are all errors (extra="forbid").
        MODELS[key].model_validate(doc)


def test_the_schema_check_rejects_a_misspelled_field(k8s_docs: list[tuple[pathlib.Path, dict[str, Any]]]) -> None:
    deploy = dict(by_kind(k8s_docs, "Deployment")["baton-gateway"])
    bad = {**deploy, "spec": {**deploy["spec"], "replica": 2}}
    with pytest.raises(Exception, match="replica"):
        client.V1Deployment.model_validate(bad)


def test_the_issue_shape(k8s_docs: list[tuple[pathlib.Path, dict[str, Any]]]) -> None:
    deps = by_kind(k8s_docs, "Deployment")
    assert set(deps) == {"baton-coordinator", "baton-sandbox-host", "baton-gateway"}
    assert deps["baton-coordinator"]["spec"]["replicas"] == 2
    assert "baton-gateway" in by_kind(k8s_docs, "Service")
    pdbs = by_kind(k8s_docs, "PodDisruptionBudget")
    covered = {p["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] for p in pdbs.values()}
    assert covered == set(deps)


def test_selectors_match_their_pods(k8s_docs: list[tuple[pathlib.Path, dict[str, Any]]]) -> None:
    deps = by_kind(k8s_docs, "Deployment")
    pod_labels = [d["spec"]["template"]["metadata"]["labels"] for d in deps.values()]
    for d in deps.values():
        sel = d["spec"]["selector"]["matchLabels"]
        assert sel.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    for kind, path in (("Service", ("spec", "selector")), ("PodDisruptionBudget", ("spec", "selector", "matchLabels"))):
        for name, obj in by_kind(k8s_docs, kind).items():
            sel = obj
            for k in path:
                sel = sel[k]
            assert sum(sel.items() <= labels.items() for labels in pod_labels) == 1, f"{kind} {name}"


def test_env_names_are_baton_settings(k8s_docs: list[tuple[pathlib.Path, dict[str, Any]]]) -> None:
    known = setting_names() | FOREIGN_ENV
    names = set()
    for cm in by_kind(k8s_docs, "ConfigMap").values():
        names |= set(cm["data"])
    for s in by_kind(k8s_docs, "Secret").values():
        names |= set(s["stringData"])
    for d in by_kind(k8s_docs, "Deployment").values():
        names |= {e["name"] for e in container(d).get("env", [])}
    assert names - known == set()
    assert {n for n in names if n.startswith("BATON_")} <= setting_names()
    # Keys never sit in the ConfigMap.
    for cm in by_kind(k8s_docs, "ConfigMap").values():
        assert not any(re.search(r"KEY|SECRET|TOKEN", n) for n in cm["data"]), cm["data"]


@pytest.mark.parametrize(
    "deployment, listen, probe",
    [
        ("baton-coordinator", "BATON_COORDINATOR_LISTEN", "grpc"),
        ("baton-sandbox-host", "BATON_HOST_LISTEN", "grpc"),
        ("baton-gateway", "BATON_GATEWAY_LISTEN", "httpGet"),
    ],
)
def test_ports_and_probes_match_the_config(
    k8s_docs: list[tuple[pathlib.Path, dict[str, Any]]], deployment: str, listen: str, probe: str
) -> None:
    c = container(by_kind(k8s_docs, "Deployment")[deployment])
    env = effective_env(k8s_docs, c)
    port = port_of(env.get(listen, f"x:{default_port(listen)}"))
    assert [p["containerPort"] for p in c["ports"]][0] == port
    for which in ("readinessProbe", "livenessProbe"):
        assert named_port(c, c[which][probe]["port"]) == port, which
    for svc in by_kind(k8s_docs, "Service").values():
        if svc["spec"]["selector"]["app.kubernetes.io/name"] == deployment:
            assert named_port(c, svc["spec"]["ports"][0]["targetPort"]) == port


def test_gateway_probe_paths_are_routes_of_the_gateway(k8s_docs: list[tuple[pathlib.Path, dict[str, Any]]]) -> None:
    c = container(by_kind(k8s_docs, "Deployment")["baton-gateway"])
    src = package_sources("gateway")
    for which in ("readinessProbe", "livenessProbe"):
        path = c[which]["httpGet"]["path"]
        assert f'"{path}"' in src, f"gateway has no route {path}"


@pytest.mark.parametrize("package", ["coordinator", "sandbox_host"])
def test_grpc_probes_hit_a_registered_health_service(package: str) -> None:
    # Kubernetes gRPC probes call grpc.health.v1.Health/Check with service "".
    assert "add_HealthServicer_to_server" in package_sources(package)


def test_services_dial_each_other_by_service_name_and_port(k8s_docs: list[tuple[pathlib.Path, dict[str, Any]]]) -> None:
    svcs = by_kind(k8s_docs, "Service")
    host_c = container(by_kind(k8s_docs, "Deployment")["baton-sandbox-host"])
    env = effective_env(k8s_docs, host_c)
    coord = env["BATON_COORDINATOR"]
    assert host_of(coord) in svcs
    assert port_of(coord) == svcs[host_of(coord)]["spec"]["ports"][0]["port"]
    # Every replica through DNS, the calls balanced by the client (baton/internal_auth.py).
    assert coord.startswith("dns:///") and svcs[host_of(coord)]["spec"]["clusterIP"] == "None"
    # Hosts advertise their pod IP on their listen port.
    assert env["BATON_HOST_ADVERTISE"] == f"$(POD_IP):{port_of(env['BATON_HOST_LISTEN'])}"
    assert env["BATON_HOST_ID"] == "$(POD_NAME)"


def test_commands_are_console_scripts_of_the_package(k8s_docs: list[tuple[pathlib.Path, dict[str, Any]]]) -> None:
    scripts = console_scripts()
    for d in by_kind(k8s_docs, "Deployment").values():
        cmd = container(d)["command"][0]
        assert cmd in scripts, cmd
        assert resolve_console_script(cmd)


def test_sandbox_host_drains_before_it_is_killed(k8s_docs: list[tuple[pathlib.Path, dict[str, Any]]]) -> None:
    d = by_kind(k8s_docs, "Deployment")["baton-sandbox-host"]
    cmd = container(d)["lifecycle"]["preStop"]["exec"]["command"]
    assert cmd[:2] == ["baton", "drain"]
    drain_timeout = float(cmd[cmd.index("--timeout") + 1])
    assert d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > drain_timeout
    # The address drained is the host's own listen port.
    env = effective_env(k8s_docs, container(d))
    assert port_of(cmd[2]) == port_of(env["BATON_HOST_LISTEN"])
    # And `baton drain` really is a command of the CLI.
    from typer.main import get_command

    from baton_tools.cli import app

    assert "drain" in get_command(app).commands  # type: ignore[attr-defined]


def test_image_is_the_one_the_kustomization_pins(k8s_docs: list[tuple[pathlib.Path, dict[str, Any]]]) -> None:
    (kust,) = load_yaml_docs(K8S / "kustomization.yaml")
    (img,) = kust["images"]
    for d in by_kind(k8s_docs, "Deployment").values():
        assert container(d)["image"].split(":")[0] == img["name"]


# --- the rendered kustomization --------------------------------------------------------


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    """``kubectl kustomize deploy/k8s``: the objects ``kubectl apply -k`` would send."""
    exe = shutil.which("kubectl")
    require(exe is not None, "kubectl not installed (apt-get install kubernetes-client)")
    assert exe is not None
    out = subprocess.run([exe, "kustomize", str(K8S)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d is not None]


def test_kustomize_renders_every_manifest(
    rendered: list[dict[str, Any]], k8s_docs: list[tuple[pathlib.Path, dict[str, Any]]]
) -> None:
    names = sorted((d["kind"], d["metadata"]["name"]) for d in rendered)
    assert names == sorted((d["kind"], d["metadata"]["name"]) for _, d in k8s_docs)
    (kust,) = load_yaml_docs(K8S / "kustomization.yaml")
    (img,) = kust["images"]
    for d in rendered:
        assert d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "baton", d["metadata"]["name"]
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == kust["namespace"], d["metadata"]["name"]
        if d["kind"] == "Deployment":
            assert container(d)["image"] == f"{img['newName']}:{img['newTag']}"


def test_every_rendered_object_is_a_strict_kubernetes_model(rendered: list[dict[str, Any]]) -> None:
    for d in rendered:
        key = (d["apiVersion"], d["kind"])
        assert key in MODELS, f"unexpected {key}"
        # The client's pydantic models refuse unknown fields (extra="forbid"), wrong types and
        # missing required fields; dumped back they equal the input, so nothing was coerced
        # or dropped on the way.
        model = MODELS[key].model_validate(d)
        assert model.model_dump(by_alias=True, exclude_none=True, mode="json") == d, d["metadata"]["name"]


def test_the_strict_models_refuse_an_unknown_nested_field(rendered: list[dict[str, Any]]) -> None:
    deploy = copy.deepcopy(next(d for d in rendered if d["kind"] == "Deployment"))
    deploy["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["periodSecond"] = 5
    with pytest.raises(Exception, match="periodSecond"):
        client.V1Deployment.model_validate(deploy)
