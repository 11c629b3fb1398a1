"""A start that fails half-way: the run is started with its input or not at all.

Real coordinator (with its leader's failover), real host and gateway, a nats-server of the
test's own that is paused (SIGSTOP) while a POST arrives, or a gateway SIGKILLed in the
middle of a burst of POSTs. What a user checks: the status and body of the failed POST, the
record, and for every run that exists in the end, a log that opens with ``RUN_STARTED`` then
``run.accepted`` carrying its messages, and a transcript that starts with them.
"""
from __future__ import annotations

import asyncio
import contextlib
import pathlib
import signal
import time
from typing import Any, AsyncIterator

import httpx
import pytest

from baton import errors as e
from baton.coordinator_client import CoordinatorClient
from baton.errors import UnknownRun
from baton.log import DeliveryLog, LogConfig, TranscriptStore
from baton.runs import RUN_ACCEPTED, status_name
from baton_tools.testing.cluster import start_coordinator, start_gateway, start_host
from tests.conftest import assert_eventually, assert_throughout, freeze, unique
from tests.gateway.conftest import host_settings, read_stream

HELLO = "claude-stream-json/hello.jsonl"


def chat_body(run_id: str, thread_id: str, text: str) -> dict[str, Any]:
    return {"threadId": thread_id, "runId": run_id,
            "messages": [{"id": f"u-{run_id}", "role": "user", "content": text}],
            "agent": {"kind": "replay", "journal": HELLO, "speed": 10}}


@pytest.fixture
async def plane(etcd: Any, own_nats: Any, log_cfg: LogConfig, replay_dir: pathlib.Path,
                tmp_path: pathlib.Path) -> AsyncIterator[dict[str, Any]]:
    """Coordinator (leader tasks on, reaper only when asked), one host, all on ``own_nats``."""
    coord = await start_coordinator(etcd.endpoint, f"/{unique('st')}/", log_dir=tmp_path,
                                    detached_run_ttl=3600, reaper_interval=0, session_ttl=6)
    settings = {**host_settings(log_cfg, replay_dir, tmp_path), "BATON_SESSION_TTL": "6"}
    host = await start_host(coord.address, own_nats.url, log_dir=tmp_path, **settings)
    cc = CoordinatorClient(coord.address)
    dlog = await DeliveryLog.connect(own_nats.url, log_cfg)
    try:
        yield {"coord": coord, "host": host, "cc": cc, "log": dlog, "cfg": log_cfg}
    finally:
        if own_nats.proc is not None and own_nats.proc.poll() is None:
            own_nats.proc.send_signal(signal.SIGCONT)
        await host.stop()
        await cc.close()
        await dlog.close()
        await coord.stop()


async def log_chunks(dlog: DeliveryLog, run_id: str) -> list[dict[str, Any]]:
    """Every chunk of a closed log."""
    out: list[dict[str, Any]] = []
    async with dlog.read(run_id, after="-1", stop_at_close=True) as r:
        async for _off, chunk in r:
            out.append(chunk)
    return out


async def assert_started_with_input(p: dict[str, Any], run_id: str, thread_id: str, text: str) -> None:
    """The run ended, its log opens with RUN_STARTED then run.accepted carrying its message,
    exactly once each, and its transcript starts with that message."""
    cc: CoordinatorClient = p["cc"]

    async def ended() -> Any:
        rec = (await cc.get_run(run_id)).record
        assert status_name(rec.status) == "completed", status_name(rec.status)
        return rec

    await assert_eventually(ended, timeout=60, interval=0.1)
    async with asyncio.timeout(30):
        chunks = await log_chunks(p["log"], run_id)
    user = {"id": f"u-{run_id}", "role": "user", "content": text}
    assert chunks[0] == {"type": "RUN_STARTED", "threadId": thread_id, "runId": run_id}
    assert chunks[1]["type"] == "CUSTOM" and chunks[1]["name"] == RUN_ACCEPTED
    assert chunks[1]["value"]["messages"] == [user]
    assert sum(c["type"] == "RUN_STARTED" for c in chunks) == 1
    assert sum(c.get("name") == RUN_ACCEPTED for c in chunks) == 1
    assert chunks[-1]["type"] == "RUN_FINISHED"
    msgs, _ = await TranscriptStore(p["log"].nc, p["cfg"]).load(thread_id)
    assert msgs[0] == user and msgs[-1]["role"] == "assistant"


async def test_post_while_the_log_is_paused_503_then_a_retry_starts_it_with_its_input(
        plane: dict[str, Any], own_nats: Any, make_gateway: Any) -> None:
    p = plane
    cc: CoordinatorClient = p["cc"]
    gw = await make_gateway(coordinator=(p["coord"].address,), nats_url=own_nats.url)
    run_id, thread_id = unique("run-"), unique("thr-")
    lost_run, lost_thread = unique("run-"), unique("thr-")
    async with httpx.AsyncClient(trust_env=False, timeout=60) as http:
        # The gateway's storage probe (cached for 3 s) said "fine" just before NATS froze:
        # the POSTs reach a host, whose start then fails half-way. (A POST after the probe
        # saw the outage is refused before anything exists: asserted at the end.)
        assert await gw.state.log_health.problem() is None
        await freeze(own_nats.proc)
        try:
            r1, r2 = await asyncio.gather(
                http.post(f"{gw.url}/api/chat", json=chat_body(run_id, thread_id, "first")),
                http.post(f"{gw.url}/api/chat", json=chat_body(lost_run, lost_thread, "never retried")))
        finally:
            own_nats.proc.send_signal(signal.SIGCONT)
        for r in (r1, r2):
            assert r.status_code == 503, r.text
            assert r.json()["reason"] == "LOG_UNAVAILABLE"
            assert r.json()["runExists"] is True

        # The run exists, not started: nobody drives it, though its claim came and went
        # (the leader's failover saw the claim vanish). Watched for a while: nothing moves.
        view = await cc.get_run(run_id)
        epoch = view.record.driver_epoch
        async def unmoved() -> None:
            view = await cc.get_run(run_id)
            assert view.record.starting and view.claim is None and view.record.driver_epoch == epoch
            assert await cc.get_sandbox(run_id) is None  # no sandbox, no agent
        await assert_throughout(unmoved, 2.0, interval=0.1)
        # At most the opening (RUN_STARTED, run.accepted) may be stored: no agent output.
        assert len([r for r in await p["log"].stored_headers(run_id) if r.kind == "chunk"]) <= 2

        # The client retries the same POST: the same run is started, once, with its input.
        again = await read_stream(http, "POST", f"{gw.url}/api/chat", json=chat_body(run_id, thread_id, "first"))
        assert again.status == 200 and again.ended
        assert again.events[0][1]["type"] == "RUN_STARTED"
        assert again.events[1][1]["name"] == RUN_ACCEPTED
        await assert_started_with_input(p, run_id, thread_id, "first")
        rec = (await cc.get_run(run_id)).record
        assert not rec.starting and rec.driver_epoch == epoch + 1

        # A retry after it started joins it and starts nothing.
        joined = await read_stream(http, "POST", f"{gw.url}/api/chat", json=chat_body(run_id, thread_id, "first"))
        assert joined.events == again.events
        assert (await cc.get_run(run_id)).record.driver_epoch == epoch + 1

        # Once the probe sees the outage, a new POST is refused before anything exists.
        await freeze(own_nats.proc)
        try:
            fresh_run = unique("run-")

            async def probe_saw_it() -> bool:
                return await gw.state.log_health.problem() is not None

            await assert_eventually(probe_saw_it, timeout=30, interval=0.5)
            r3 = await http.post(f"{gw.url}/api/chat", json=chat_body(fresh_run, unique("thr-"), "x"))
        finally:
            own_nats.proc.send_signal(signal.SIGCONT)
        assert r3.status_code == 503 and r3.json()["reason"] == "LOG_UNAVAILABLE", r3.text
        assert r3.json()["runExists"] is False
        with pytest.raises(UnknownRun):
            await cc.get_run(fresh_run)

    # The start nobody retried is ended by the reaper once its grace is over: aborted,
    # without an agent ever launched.
    counts = await cc.reap(now=time.time() + 3600)
    assert counts.get("start-abandoned") == 1, counts

    async def aborted() -> bool:
        rec = (await cc.get_run(lost_run)).record
        assert status_name(rec.status) == "aborted" and rec.cancel_reason == "start-abandoned", rec
        return True

    await assert_eventually(aborted, timeout=30, interval=0.1)
    async with asyncio.timeout(30):
        chunks = await log_chunks(p["log"], lost_run)
    assert not any(c["type"].startswith("TEXT_MESSAGE") for c in chunks), chunks


@pytest.mark.timeout(300)
async def test_gateway_sigkilled_mid_burst_every_run_has_its_input_or_does_not_exist(
        plane: dict[str, Any], own_nats: Any, log_cfg: LogConfig, replay_dir: pathlib.Path,
        tmp_path: pathlib.Path, make_gateway: Any) -> None:
    p = plane
    cc: CoordinatorClient = p["cc"]
    gw = await start_gateway(p["coord"].address, own_nats.url, log_dir=tmp_path, runs_stream=log_cfg.stream,
                             subject_prefix=log_cfg.subject_prefix, threads_bucket=log_cfg.bucket,
                             replay_dirs=str(replay_dir))
    runs = [(unique("run-"), unique("thr-")) for _ in range(30)]
    async with httpx.AsyncClient(trust_env=False, timeout=60) as http:
        async def post(run_id: str, thread_id: str) -> None:
            with contextlib.suppress(httpx.HTTPError):
                await read_stream(http, "POST", f"{gw.url}/api/chat", json=chat_body(run_id, thread_id, run_id))

        burst = [asyncio.create_task(post(r, t)) for r, t in runs]

        async def some_run_exists() -> bool:  # the crash point: the burst is under way
            for run_id, _ in runs:
                with contextlib.suppress(e.UnknownRun):
                    return bool(await cc.get_run(run_id))
            return False

        await assert_eventually(some_run_exists, timeout=30, interval=0.01)
        await gw.kill()
        await asyncio.wait(burst, timeout=60)

        # Every run id that exists ends with its input (a retry starts one the crash left
        # half-started); none is ever driven without it.
        gw2 = await make_gateway(coordinator=(p["coord"].address,), nats_url=own_nats.url)
        async def converge(run_id: str, thread_id: str) -> bool:
            try:
                view = await cc.get_run(run_id)
            except e.UnknownRun:
                return False
            try:
                if view.record.starting:
                    async with asyncio.timeout(90):
                        again = await read_stream(
                            http, "POST", f"{gw2.url}/api/chat", json=chat_body(run_id, thread_id, run_id))
                    assert again.status == 200, again
                await assert_started_with_input(p, run_id, thread_id, run_id)
            except (AssertionError, TimeoutError) as exc:
                raise AssertionError(f"{run_id} did not converge from {view}: now {await cc.get_run(run_id)}") from exc
            return True

        existing = sum(await asyncio.gather(*(converge(r, t) for r, t in runs)))
        assert existing > 0
