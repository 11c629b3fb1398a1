"""The sandbox daemon's credentials on the kubernetes provider: a Secret per sandbox (never in
the pod's spec), owned by its pod, gone on every failure path and reaped by run; and TLS on
the host → daemon link with a sandbox CA. On the stand-in cluster (tests/k8s/conftest.py),
under the verbs deploy/k8s/rbac.yaml grants."""
from __future__ import annotations

import json
import logging
import pathlib
from typing import Any

import pytest

from baton.errors import SandboxBuildFailed
from baton_tools.testing.kube import StandinCluster
from sandbox_host.daemon import sandbox_token
from sandbox_host.providers import SandboxHandle, SandboxSpec
from sandbox_host.providers import _k8s_pod as kp
from sandbox_host.providers import _sandbox_tls
from sandbox_host.providers._daemon_client import DaemonUnreachable
from tests.conftest import assert_eventually
from tests.k8s.conftest import TOKEN, make_provider
from tests.tls.pki import CA

pytestmark = [pytest.mark.servers, pytest.mark.timeout(180)]


def spec(run_id: str) -> SandboxSpec:
    return SandboxSpec(provider="kubernetes", env={"BATON_RUN_ID": run_id}, secrets={"API_KEY": "s3cret-value"})


def sandbox_secrets(kube: StandinCluster) -> list[dict[str, Any]]:
    return kube.store.list("secrets", "default", f"{kp.LABEL_NAME}={kp.SANDBOX_APP}")


def sandbox_ca(tmp_path: pathlib.Path, name: str) -> _sandbox_tls.SandboxCa:
    ca = CA(tmp_path / name, name)
    got = _sandbox_tls.from_env({_sandbox_tls.CA_CERT: ca.cert, _sandbox_tls.CA_KEY: ca.key})
    assert got is not None
    return got


async def run_to_end(p: Any, h: SandboxHandle) -> bytes:
    launched = await p.launch(h, ["sh", "-c", 'echo "{\\"k\\": \\"$API_KEY\\"}"'], nonce="0a0b0c",
                              secrets={"API_KEY": "k3y"})
    h = SandboxHandle(**{**h.__dict__, "data": {**h.data, **launched}})

    async def ended() -> bytes:
        data: bytes = await p.read_file(h, h.journal_path)
        assert b'"__exit":0' in data, data
        return data
    got: bytes = await assert_eventually(ended, timeout=30)
    return got


async def test_the_token_is_in_a_secret_the_pod_owns_never_in_the_pod(kube: StandinCluster) -> None:
    async with make_provider(kube, cluster_token=TOKEN, sandbox_ca=None) as p:
        h = await p.create("run-s", spec("run-s"))
        (pod,) = kube.pods()
        daemon_token = sandbox_token(TOKEN, "run-s")
        assert daemon_token not in json.dumps(pod) and TOKEN not in json.dumps(pod)
        (secret,) = sandbox_secrets(kube)
        assert secret["metadata"]["name"] == h.data["secret"] == pod["metadata"]["name"]
        assert secret["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}]
        assert secret["metadata"]["annotations"][kp.ANN_RUN] == "run-s"
        # The daemon got it through the secretKeyRef: an authenticated call works.
        assert json.loads((await run_to_end(p, h)).splitlines()[0]) == {"k": "k3y"}
        assert "daemon_tls" not in h.data
        assert await p.destroy(h) is True
        assert kube.pods() == [] and sandbox_secrets(kube) == []


async def test_a_pod_deleted_by_someone_else_takes_its_secret_with_it(kube: StandinCluster) -> None:
    async with make_provider(kube, cluster_token=TOKEN, sandbox_ca=None) as p:
        h = await p.create("run-g", spec("run-g"))
        await kube.store.delete("pods", "default", str(h.data["pod"]))  # kubectl delete pod
        await assert_eventually(lambda: kube.pods() == [] and sandbox_secrets(kube) == [], timeout=30)


@pytest.mark.parametrize("resource", ["pods", "secrets"])
async def test_a_refused_create_leaves_no_secret_and_no_pod(kube: StandinCluster, resource: str) -> None:
    kube.refuse("create", resource, 403, "Forbidden", f'{resource} is forbidden: exceeded quota: sandboxes', times=1)
    async with make_provider(kube, cluster_token=TOKEN, sandbox_ca=None) as p:
        with pytest.raises(SandboxBuildFailed) as err:
            await p.create("run-r", spec("run-r"))
    assert err.value.step == "pod" and "403 Forbidden" in err.value.detail and "quota" in err.value.detail
    assert kube.pods() == [] and sandbox_secrets(kube) == []


async def test_a_pod_that_fails_to_start_leaves_no_secret(kube: StandinCluster) -> None:
    async with make_provider(kube, image="registry.invalid/nope:1", cluster_token=TOKEN, sandbox_ca=None) as p:
        with pytest.raises(SandboxBuildFailed, match="ErrImagePull"):
            await p.create("run-i", spec("run-i"))
    assert kube.pods() == [] and sandbox_secrets(kube) == []


async def test_the_reaper_removes_leftover_secrets_of_the_run_and_keeps_the_live_ones(kube: StandinCluster) -> None:
    settings = kp.PodSettings(image="x")
    for key, name in (("run-l#1", "baton-left-1"), ("run-l#2", "baton-live-2"), ("other", "baton-other")):
        run = "run-l" if key.startswith("run-l") else "other"
        await kube.store.create("secrets", "default", kp.secret_manifest(
            name, key=key, run_id=run, token="t", settings=settings, daemon_token="x"))
    async with make_provider(kube, cluster_token=TOKEN, sandbox_ca=None) as p:
        await p.destroy_leftovers("run-l", keep_key="run-l#2")
    assert sorted(s["metadata"]["name"] for s in sandbox_secrets(kube)) == ["baton-live-2", "baton-other"]


async def test_the_shipped_role_lacks_what_the_provider_does_not_need(kube: StandinCluster) -> None:
    assert kube.store.allowed is not None
    assert kube.store.allowed["secrets"] == {"create", "patch", "list", "delete"}
    assert kube.store.allowed["pods"] == {"get", "list", "watch", "create", "delete"}


# --- TLS with a sandbox CA ------------------------------------------------------------------


async def test_a_run_over_tls_end_to_end(kube: StandinCluster, tmp_path: pathlib.Path,
                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    ca = sandbox_ca(tmp_path, "sandboxes")
    async with make_provider(kube, cluster_token=TOKEN, sandbox_ca=ca) as first, \
            make_provider(kube, cluster_token=TOKEN, sandbox_ca=ca) as second:
        h = await first.create("run-t", spec("run-t"))
        assert h.data["daemon_tls"] is True
        (pod,) = kube.pods()
        assert "PRIVATE KEY" not in json.dumps(pod) and "CERTIFICATE" not in json.dumps(pod)
        (secret,) = sandbox_secrets(kube)
        assert set(secret["data"]) == {"token", "tls.crt", "tls.key"}
        rt = kube.kubelet.pod("default", str(h.data["pod"]))
        served = (rt.dir / "volumes" / "daemon-tls" / "tls.crt").read_bytes()
        assert served.startswith(b"-----BEGIN CERTIFICATE-----")
        await first.close()
        # Another host takes the sandbox over from its handle, over TLS against the same CA.
        journal = await run_to_end(second, h)
        assert json.loads(journal.splitlines()[0]) == {"k": "k3y"}
        daemon_log = (rt.dir / f"{kp.CONTAINER}.log").read_text()
        assert "PRIVATE KEY" not in daemon_log and sandbox_token(TOKEN, "run-t") not in daemon_log
        assert await second.destroy(h) is True
        assert kube.pods() == [] and sandbox_secrets(kube) == []
    assert "PRIVATE KEY" not in caplog.text


async def test_a_daemon_certified_by_another_ca_is_refused_clearly(kube: StandinCluster, tmp_path: pathlib.Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    ours, theirs = sandbox_ca(tmp_path, "ours"), sandbox_ca(tmp_path, "theirs")
    async with make_provider(kube, cluster_token=TOKEN, sandbox_ca=theirs) as other, \
            make_provider(kube, cluster_token=TOKEN, sandbox_ca=ours, patience=5) as host:
        h = await other.create("run-x", spec("run-x"))
        with pytest.raises(DaemonUnreachable) as err:
            await host.read_file(h, h.journal_path)
        assert "certificate" in str(err.value) and "sandbox CA" in str(err.value)
        # A host without a sandbox CA does not fall back to plaintext.
        async with make_provider(kube, cluster_token=TOKEN, sandbox_ca=None) as plain:
            with pytest.raises(DaemonUnreachable, match="BATON_SANDBOX_CA_CERT"):
                await plain.read_file(h, h.journal_path)
        await other.destroy(h)
    for text in (str(err.value), caplog.text):
        assert "PRIVATE KEY" not in text and ours.key.decode() not in text and theirs.key.decode() not in text


async def test_a_create_whose_daemon_fails_verification_fails_and_leaves_nothing(
        kube: StandinCluster, tmp_path: pathlib.Path) -> None:
    ours, theirs = sandbox_ca(tmp_path, "ours"), sandbox_ca(tmp_path, "theirs")
    # Mints with their key but checks against our certificate: the daemon's certificate fails.
    mixed = _sandbox_tls.SandboxCa(ours.cert, theirs.key, ours.ttl)
    async with make_provider(kube, cluster_token=TOKEN, sandbox_ca=mixed, ready_timeout=60) as p:
        with pytest.raises(SandboxBuildFailed) as err:
            await p.create("run-v", spec("run-v"))
    assert err.value.step == "daemon" and "certificate" in err.value.detail
    assert "PRIVATE KEY" not in str(err.value)
    assert kube.pods() == [] and sandbox_secrets(kube) == []
