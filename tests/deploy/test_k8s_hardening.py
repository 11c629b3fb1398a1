"""deploy/k8s for production: each credential only where it is used (and the shipped
placeholders refused), replicas spread over nodes and zones, NetworkPolicies that admit what
the services dial, metrics discoverable, and the optional components (ServiceMonitor, HPA)
rendering into valid objects."""
from __future__ import annotations

import pathlib
import shutil
import subprocess
from typing import Any, Literal

import pydantic
import pytest
import yaml
from kubernetes import client

from baton.credentials import AGENT_SECRET_NAMES, placeholders
from tests.conftest import require
from tests.deploy.conftest import K8S, default_port, host_of, port_of
from tests.deploy.test_k8s import MODELS, by_kind, container, effective_env, named_port

DEPLOYMENTS = ("baton-coordinator", "baton-sandbox-host", "baton-gateway")
#: The setting of each tier's Prometheus listener (baton/config.py: 9101, 9102, 9103).
METRICS_LISTEN = {"baton-coordinator": "BATON_COORDINATOR_METRICS_LISTEN",
                  "baton-sandbox-host": "BATON_HOST_METRICS_LISTEN",
                  "baton-gateway": "BATON_GATEWAY_METRICS_LISTEN"}
Docs = list[tuple[pathlib.Path, dict[str, Any]]]


def secrets_of(deploy: dict[str, Any]) -> set[str]:
    return {s["secretRef"]["name"] for s in container(deploy).get("envFrom", []) if "secretRef" in s}


def test_each_credential_reaches_only_the_pods_that_use_it(k8s_docs: Docs) -> None:
    deps, secrets = by_kind(k8s_docs, "Deployment"), by_kind(k8s_docs, "Secret")
    holders = {name: set(s["stringData"]) for name, s in secrets.items()}
    mounted = {name: set().union(*(holders[s] for s in secrets_of(d))) for name, d in deps.items()}
    assert mounted["baton-coordinator"] == {"BATON_INTERNAL_TOKEN"}
    assert mounted["baton-gateway"] == {"BATON_INTERNAL_TOKEN", "BATON_API_KEYS"}
    assert mounted["baton-sandbox-host"] - {"BATON_INTERNAL_TOKEN"} <= AGENT_SECRET_NAMES
    assert mounted["baton-sandbox-host"] & AGENT_SECRET_NAMES
    # No pod gets a credential in its ConfigMap or plain env.
    for d in deps.values():
        assert not {e["name"] for e in container(d).get("env", [])} & (AGENT_SECRET_NAMES | {"BATON_API_KEYS"})


def test_the_shipped_secrets_are_placeholders_the_services_refuse(k8s_docs: Docs) -> None:
    # Applied unedited, the pods refuse to start naming the variable (baton/credentials.py)
    # instead of running with a key everybody knows.
    secrets = by_kind(k8s_docs, "Secret")
    assert placeholders(secrets["baton-internal"]["stringData"]) == ["BATON_INTERNAL_TOKEN"]
    assert placeholders(secrets["baton-api-keys"]["stringData"]) == ["BATON_API_KEYS (the key of entry #1)"]


@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_replicas_spread_over_nodes_and_zones(k8s_docs: Docs, name: str) -> None:
    spec = by_kind(k8s_docs, "Deployment")[name]["spec"]["template"]["spec"]
    own = {"app.kubernetes.io/name": name}
    (anti,) = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert anti["podAffinityTerm"]["labelSelector"]["matchLabels"] == own
    spread = {c["topologyKey"]: c for c in spec["topologySpreadConstraints"]}
    assert set(spread) == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
    for c in spread.values():
        assert c["labelSelector"]["matchLabels"] == own
        # Preferred, not required: a one-zone or one-node cluster still schedules every pod.
        assert c["whenUnsatisfiable"] == "ScheduleAnyway"


@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_metrics_port_and_scrape_annotations_agree(k8s_docs: Docs, name: str) -> None:
    d = by_kind(k8s_docs, "Deployment")[name]
    c = container(d)
    # The port named `metrics` is the one the service's listener binds, on every interface
    # of the pod (a scrape comes from another pod).
    setting = METRICS_LISTEN[name]
    listen = effective_env(k8s_docs, c).get(setting, f"0.0.0.0:{default_port(setting)}")
    assert host_of(listen) == "0.0.0.0", listen
    port = port_of(listen)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["metrics"] == port
    assert port == default_port(setting)  # what a service run without the ConfigMap binds too
    ann = d["spec"]["template"]["metadata"]["annotations"]
    assert ann == {"prometheus.io/scrape": "true", "prometheus.io/port": str(port),
                   "prometheus.io/path": "/metrics"}
    # Exactly one Service per tier exposes it (a second would scrape every pod twice), by the
    # name the ServiceMonitor scrapes.
    exposing = [p for s in by_kind(k8s_docs, "Service").values()
                if s["spec"]["selector"] == {"app.kubernetes.io/name": name}
                for p in s["spec"]["ports"] if p["name"] == "metrics"]
    assert len(exposing) == 1, name
    assert named_port(c, exposing[0]["targetPort"]) == port
    assert exposing[0]["port"] == port


def test_hosts_and_coordinators_have_headless_services(k8s_docs: Docs) -> None:
    svcs = by_kind(k8s_docs, "Service")
    for name in ("baton-coordinator-headless", "baton-sandbox-host"):
        assert svcs[name]["spec"]["clusterIP"] == "None"
        assert svcs[name]["spec"]["ports"][0]["appProtocol"] == "grpc"


def _admits(policy: dict[str, Any], port: str | int, peer_labels: dict[str, str] | None) -> bool:
    """Whether ``policy`` admits traffic to the named ``port`` from a pod with ``peer_labels``
    in the same namespace (``None``: a client outside the cluster's pods)."""
    for rule in policy["spec"].get("ingress", []):
        if "ports" in rule and port not in {p["port"] for p in rule["ports"]}:
            continue
        if "from" not in rule:
            return True
        for peer in rule["from"]:
            if peer_labels is not None and peer.get("namespaceSelector") == {}:
                return True
            sel = peer.get("podSelector", {}).get("matchLabels")
            if peer_labels is not None and "namespaceSelector" not in peer and sel is not None \
                    and sel.items() <= peer_labels.items():
                return True
    return False


def test_network_policies_admit_what_the_services_dial_and_nothing_else(k8s_docs: Docs) -> None:
    policies = {p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"]: p
                for p in by_kind(k8s_docs, "NetworkPolicy").values()}
    assert set(policies) == {*DEPLOYMENTS, "baton-sandbox"}
    # Sandbox pods run agents' code: only hosts reach their daemon, and they are not
    # "baton's pods" to the other policies (the provider's labels, sandbox_host/providers/_k8s_pod.py).
    from sandbox_host.providers import _k8s_pod as kp

    sandbox_pod = kp.labels("run", "key")
    host_pod = {"app.kubernetes.io/part-of": "baton", "app.kubernetes.io/name": "baton-sandbox-host"}
    sb = policies.pop("baton-sandbox")
    assert sb["spec"]["policyTypes"] == ["Ingress"]
    assert _admits(sb, 7300, host_pod)
    for who in ({"app.kubernetes.io/part-of": "baton", "app.kubernetes.io/name": "baton-gateway"},
                sandbox_pod, {"app": "something-else"}, None):
        assert not _admits(sb, 7300, who), who
    for name in ("baton-coordinator", "baton-sandbox-host"):
        assert not _admits(policies[name], "grpc", sandbox_pod), name
    baton_pod = {"app.kubernetes.io/part-of": "baton", "app.kubernetes.io/name": "baton-gateway"}
    stranger = {"app": "something-else"}
    for name in ("baton-coordinator", "baton-sandbox-host"):
        assert policies[name]["spec"]["policyTypes"] == ["Ingress"]
        assert _admits(policies[name], "grpc", baton_pod), name
        assert not _admits(policies[name], "grpc", stranger), name
        assert not _admits(policies[name], "grpc", None), name
    gw = policies["baton-gateway"]
    for port in ("http", "grpc"):
        assert _admits(gw, port, None)  # the public edge
    # Every tier's metrics port: a Prometheus in any namespace scrapes it.
    for name, policy in policies.items():
        assert _admits(policy, "metrics", stranger), name
    # Every port a policy names is a port of its pods.
    deps = by_kind(k8s_docs, "Deployment")
    for name, policy in policies.items():
        named = {p["name"] for p in container(deps[name])["ports"]}
        for rule in policy["spec"]["ingress"]:
            assert {p["port"] for p in rule["ports"]} <= named, name


# --- the optional components -------------------------------------------------------------


class _Endpoint(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    port: str
    path: str = "/metrics"
    interval: str | None = None
    scrapeTimeout: str | None = None


class _Selector(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    matchLabels: dict[str, str]


class _ServiceMonitorSpec(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    selector: _Selector
    endpoints: list[_Endpoint]


class _ServiceMonitor(pydantic.BaseModel):
    """The fields of monitoring.coreos.com/v1 ServiceMonitor this file uses (the Prometheus
    Operator's CRD, not in the Kubernetes client's models); anything else is refused."""
    model_config = pydantic.ConfigDict(extra="forbid")
    apiVersion: Literal["monitoring.coreos.com/v1"]
    kind: Literal["ServiceMonitor"]
    metadata: client.V1ObjectMeta
    spec: _ServiceMonitorSpec


@pytest.fixture(scope="module")
def with_components(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """An overlay of the base with every component, as a user writes it, rendered."""
    exe = shutil.which("kubectl")
    require(exe is not None, "kubectl not installed (apt-get install kubernetes-client)")
    assert exe is not None
    overlay = tmp_path_factory.mktemp("overlay")
    base = pathlib.Path(shutil.copytree(K8S, overlay / "k8s"))
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["k8s"], "components": ["k8s/components/monitoring", "k8s/components/autoscaling",
                                                "k8s/components/tls", "k8s/components/sandbox-tls"],
        "images": [{"name": "baton", "newName": "registry.example.com/team/baton", "newTag": "1.2.3"}]}))
    out = subprocess.run([exe, "kustomize", str(overlay)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert base.is_dir()
    return [d for d in yaml.safe_load_all(out.stdout) if d is not None]


def test_the_components_render_into_valid_objects(with_components: list[dict[str, Any]]) -> None:
    kinds = {(d["kind"], d["metadata"]["name"]): d for d in with_components}
    hpa, sm = kinds[("HorizontalPodAutoscaler", "baton-gateway")], kinds[("ServiceMonitor", "baton")]
    for d in with_components:
        if d["kind"] == "ServiceMonitor":
            _ServiceMonitor.model_validate(d)
        else:
            model = MODELS[(d["apiVersion"], d["kind"])].model_validate(d)
            assert model.model_dump(by_alias=True, exclude_none=True, mode="json") == d, d["metadata"]["name"]
        assert d["metadata"].get("namespace", "baton") == "baton"
    # The HPA scales the gateway Deployment, from at least the replicas the PDB keeps + 1.
    target = hpa["spec"]["scaleTargetRef"]
    assert ("Deployment", target["name"]) in kinds and target["name"] == "baton-gateway"
    pdb = kinds[("PodDisruptionBudget", "baton-gateway")]
    assert hpa["spec"]["minReplicas"] >= pdb["spec"]["minAvailable"] + 1
    # The ServiceMonitor selects one Service per tier, each with the port it scrapes.
    selected = [d for d in with_components if d["kind"] == "Service"
                and sm["spec"]["selector"]["matchLabels"].items() <= d["metadata"]["labels"].items()
                and any(p["name"] == sm["spec"]["endpoints"][0]["port"] for p in d["spec"]["ports"])]
    assert sorted(s["spec"]["selector"]["app.kubernetes.io/name"] for s in selected) == sorted(DEPLOYMENTS)
    # The overlay's image reaches every Deployment (the manifests name `baton` only).
    for d in with_components:
        if d["kind"] == "Deployment":
            assert container(d)["image"] == "registry.example.com/team/baton:1.2.3"


def test_the_tls_component_gives_every_pod_its_certificate(with_components: list[dict[str, Any]]) -> None:
    """Mutual TLS between the pods: the Secret's files mounted where the settings point, and
    the gRPC probes (kubelet's cannot speak TLS) replaced by `baton health grpc`."""
    from baton import config

    for d in with_components:
        if d["kind"] != "Deployment":
            continue
        c, spec = container(d), d["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert {n for n in env if n.startswith("BATON_TLS_")} <= {s.env for s in config.SETTINGS}
        assert env["BATON_TLS_CLIENT_AUTH"] == "1" and env["BATON_TLS_SERVER_NAME"] == "baton-internal"
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == "baton-tls"]
        (volume,) = [v for v in spec["volumes"] if v["name"] == "baton-tls"]
        assert volume["secret"]["secretName"] == "baton-tls" and mount["readOnly"]
        for var, key in (("BATON_TLS_CERT", "tls.crt"), ("BATON_TLS_KEY", "tls.key"), ("BATON_TLS_CA", "ca.crt")):
            assert env[var] == f"{mount['mountPath']}/{key}"
        probes = [c["readinessProbe"], c["livenessProbe"]]
        if d["metadata"]["name"] == "baton-gateway":
            assert all("httpGet" in p for p in probes)  # its public ports are not the internal TLS
            continue
        port = named_port(c, "grpc")
        for probe in probes:
            assert "grpc" not in probe and probe["exec"]["command"] == ["baton", "health", "grpc", f"127.0.0.1:{port}"]


def test_the_sandbox_tls_component_gives_the_hosts_the_sandbox_ca(with_components: list[dict[str, Any]]) -> None:
    """TLS to the sandbox daemons: the CA's Secret mounted on the hosts alone, where the
    settings point; no other Deployment sees the CA's key."""
    for d in with_components:
        if d["kind"] != "Deployment":
            continue
        c, spec = container(d), d["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        if d["metadata"]["name"] != "baton-sandbox-host":
            assert "BATON_SANDBOX_CA_KEY" not in env
            assert all(v.get("secret", {}).get("secretName") != "baton-sandbox-ca" for v in spec["volumes"])
            continue
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == "baton-sandbox-ca"]
        (volume,) = [v for v in spec["volumes"] if v["name"] == "baton-sandbox-ca"]
        assert volume["secret"]["secretName"] == "baton-sandbox-ca" and mount["readOnly"]
        assert env["BATON_SANDBOX_CA_CERT"] == f"{mount['mountPath']}/tls.crt"
        assert env["BATON_SANDBOX_CA_KEY"] == f"{mount['mountPath']}/tls.key"


def named_port(c: dict[str, Any], name: str) -> int:
    return int(next(p["containerPort"] for p in c["ports"] if p["name"] == name))


def test_the_servicemonitor_model_refuses_a_misspelled_field() -> None:
    with pytest.raises(pydantic.ValidationError, match="endpoint"):
        _ServiceMonitor.model_validate({"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
                                        "metadata": {"name": "x"},
                                        "spec": {"selector": {"matchLabels": {}}, "endpoint": []}})
