"""Fixtures of the fuzz suite: two gateways (one with API keys, one without, both serving
gRPC) on the gateway suite's real coordinator and NATS, and stored data seeded before the
fuzzing (runs with logs, records and transcripts; /ds streams) with a snapshot to compare
after it.

The seeded data belongs to tenant A of the gateway with keys. Fuzzed requests may name it
freely when they read, or when they write as anyone but its owner (another tenant, a bad
key, no key: every one must be refused); a write as its owner (tenant A, or anyone on the
gateway without keys, where every caller is the owner) names only new ids. So any change
to the seeded data after the fuzzing is a broken property, not a legitimate write.
"""
from __future__ import annotations

import dataclasses
import json
import time
import urllib.parse
from typing import Any, AsyncIterator

import httpx
import pytest

from baton.coordinator_client import CoordinatorClient
from baton.log import DeliveryLog, TranscriptStore
from baton.v1 import runs_pb2
# The gateway suite's fixtures: one coordinator, delivery-log stream and replay dir per session.
from tests.gateway.conftest import (  # noqa: F401
    Gateway, GatewayFactory, cc, coordinator, dlog, log_cfg, make_gateway, read_stream, replay_dir, run_chunks,
    write_run,
)

@dataclasses.dataclass
class World:
    """The gateways and the seeded data of one fuzz test."""

    auth: Gateway        # BATON_API_KEYS = {key_a: tenant A, key_b: tenant B}
    open: Gateway        # no keys: every caller is the one tenant ""
    key_a: str
    key_b: str
    run_ids: list[str]
    thread_ids: list[str]
    streams: list[str]   # /ds paths (under /ds) of tenant A
    http: httpx.AsyncClient
    cc: CoordinatorClient

    @property
    def seeded_ids(self) -> list[str]:
        return self.run_ids + self.thread_ids

    def owner(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key_a}"}

    async def snapshot(self) -> dict[str, Any]:
        """Everything seeded, read back by its owner: chunks of each run (SSE from offset -1),
        each record as etcd holds it, each transcript, each /ds stream's bytes and headers."""
        out: dict[str, Any] = {}
        for run_id in self.run_ids:
            got = await read_stream(self.http, "GET", f"{self.auth.url}/api/chat",
                                    params={"runId": run_id, "offset": "-1"}, headers=self.owner())
            out[f"chunks {run_id}"] = (got.status, got.events, got.ended)
            view = await self.cc.get_run(run_id)
            out[f"record {run_id}"] = view.record.SerializeToString(deterministic=True)
        for thread_id in self.thread_ids:
            r = await self.http.get(f"{self.auth.url}/api/threads/{urllib.parse.quote(thread_id, safe='')}/messages",
                                    headers=self.owner())
            out[f"transcript {thread_id}"] = (r.status_code, r.content)
        for path in self.streams:
            r = await self.http.get(f"{self.auth.url}/ds{path}", params={"offset": "-1"}, headers=self.owner())
            out[f"ds {path}"] = (r.status_code, r.content, r.headers.get("content-type"),
                                 r.headers.get("stream-next-offset"), r.headers.get("stream-closed"))
        return out


@dataclasses.dataclass(frozen=True)
class Names:
    """The seeded ids and keys of one surface: fixed, so the strategies (drawn before the
    servers exist) name them and a seed gives the same inputs on every run. Each surface has
    its own, and each session its own coordinator prefix and log stream."""

    surface: str

    @property
    def key_a(self) -> str:
        return f"fuzz-{self.surface}-key-a"

    @property
    def key_b(self) -> str:
        return f"fuzz-{self.surface}-key-b"

    @property
    def keys(self) -> dict[str, str]:
        return {self.key_a: f"fuzz-{self.surface}-tenant-a", self.key_b: f"fuzz-{self.surface}-tenant-b"}

    @property
    def auth_choices(self) -> list[list[str]]:
        """``Authorization`` headers a request may carry: none, each key, bad ones, both keys."""
        a, b = self.key_a, self.key_b
        return [[], [f"Bearer {a}"], [f"Bearer {b}"], ["Bearer nope"], [f"Basic {a}"], ["Bearer "],
                [f"bearer  {b} "], [f"Bearer {b}", f"Bearer {a}"], [f"Bearer {a}", f"Bearer {b}"],
                ["Bearer nope", f"Bearer {b}"], ["Bearer \xe9\xff"]]

    @property
    def run_ids(self) -> list[str]:
        return [f"fz-{self.surface}-run", f"fz/{self.surface}/run/..", f"fz-{self.surface}-é🙂"]

    @property
    def thread_ids(self) -> list[str]:
        return [f"fz-{self.surface}-th", f"fz/{self.surface}/th/x", f"fz {self.surface} %00 th"]

    @property
    def streams(self) -> list[str]:
        base = f"/fz-{self.surface}"
        return [f"{base}/bytes", f"{base}/json", f"{base}%2Fclosed"]


@pytest.fixture
async def world(request: pytest.FixtureRequest, make_gateway: GatewayFactory, cc: CoordinatorClient,
                dlog: DeliveryLog, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[World]:
    """Two fresh gateways and tenant A's seeded runs, transcripts and streams, named by the
    test module's ``NAMES``."""
    names: Names = request.module.NAMES
    # A /ds long-poll answers after this long (read when a gateway starts): fuzzed reads of
    # live streams end in a second, not the default 20 s.
    monkeypatch.setenv("BATON_DS_LONG_POLL_S", "0.5")
    key_a, key_b, keys = names.key_a, names.key_b, names.keys
    common: dict[str, Any] = dict(keepalive=0.5, grpc_listen="127.0.0.1:0", cancel_wait=1.0)
    auth = await make_gateway(api_keys=keys, **common)
    open_ = await make_gateway(**common)
    run_ids, thread_ids = names.run_ids, names.thread_ids
    transcripts = TranscriptStore(dlog.nc, dlog.cfg)
    for i, (run_id, thread_id) in enumerate(zip(run_ids, thread_ids)):
        _rec, created = await cc.create_or_resume_run(runs_pb2.RunRecord(
            run_id=run_id, thread_id=thread_id, tenant=keys[key_a],
            agent=runs_pb2.AgentSpec(kind="replay"), detach_on_disconnect=True))
        assert created
        await write_run(dlog, run_id, run_chunks(run_id, thread_id, [f"seeded {i}", " \u2028 \ud7ff 🙂"]))
        # Finished now: a record that ended long ago is retention's to delete (30 days), and
        # its sweep runs during a long fuzz run.
        await cc.update_run(run_id, runs_pb2.RunRecord(status=runs_pb2.RUN_STATUS_COMPLETED, finished_at=time.time()),
                            paths=["status", "finished_at"])
        await transcripts.save(thread_id, [{"id": f"u{i}", "role": "user", "content": "hi"},
                                           {"id": f"a{i}", "role": "assistant", "content": f"seeded {i}"}])
    streams = names.streams
    async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
        owner = {"Authorization": f"Bearer {key_a}"}
        for path, ctype, appends, close in ((streams[0], "application/octet-stream", [b"\x00\xff", b"two"], False),
                                            (streams[1], "application/json", [b'[{"a":1},2]', b'"three"'], False),
                                            (streams[2], "text/plain", [b"closed one"], True)):
            r = await http.put(f"{auth.url}/ds{path}", headers={**owner, "Content-Type": ctype})
            assert r.status_code == 201, (path, r.status_code, r.text)
            for i, body in enumerate(appends):
                extra = {"Stream-Closed": "true"} if close and i == len(appends) - 1 else {}
                r = await http.post(f"{auth.url}/ds{path}", content=body,
                                    headers={**owner, "Content-Type": ctype, **extra})
                assert r.status_code in (200, 204), (path, r.status_code, r.text)
        yield World(auth, open_, key_a, key_b, run_ids, thread_ids, streams, http, cc)


async def assert_unchanged(world: World, before: dict[str, Any]) -> None:
    """The seeded data reads back exactly as before the fuzzing."""
    after = await world.snapshot()
    changed = {k: (before.get(k), v) for k, v in after.items() if before.get(k) != v}
    assert not changed, "stored data changed by the fuzzing: " + json.dumps(
        {k: [repr(x)[:400] for x in pair] for k, pair in changed.items()}, indent=1)
