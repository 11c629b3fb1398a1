"""The kubernetes provider's pure part: names, labels, the pod manifest, pod states."""
from __future__ import annotations

import re

from sandbox_host.providers import _k8s_pod as kp

SETTINGS = kp.PodSettings(image="baton:test", port=7300, cpu="500m", memory="1Gi", disk="2Gi",
                          service_account="baton-sandbox")


def test_pod_names_are_dns_labels_for_any_key() -> None:
    for key in ("run-1", "R#3", "a" * 200, "###", "Thread/Run_7#12"):
        name = kp.pod_name(key, "a1b2c3")
        assert len(name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), name
        assert name.endswith("-a1b2c3")


def test_labels_are_hashes_and_annotations_the_values() -> None:
    pod = kp.pod_manifest("baton-x-1", key="run#2", run_id="run", token="t", env={"BATON_RUN_ID": "run"},
                          settings=SETTINGS)
    meta = pod["metadata"]
    assert meta["labels"][kp.LABEL_RUN] == kp.label_hash("run") != kp.label_hash("run#2") == meta["labels"][kp.LABEL_KEY]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]{0,63}", v) for v in meta["labels"].values())
    assert meta["labels"][kp.LABEL_NAME] == kp.SANDBOX_APP
    assert meta["annotations"] == {kp.ANN_RUN: "run", kp.ANN_KEY: "run#2", kp.ANN_TOKEN: "t"}


def test_the_manifest_runs_the_daemon_with_resources_and_no_secret_inline() -> None:
    pod = kp.pod_manifest("p", key="k", run_id="r", token="t", env={"BATON_RUN_ID": "r"}, settings=SETTINGS,
                          secret="p", with_token=True)
    spec = pod["spec"]
    c = spec["containers"][0]
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
    assert spec["serviceAccountName"] == "baton-sandbox"
    assert "sandbox_host.daemon" in c["command"][2] and '"$POD_IP:7300"' in c["command"][2]
    assert c["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "500m", "memory": "1Gi"}}
    assert spec["volumes"] == [{"name": "sandbox", "emptyDir": {"sizeLimit": "2Gi"}}]
    token = next(e for e in c["env"] if e["name"] == "BATON_INTERNAL_TOKEN")
    assert token == {"name": "BATON_INTERNAL_TOKEN", "valueFrom": {"secretKeyRef": {"name": "p", "key": "token"}}}
    assert {"name": "BATON_RUN_ID", "value": "r"} in c["env"]
    assert not any(e["name"].startswith("BATON_TLS_") for e in c["env"])


def test_the_daemon_tls_comes_from_the_secret_as_mounted_files() -> None:
    pod = kp.pod_manifest("p", key="k", run_id="r", token="t", env={}, settings=SETTINGS, secret="p", with_tls=True)
    c = pod["spec"]["containers"][0]
    assert not any(e["name"] == "BATON_INTERNAL_TOKEN" for e in c["env"])
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["BATON_TLS_CERT"] == f"{kp.TLS_DIR}/tls.crt" and env["BATON_TLS_KEY"] == f"{kp.TLS_DIR}/tls.key"
    assert {"name": "daemon-tls", "mountPath": kp.TLS_DIR, "readOnly": True} in c["volumeMounts"]
    (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == "daemon-tls"]
    assert vol["secret"]["secretName"] == "p" and vol["secret"]["defaultMode"] == 0o440
    assert c["readinessProbe"] == {"tcpSocket": {"port": 7300}, "periodSeconds": 2}  # kubelet's gRPC probe has no TLS


def test_the_secret_holds_the_credentials_and_is_found_by_run() -> None:
    sec = kp.secret_manifest("p", key="run#2", run_id="run", token="t", settings=SETTINGS, daemon_token="tok",
                             cert=b"CERT", cert_key=b"KEY")
    assert sec["kind"] == "Secret" and sec["immutable"] is True
    assert sec["data"] == {"token": "dG9r", "tls.crt": "Q0VSVA==", "tls.key": "S0VZ"}
    assert sec["metadata"]["labels"] == kp.labels("run", "run#2")
    assert sec["metadata"]["annotations"] == {kp.ANN_RUN: "run", kp.ANN_KEY: "run#2", kp.ANN_TOKEN: "t"}
    assert kp.secret_manifest("p", key="k", run_id="r", token="t", settings=SETTINGS, daemon_token="x")["data"] == {
        "token": "eA=="}


def test_resources_from_the_spec_override_the_settings() -> None:
    pod = kp.pod_manifest("p", key="k", run_id="r", token="t", env={}, settings=SETTINGS,
                          resources={"cpu": "2", "memory": ""})
    assert pod["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}


def test_the_sandbox_resource_carries_the_pod_as_its_template() -> None:
    pod = kp.pod_manifest("p", key="k", run_id="r", token="t", env={}, settings=SETTINGS)
    sb = kp.sandbox_manifest(pod)
    assert sb["apiVersion"] == "agents.x-k8s.io/v1alpha1" and sb["kind"] == "Sandbox"
    assert sb["metadata"]["name"] == "p" and sb["spec"]["podTemplate"]["spec"] == pod["spec"]
    assert sb["spec"]["podTemplate"]["metadata"]["labels"] == pod["metadata"]["labels"]


def _pod(phase: str = "Pending", ip: str = "", waiting: tuple[str, str] | None = None,
         terminated: int | None = None, deleting: bool = False) -> dict[str, object]:
    state: dict[str, object] = {}
    if waiting:
        state = {"waiting": {"reason": waiting[0], "message": waiting[1]}}
    if terminated is not None:
        state = {"terminated": {"exitCode": terminated, "reason": "Error"}}
    return {"metadata": {"name": "p", **({"deletionTimestamp": "now"} if deleting else {})},
            "status": {"phase": phase, "podIP": ip, "containerStatuses": [{"state": state}] if state else []}}


def test_pod_states() -> None:
    assert kp.pod_state(None).kind == "gone"
    assert kp.pod_state(_pod("Running", "10.0.0.1", deleting=True)).kind == "gone"
    assert kp.pod_state(_pod()).kind == "waiting"
    assert kp.pod_state(_pod("Running", "10.0.0.1")) == kp.PodState("running", ip="10.0.0.1")
    pull = kp.pod_state(_pod(waiting=("ErrImagePull", 'image "x" not found')))
    assert pull.kind == "failed" and pull.reason.startswith("ErrImagePull") and '"x"' in pull.reason
    assert kp.pod_state(_pod(waiting=("ContainerCreating", ""))).kind == "waiting"
    ended = kp.pod_state(_pod("Failed", terminated=137))
    assert ended.kind == "failed" and "exit code 137" in ended.reason
    unsched = {"metadata": {}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes: Insufficient cpu"}]}}
    assert kp.pod_state(unsched) == kp.PodState("waiting", reason="Unschedulable: 0/3 nodes: Insufficient cpu")


def test_refusals_say_what_to_fix() -> None:
    rbac = kp.refusal_detail(403, "Forbidden", 'pods is forbidden: User "x" cannot create')
    assert "RBAC" in rbac and "quota" not in rbac
    quota = kp.refusal_detail(403, "Forbidden", "exceeded quota: q")
    assert "ResourceQuota" in quota and "RBAC" not in quota
    assert kp.refusal_detail(422, "Invalid", "bad").startswith("422 Invalid: bad")
