"""`baton up` on replicated engines: a 3-member etcd and a 3-node JetStream
cluster it starts itself (``--replicated``), or servers it is given (``--etcd-endpoints``,
``--nats-url``) and leaves alone."""
from __future__ import annotations

import json
import pathlib
import signal
import subprocess
from typing import Any

import httpx
import nats
import pytest

from baton.sse import Event, SSEParser
from baton_tools.testing.replicated import EtcdCluster, NatsCluster
from tests.cli.conftest import baton_argv, cli_env, cluster_json, pid_alive, processes_mentioning, run_cli
from tests.conftest import REPO, assert_eventually

JOURNAL = "codex-exec-json/command-with-stderr-noise-v0.46.jsonl"

pytestmark = pytest.mark.servers


async def _up(data_dir: pathlib.Path, *args: str, **env: str) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    data_dir.mkdir(parents=True, exist_ok=True)
    out = data_dir.parent / f"{data_dir.name}-up.out"
    with open(out, "ab") as log:
        proc = subprocess.Popen(baton_argv("up", "--hosts", "1", "--port", "0", "--data-dir", str(data_dir), *args),
                                env=cli_env(**env), cwd=str(REPO), stdout=log, stderr=subprocess.STDOUT)

    def ready() -> dict[str, Any] | None:
        assert proc.poll() is None, out.read_text(errors="replace")
        return cluster_json(data_dir)

    return proc, await assert_eventually(ready, timeout=120, interval=0.2)


def _run(url: str, run_id: str) -> list[dict[str, Any]]:
    """One replay run through the page's API; its chunks, after checking it completed."""
    body = {"threadId": f"{run_id}-thread", "messages": [{"id": "u1", "role": "user", "content": "hi"}],
            "agent": {"kind": "replay", "journal": JOURNAL, "speed": 100}}
    with httpx.Client(trust_env=False, timeout=60) as http:
        resp = http.post(f"{url}/api/chat", json=body, headers={"X-Run-Id": run_id})
        assert resp.status_code == 200, resp.text
        chunks = [json.loads(ev.data) for ev in SSEParser().feed(resp.text) if isinstance(ev, Event)]
        assert [c["type"] for c in chunks][::len(chunks) - 1] == ["RUN_STARTED", "RUN_FINISHED"]
        assert http.get(f"{url}/api/runs/{run_id}").json()["status"] == "completed"
        again = http.get(f"{url}/api/chat", params={"runId": run_id, "offset": "-1"}).text
        assert [json.loads(ev.data) for ev in SSEParser().feed(again) if isinstance(ev, Event)] == chunks
    return chunks


async def _stream_replicas(servers: str, stream: str = "BATON_RUNS") -> tuple[int, list[str]]:
    nc = await nats.connect(servers.split(","))
    try:
        info = await nc.jetstream().stream_info(stream)
    finally:
        await nc.close()
    assert info.cluster is not None
    peers = [info.cluster.leader or "", *[r.name for r in info.cluster.replicas or []]]
    return info.config.num_replicas or 0, sorted(peers)


def _environ(pid: int) -> list[bytes]:
    return pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


@pytest.mark.timeout(300)
async def test_up_replicated_runs_on_three_member_engines_at_r3(tmp_path: pathlib.Path) -> None:
    data_dir = tmp_path / "replicated"
    proc, info = await _up(data_dir, "--replicated")
    try:
        names = [c["name"] for c in info["components"]]
        assert names == ["etcd-0", "etcd-1", "etcd-2", "nats-0", "nats-1", "nats-2", "coordinator", "host-1", "gateway"]
        assert info["engines"] == "replicated"
        etcd = [c["address"] for c in info["components"] if c["name"].startswith("etcd-")]
        nats_urls = [c["address"] for c in info["components"] if c["name"].startswith("nats-")]
        assert info["etcd_endpoints"].split(",") == etcd and info["nats_servers"].split(",") == nats_urls
        coord, host = info["components"][6], info["components"][7]
        # Every service knows every member, so it can reconnect to any survivor.
        assert f"BATON_ETCD_ENDPOINTS={info['etcd_endpoints']}".encode() in _environ(coord["pid"])
        assert f"BATON_NATS_URL={info['nats_servers']}".encode() in _environ(host["pid"])
        assert b"BATON_LOG_REPLICAS=3" in _environ(host["pid"])

        _run(info["url"], "up-r3-run")
        assert await _stream_replicas(info["nats_servers"]) == (3, ["n0", "n1", "n2"])

        down = run_cli("down", "--data-dir", str(data_dir), timeout=120)
        assert down.returncode == 0, down.stderr
        assert proc.wait(60) == 0
        for c in info["components"]:
            assert not pid_alive(c["pid"]), c
        assert processes_mentioning(str(data_dir)) == []
    finally:
        _stop(proc)


@pytest.mark.timeout(300)
async def test_up_on_external_engines_starts_only_the_services_and_leaves_the_engines(tmp_path: pathlib.Path) -> None:
    etcd, nats_cluster = EtcdCluster(tmp_path / "etcd"), NatsCluster(tmp_path / "nats")
    try:
        etcd.start()
        nats_cluster.start()
        data_dir = tmp_path / "external"
        proc, info = await _up(data_dir, "--etcd-endpoints", etcd.endpoints, "--nats-url", nats_cluster.url,
                               BATON_LOG_REPLICAS="3")
        try:
            assert [c["name"] for c in info["components"]] == ["coordinator", "host-1", "gateway"]
            assert info["engines"] == "external"
            assert (info["etcd_endpoints"], info["nats_servers"]) == (etcd.endpoints, nats_cluster.url)
            _run(info["url"], "up-external-run")
            assert (await _stream_replicas(nats_cluster.url))[0] == 3

            down = run_cli("down", "--data-dir", str(data_dir), timeout=120)
            assert down.returncode == 0, down.stderr
            assert proc.wait(60) == 0
            assert processes_mentioning(str(data_dir)) == []
            # The engines are the operator's: `baton down` left them running.
            assert all(s.proc is not None and s.proc.poll() is None for s in [*etcd.members, *nats_cluster.nodes])
        finally:
            _stop(proc)
    finally:
        nats_cluster.kill()
        etcd.kill()
