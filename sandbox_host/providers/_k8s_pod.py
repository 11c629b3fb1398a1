"""The ``kubernetes`` provider's pure part: the sandbox pod's manifest, its names and labels,
and what a pod's status means for a sandbox that is starting (docs/design.md §5.1).

No I/O here: :mod:`sandbox_host.providers.kubernetes` sends these manifests and feeds the
pods it watches to :func:`pod_state`.
"""
from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

#: The sandbox's root inside the pod (an ``emptyDir``): the daemon's root and working
#: directory. Handle paths are relative to it, so the same handle works whatever the root is.
ROOT = "/sandbox"
CONTAINER = "sandbox"
#: Labels: every sandbox pod carries these; ``LABEL_RUN`` and ``LABEL_KEY`` are hashes of the
#: run id and sandbox key (label values are short and restricted), the annotations the values.
LABEL_NAME = "app.kubernetes.io/name"
SANDBOX_APP = "baton-sandbox"
#: Not ``app.kubernetes.io/part-of: baton``: deploy/k8s's NetworkPolicies admit baton's own
#: pods by that label to the coordinator and hosts, and a sandbox runs an agent's code.
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_RUN = "baton/run"
LABEL_KEY = "baton/sandbox"
ANN_RUN = "baton/run-id"
ANN_KEY = "baton/sandbox-key"
ANN_TOKEN = "baton/create-token"
#: The sandbox Secret's keys: the daemon's token, its TLS certificate (chain) and key; and
#: where the pod mounts the latter two.
SECRET_TOKEN, SECRET_CERT, SECRET_KEY = "token", "tls.crt", "tls.key"
TLS_DIR = "/var/run/baton-sandbox-tls"
#: agent-sandbox's API (kubernetes-sigs/agent-sandbox): group, version, plural.
AGENT_SANDBOX = ("agents.x-k8s.io", "v1alpha1", "sandboxes")
#: Container waiting reasons after which the pod will not start by itself.
FATAL_WAITING = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                           "CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
# Runs the daemon and starts it again should it end (a crash, a kill): the agent it launched
# lives on in its own session, and the journal on the emptyDir with it. SIGTERM (the pod's
# deletion) ends the loop at once instead of after the grace period (sh as PID 1 ignores it).
_SUPERVISOR = (
    "trap 'kill \"$d\" 2>/dev/null; exit 0' TERM INT; "
    "while :; do {daemon} & d=$!; wait \"$d\"; sleep 1; done"
)


@dataclass(frozen=True)
class PodSettings:
    """What every sandbox pod of a host gets (``BATON_K8S_*``, docs/operating.md).

    Attributes:
        image: the sandbox image (runs the daemon: baton installed, ``python`` on ``PATH``).
        port: the daemon's gRPC port on the pod's IP.
        cpu: CPU request and limit (``""`` = none), e.g. ``"500m"``.
        memory: memory request and limit (``""`` = none), e.g. ``"1Gi"``.
        disk: the sandbox ``emptyDir``'s size limit (``""`` = none), e.g. ``"4Gi"``.
        service_account: the pods' ServiceAccount (``""`` = the namespace's default; no API
            token is mounted either way).
        grace: ``terminationGracePeriodSeconds``.
    """

    image: str
    port: int = 7300
    cpu: str = ""
    memory: str = ""
    disk: str = ""
    service_account: str = ""
    grace: int = 5
    extra_labels: Mapping[str, str] = field(default_factory=dict)


def label_hash(value: str) -> str:
    """A label value standing for ``value`` (any string): 40 hex digits of its SHA-256."""
    return hashlib.sha256(value.encode()).hexdigest()[:40]


def pod_name(key: str, suffix: str) -> str:
    """A DNS-1123 pod name for sandbox ``key``: ``baton-<slug>-<suffix>``, at most 63 chars.

    Args:
        key: the sandbox key (a run id, or ``<run id>#<epoch>``: any characters).
        suffix: a short random ``[a-z0-9]`` tail that keeps two creates of one key apart.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")[: 63 - len("baton--") - len(suffix)].strip("-")
    return f"baton-{slug}-{suffix}" if slug else f"baton-{suffix}"


def labels(run_id: str, key: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {**(extra or {}), LABEL_NAME: SANDBOX_APP, LABEL_MANAGED_BY: "baton",
            LABEL_RUN: label_hash(run_id), LABEL_KEY: label_hash(key)}


def daemon_command(port: int) -> list[str]:
    """The container's command: the daemon on ``$(POD_IP):port``, restarted should it end."""
    daemon = f'python -m sandbox_host.daemon --listen "$POD_IP:{port}" --root "$SANDBOX_ROOT"'
    return ["sh", "-c", _SUPERVISOR.format(daemon=daemon), "baton-sandbox"]


def pod_manifest(name: str, *, key: str, run_id: str, token: str, env: Mapping[str, str],
                 settings: PodSettings, resources: Mapping[str, str] | None = None,
                 secret: str = "", with_token: bool = False, with_tls: bool = False) -> dict[str, Any]:
    """The sandbox pod (a plain ``dict`` of the v1 Pod API).

    Args:
        name: the pod's name (:func:`pod_name`).
        key: the sandbox key; run_id: its run (labels and annotations).
        token: the create's token (an annotation: finds this very pod again).
        env: the plain environment (never secrets: a pod's spec is readable by whoever may
            read pods; secrets reach the agent through the daemon's launch only).
        settings: what every pod gets.
        resources: ``cpu``, ``memory``, ``disk`` (the spec's), over the settings' where set.
        secret: the sandbox's Secret (:func:`secret_manifest`), ``""`` = none. The pod
            names it, never its values: whoever may read pods sees no credential.
        with_token: the daemon's ``BATON_INTERNAL_TOKEN`` comes from the Secret's ``token``
            (``secretKeyRef``).
        with_tls: the daemon serves TLS with the Secret's ``tls.crt``/``tls.key``, mounted
            read-only at :data:`TLS_DIR`.
    """
    container_env: list[dict[str, Any]] = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "SANDBOX_ROOT", "value": ROOT},
        *({"name": k, "value": v} for k, v in sorted(env.items())),
    ]
    if secret and with_token:
        container_env.append({"name": "BATON_INTERNAL_TOKEN",
                              "valueFrom": {"secretKeyRef": {"name": secret, "key": SECRET_TOKEN}}})
    mounts: list[dict[str, Any]] = [{"name": "sandbox", "mountPath": ROOT}]
    volumes: list[dict[str, Any]] = []
    if secret and with_tls:
        container_env += [{"name": "BATON_TLS_CERT", "value": f"{TLS_DIR}/{SECRET_CERT}"},
                          {"name": "BATON_TLS_KEY", "value": f"{TLS_DIR}/{SECRET_KEY}"}]
        mounts.append({"name": "daemon-tls", "mountPath": TLS_DIR, "readOnly": True})
        volumes.append({"name": "daemon-tls", "secret": {
            "secretName": secret, "defaultMode": 0o440,
            "items": [{"key": SECRET_CERT, "path": SECRET_CERT}, {"key": SECRET_KEY, "path": SECRET_KEY}]}})
    wanted = {"cpu": settings.cpu, "memory": settings.memory, "disk": settings.disk,
              **{k: v for k, v in (resources or {}).items() if v}}
    limits: dict[str, dict[str, str]] = {}
    for res in ("cpu", "memory"):
        if wanted[res]:
            limits.setdefault("requests", {})[res] = wanted[res]
            limits.setdefault("limits", {})[res] = wanted[res]
    empty_dir: dict[str, str] = {"sizeLimit": wanted["disk"]} if wanted["disk"] else {}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": settings.grace,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": CONTAINER,
            "image": settings.image,
            "imagePullPolicy": "IfNotPresent",
            "command": daemon_command(settings.port),
            "workingDir": ROOT,
            "env": container_env,
            "ports": [{"name": "daemon", "containerPort": settings.port, "protocol": "TCP"}],
            # kubelet's gRPC probe cannot speak TLS: a daemon serving it is probed by a connect.
            "readinessProbe": {**({"tcpSocket": {"port": settings.port}} if secret and with_tls
                                  else {"grpc": {"port": settings.port}}), "periodSeconds": 2},
            "resources": limits,
            "volumeMounts": mounts,
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        }],
        "volumes": [{"name": "sandbox", "emptyDir": empty_dir}, *volumes],
    }
    if settings.service_account:
        spec["serviceAccountName"] = settings.service_account
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels(run_id, key, settings.extra_labels),
                     "annotations": {ANN_RUN: run_id, ANN_KEY: key, ANN_TOKEN: token}},
        "spec": spec,
    }


def secret_manifest(name: str, *, key: str, run_id: str, token: str, settings: PodSettings,
                    daemon_token: str = "", cert: bytes = b"", cert_key: bytes = b"") -> dict[str, Any]:
    """The sandbox's Secret: what its daemon needs and its pod must not show (a ``dict`` of
    the v1 Secret API), labelled and annotated as the pod (the reaper finds it by run).

    Args:
        name: the Secret's name (the pod's: one Secret per pod).
        key, run_id, token: as :func:`pod_manifest`'s.
        daemon_token: the daemon's token (:func:`sandbox_host.daemon.sandbox_token`: this
            sandbox's own, never the cluster's), under ``token``; ``""`` = none.
        cert, cert_key: the daemon's TLS certificate (chain) and key (PEM), under ``tls.crt``
            and ``tls.key``; empty = none.
    """
    data = {k: base64.b64encode(v).decode() for k, v in
            ((SECRET_TOKEN, daemon_token.encode()), (SECRET_CERT, cert), (SECRET_KEY, cert_key)) if v}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "immutable": True,
            "metadata": {"name": name, "labels": labels(run_id, key, settings.extra_labels),
                         "annotations": {ANN_RUN: run_id, ANN_KEY: key, ANN_TOKEN: token}},
            "data": data}


def owner_reference(obj: Mapping[str, Any]) -> dict[str, Any]:
    """An ``ownerReferences`` entry naming ``obj`` (the API's JSON of a created object): the
    garbage collector deletes the owned object once its owner is gone."""
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"]}


def sandbox_manifest(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The agent-sandbox ``Sandbox`` whose controller makes ``pod`` (same name, labels,
    annotations), without a Service (hosts dial the pod's IP)."""
    meta = pod["metadata"]
    group, version, _ = AGENT_SANDBOX
    return {
        "apiVersion": f"{group}/{version}",
        "kind": "Sandbox",
        "metadata": {"name": meta["name"], "labels": dict(meta["labels"]), "annotations": dict(meta["annotations"]),
                     **({"namespace": meta["namespace"]} if meta.get("namespace") else {})},
        "spec": {"podTemplate": {"metadata": {"labels": dict(meta["labels"]),
                                              "annotations": dict(meta["annotations"])},
                                 "spec": pod["spec"]},
                 "replicas": 1,
                 "service": False},
    }


# --- a starting pod's status ---------------------------------------------------------------


@dataclass(frozen=True)
class PodState:
    """What a pod's status says for a sandbox that is starting.

    Attributes:
        kind: ``"running"`` (has an IP; the daemon may or may not serve yet),
            ``"waiting"`` (not yet: scheduling, pulling, creating), ``"failed"`` (will not
            start by itself: a fatal waiting reason, or the pod ended) or ``"gone"``
            (deleted or being deleted).
        ip: the pod's IP when running.
        reason: why, for an error message (``"ErrImagePull: …"``, ``"Unschedulable: …"``).
    """

    kind: str
    ip: str = ""
    reason: str = ""


def pod_state(pod: Mapping[str, Any] | None) -> PodState:
    """Read a pod (the API's JSON, ``None`` when it does not exist) as a :class:`PodState`."""
    if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return PodState("gone", reason="the pod was deleted")
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") in FATAL_WAITING:
            return PodState("failed", reason=f"{waiting['reason']}: {waiting.get('message', '')}".strip(": "))
    if phase in ("Succeeded", "Failed"):
        return PodState("failed", reason=f"the pod ended ({phase}{_exit_of(status)})")
    if phase == "Running" and status.get("podIP"):
        return PodState("running", ip=str(status["podIP"]))
    return PodState("waiting", reason=_waiting_reason(status) or f"phase {phase}")


def _exit_of(status: Mapping[str, Any]) -> str:
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            return f", exit code {term.get('exitCode')}" + (f", {term['reason']}" if term.get("reason") else "")
    return ""


def _waiting_reason(status: Mapping[str, Any]) -> str:
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"{cond.get('reason', 'Unschedulable')}: {cond.get('message', '')}".strip(": ")
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting:
            return f"{waiting.get('reason', '')}: {waiting.get('message', '')}".strip(": ")
    return ""


def refusal_detail(code: int, reason: str, message: str) -> str:
    """A refused create as an operator reads it (RBAC, quota, admission, a clash)."""
    quota = "quota" in message.lower()
    hint = {401: "the host's credentials for the Kubernetes API are not accepted",
            403: ("a ResourceQuota of the namespace is used up" if quota else
                  "RBAC: the host's ServiceAccount lacks this verb (deploy/k8s/rbac.yaml)"),
            409: "a pod of that name exists already",
            422: "the pod was refused as invalid (an admission policy or a bad setting)"}.get(code, "")
    return f"{code} {reason}: {message}" + (f" ({hint})" if hint else "")
