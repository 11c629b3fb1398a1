"""Every service's metrics listener, scraped after a real takeover (docs/operating.md, "Metrics").

A coordinator, two sandbox hosts and a gateway run as processes of their own, with API keys
and an internal token. A run starts, its client leaves, its host is SIGKILLed; the other
host takes it over. Then each service's metrics port (no key) must show what happened:
claims timed, the session's end and the failover counted by the coordinator; the takeover's
stall, its fence, the appends and the journal lag of its replay on the successor; the start
and the requests on the gateway; and the process collector and the garbage collector's
settings everywhere. The gateway's public
``/metrics`` no longer answers a tenant's key.
"""
from __future__ import annotations

import pathlib
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from baton.coordinator_client import CoordinatorClient
from baton.log import LogConfig
from baton.metrics import BYTE_BUCKETS
from baton_tools.testing.cluster import start_coordinator, start_gateway, start_host
from baton_tools.testing.servers import free_port
from tests.conftest import assert_eventually, unique
from tests.gateway.conftest import SLOW_TEXT, host_settings, read_stream

pytestmark = pytest.mark.servers

TOKEN = "internal-token-for-metrics"
KEY = "tenant-key-acme"


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a Prometheus text exposition, by (name, labels)."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def total(scraped: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in scraped.items() if n == name and want <= ls)


async def scrape(http: httpx.AsyncClient, port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    r = await http.get(f"http://127.0.0.1:{port}/metrics")  # no key: the metrics port asks none
    assert r.status_code == 200
    return samples(r.text)


@pytest.mark.timeout(120)
async def test_every_service_shows_a_takeover_on_its_metrics_port(
        etcd: Any, nats: Any, log_cfg: LogConfig, replay_dir: pathlib.Path, tmp_path: pathlib.Path,
        http: httpx.AsyncClient) -> None:
    ports = {"coordinator": free_port(), "a": free_port(), "b": free_port(), "gateway": free_port()}
    auth = {"BATON_INTERNAL_TOKEN": TOKEN}
    coord = await start_coordinator(etcd.endpoint, f"/{unique('mx')}/", log_dir=tmp_path, **auth,
                                    BATON_COORDINATOR_METRICS_LISTEN=f"127.0.0.1:{ports['coordinator']}")
    procs: list[Any] = [coord]
    try:
        settings = {**host_settings(log_cfg, replay_dir, tmp_path), **auth}
        hosts = {}
        for name in ("a", "b"):
            hosts[name] = await start_host(coord.address, nats.url, log_dir=tmp_path, host_id=unique(f"mx-{name}"),
                                           BATON_HOST_METRICS_LISTEN=f"127.0.0.1:{ports[name]}", **settings)
            procs.append(hosts[name])
        gw = await start_gateway(coord.address, nats.url, log_dir=tmp_path, **auth,
                                 BATON_RUNS_STREAM=log_cfg.stream, BATON_SUBJECT_PREFIX=log_cfg.subject_prefix,
                                 BATON_THREADS_BUCKET=log_cfg.bucket, BATON_REPLAY_DIRS=str(replay_dir),
                                 BATON_API_KEYS=f"{KEY}=acme",
                                 BATON_GATEWAY_METRICS_LISTEN=f"127.0.0.1:{ports['gateway']}")
        procs.append(gw)
        tenant = {"Authorization": f"Bearer {KEY}"}

        # The public port: a tenant's key (or none) never reads the cluster's counts.
        for headers in (tenant, {}):
            refused = await http.get(f"{gw.url}/metrics", headers=headers)
            assert (refused.status_code, refused.json()["reason"]) == (403, "METRICS_FORBIDDEN")
        assert (await http.get(f"{gw.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})).status_code == 200
        assert (await http.get(f"{gw.url}/api/agents", headers={"Authorization": "Bearer wrong"})).status_code == 401

        run = unique("run")
        body = {"threadId": unique("th"), "runId": run, "messages": [{"id": "u", "role": "user", "content": "go"}],
                "agent": {"kind": "replay", "journal": "claude-stream-json/slow.jsonl", "speed": 1, "delay": 0.08}}
        first = await read_stream(http, "POST", f"{gw.url}/api/chat", json=body, stop_after=4, headers=tenant)
        assert len(first.events) == 4  # then the client leaves: the run goes on, detached

        async with CoordinatorClient(coord.address, token=TOKEN) as cc:
            driver = (await cc.get_run(run)).record.driver_host
            dead = next(n for n, h in hosts.items() if h.host_id == driver)
            alive = "b" if dead == "a" else "a"
            await hosts[dead].kill()  # its agent lives on in its own session; the other host takes over

            async def taken_over() -> bool:
                rec = (await cc.get_run(run)).record
                return rec.driver_epoch == 2 and rec.driver_host == hosts[alive].host_id
            await assert_eventually(taken_over, timeout=30)

        # The rest of the run, as a reader gets it: nothing lost in the takeover.
        rest = await read_stream(http, "GET", f"{gw.url}/api/chat", params={"runId": run, "offset": "-1"},
                                 headers=tenant)
        assert "".join(c["delta"] for _, c in rest.events if c["type"] == "TEXT_MESSAGE_CONTENT") == SLOW_TEXT

        # The successor: its takeover with the stall from the loss to its fence, its appends.
        async def host_saw_it() -> dict[Any, float]:
            h = await scrape(http, ports[alive])
            assert total(h, "baton_host_takeover_stall_seconds_count") == 1, h
            return h
        h = await assert_eventually(host_saw_it, timeout=15)
        causes = {c for c in ("crash", "session-lost")
                  if total(h, "baton_host_takeover_stall_seconds_count", cause=c) == 1}
        assert len(causes) == 1  # the process was gone: fast failover (crash) or the TTL (session-lost)
        cause = causes.pop()
        assert total(h, "baton_host_takeover_stall_seconds_sum") > 0
        assert total(h, "baton_host_takeovers_total", cause=cause) == 1
        assert total(h, "baton_host_log_fences_total", kind="takeover") == 1
        assert total(h, "baton_host_append_seconds_count") > 0
        assert total(h, "process_cpu_seconds_total") > 0
        # Its journal lag, sampled at each read: the replay from byte 0 starts with nothing
        # consumed, and each later sample counts at least what was written since the read
        # before, so the samples add up to at least the agent's journal (the replay agent
        # writes the recording's bytes unchanged); none exceeds the journal.
        journal = len((replay_dir / "claude-stream-json" / "slow.jsonl").read_bytes())
        reads = total(h, "baton_host_journal_lag_bytes_count")
        assert reads >= 1
        assert total(h, "baton_host_journal_lag_bytes_sum") >= journal
        bound = min(b for b in BYTE_BUCKETS if b >= journal + 100)  # + the wrapper's sentinel line
        assert total(h, "baton_host_journal_lag_bytes_bucket", le=floatToGoString(bound)) == reads

        # The coordinator: claims timed (the start's and the takeover's), the session's end,
        # the orphan by the same cause, the hand-over.
        c = await scrape(http, ports["coordinator"])
        assert total(c, "baton_coordinator_claim_seconds_count", purpose="drive", outcome="claimed") >= 2
        assert total(c, "baton_coordinator_sessions_ended_total",
                     cause="revoked" if cause == "crash" else "expired") >= 1
        assert total(c, "baton_coordinator_orphaned_runs_total", cause=cause) == 1
        assert total(c, "baton_coordinator_failovers_total", outcome="attached") == 1
        assert total(c, "process_resident_memory_bytes") > 0

        # The gateway: the start, timed; requests by route template; the refusals by reason.
        g = await scrape(http, ports["gateway"])
        assert total(g, "baton_gateway_starts_total", outcome="started") == 1
        assert total(g, "baton_gateway_start_seconds_count", outcome="started") == 1
        assert total(g, "baton_gateway_requests_total", route="/api/chat", status="2xx") == 2
        assert total(g, "baton_gateway_requests_total", route="/metrics", status="4xx") == 2
        assert total(g, "baton_gateway_rejected_requests_total", edge="http", reason="METRICS_FORBIDDEN") == 2
        assert total(g, "baton_gateway_rejected_requests_total", edge="http", reason="UNAUTHENTICATED") == 1
        assert total(g, "baton_runs", status="running") + total(g, "baton_runs", status="completed") >= 1
        assert total(g, "process_cpu_seconds_total") > 0

        # Every service runs with the tuned collector, start-up frozen (baton/gc_tuning.py).
        for scraped in (c, h, g):
            assert [total(scraped, "baton_gc_threshold", generation=str(i)) for i in range(3)] == [10_000, 10, 10]
            assert total(scraped, "baton_gc_frozen_objects") > 10_000  # the modules alone are more
    finally:
        for p in reversed(procs):
            await p.stop()
