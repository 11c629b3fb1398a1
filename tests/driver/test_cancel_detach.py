"""Cancel (both paths), detach, and drain: the rows of docs/design.md §5.5's table, for real."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from baton.v1 import sandbox_host_pb2
from sandbox_host.translate import translate_bytes
from tests.conftest import assert_eventually, unique
from tests.driver.conftest import CORPUS, Cluster, status_of

LONG = "claude-stream-json/partial-messages-parallel-bash-denied.jsonl"
SLOW = 0.05  # seconds per line: ~14 s for the whole journal, so the run is mid-way when we act


def _group_alive(pgid: int) -> bool:
    from sandbox_host.providers.local import group_alive

    return group_alive(pgid)


async def _read_until(cluster: Cluster, run_id: str, n: int) -> tuple[list[dict[str, Any]], "asyncio.Task[list[dict[str, Any]]]"]:
    """Start a reader; return once it has seen ``n`` chunks (and the task that goes on)."""
    got: list[dict[str, Any]] = []
    seen = asyncio.Event()

    async def go() -> list[dict[str, Any]]:
        async with cluster.log.read(run_id) as reader:
            async for _, chunk in reader:
                got.append(chunk)
                if len(got) >= n:
                    seen.set()
        seen.set()
        return got

    task = asyncio.create_task(go())
    async with asyncio.timeout(30):
        await seen.wait()
    return got, task


async def _pgid(cluster: Cluster, run_id: str) -> int:
    async def launched() -> int:
        rec = await cluster.record(run_id)
        inst = await cluster.cc.get_sandbox(rec.sandbox_key) if rec.sandbox_key else None
        data = json.loads(inst.handle_json)["data"] if inst else {}
        return int(data.get("pgid") or 0)
    return await assert_eventually(launched)


async def _assert_cancelled(cluster: Cluster, run_id: str, chunks: list[dict[str, Any]], reason: str,
                            pgid: int | None) -> None:
    assert chunks[-2] == {"type": "CUSTOM", "name": "run.cancelled",
                          "value": {"reason": reason, "processGone": True, "sandboxDestroyed": True}}
    assert chunks[-1] == {"type": "RUN_ERROR", "message": f"run cancelled ({reason})", "code": "cancelled"}
    assert not any(c["type"] == "RUN_FINISHED" for c in chunks)
    rec = await cluster.wait_status(run_id, "aborted")
    assert rec.HasField("finished_at") and rec.error.code == "cancelled"
    if rec.sandbox_key:
        assert await cluster.cc.get_sandbox(rec.sandbox_key) is None
    if pgid:
        assert not _group_alive(pgid)
    last = await cluster.log.last_record(run_id)
    assert last is not None and last.kind == "close" and last.status == "aborted"
    msgs, _ = await cluster.transcripts.load(rec.thread_id)
    assert msgs and msgs[0]["role"] == "user"


async def test_cancel_seen_via_watch_run(cluster: Cluster) -> None:
    started = await cluster.start_run(cluster.hosts[0], LONG, delay=SLOW, keep_sandbox=True)
    run_id = started.record.run_id
    _, reader = await _read_until(cluster, run_id, 10)
    pgid = await _pgid(cluster, run_id)
    await cluster.cc.request_run_cancel(run_id, reason="user")
    async with asyncio.timeout(30):
        chunks = await reader
    await _assert_cancelled(cluster, run_id, chunks, "user", pgid)


async def test_cancel_by_the_in_process_fast_path(cluster: Cluster) -> None:
    host = cluster.hosts[1]
    started = await cluster.start_run(host, LONG, delay=SLOW)
    run_id = started.record.run_id
    _, reader = await _read_until(cluster, run_id, 10)
    pgid = await _pgid(cluster, run_id)
    resp = await cluster.stub(host).CancelRun(sandbox_host_pb2.CancelRunRequest(run_id=run_id, reason="user"), timeout=5)
    assert resp.driving is True
    async with asyncio.timeout(30):
        chunks = await reader
    await _assert_cancelled(cluster, run_id, chunks, "user", pgid)


@pytest.mark.parametrize("after", [0.0, 0.05, 0.2])
async def test_cancel_right_after_create_ends_aborted(cluster: Cluster, after: float) -> None:
    host = cluster.hosts[0]
    started = await cluster.start_run(host, LONG, delay=SLOW)
    run_id = started.record.run_id
    await asyncio.sleep(after)  # the scenario: a cancel 0–200 ms after create
    await cluster.cc.request_run_cancel(run_id, reason="user")
    await cluster.stub(host).CancelRun(sandbox_host_pb2.CancelRunRequest(run_id=run_id, reason="user"), timeout=5)
    chunks = [c for _, c in await cluster.read_all(run_id)]
    assert chunks[0]["type"] == "RUN_STARTED" and chunks[1]["name"] == "run.accepted"
    await _assert_cancelled(cluster, run_id, chunks, "user", None)


async def test_cancel_of_a_run_whose_host_died_is_carried_out_by_another(cluster: Cluster) -> None:
    a = cluster.hosts[0]
    started = await cluster.start_run(a, LONG, delay=SLOW)
    run_id = started.record.run_id
    _, reader = await _read_until(cluster, run_id, 10)
    pgid = await _pgid(cluster, run_id)
    a.kill_now()
    restart = asyncio.create_task(a.start())
    await cluster.cc.request_run_cancel(run_id, reason="user")
    async with asyncio.timeout(30):
        chunks = await reader
    await _assert_cancelled(cluster, run_id, chunks, "user", pgid)
    rec = await cluster.record(run_id)
    assert rec.driver_epoch == 2
    await restart


async def _detach(cluster: Cluster, run_id: str) -> None:
    """A reader comes and goes (presence under a session): the coordinator stamps detach."""
    session = await cluster.cc.open_session(ttl=2, owner="test-gateway")
    try:
        reader_id = unique("reader-")
        await cluster.cc.register_reader(run_id, session, reader_id)
        await cluster.cc.unregister_reader(run_id, reader_id)
    finally:
        await session.close()


async def test_detach_is_not_terminal_and_the_agent_goes_on(cluster: Cluster) -> None:
    started = await cluster.start_run(cluster.hosts[1], LONG, delay=0.01)
    run_id, thread_id = started.record.run_id, started.record.thread_id
    got, reader = await _read_until(cluster, run_id, 5)
    await _detach(cluster, run_id)
    rec = await assert_eventually(lambda: _detached(cluster, run_id))
    assert status_of(rec) == "running" and rec.sandbox_key and not rec.cancel_requested
    at_detach = len(got)
    async with asyncio.timeout(60):
        chunks = await reader
    assert len(chunks) > at_detach and chunks[-1]["type"] == "RUN_FINISHED"
    assert chunks[1]["name"] == "run.accepted"
    assert [chunks[0], *chunks[2:]] == translate_bytes("claude-stream-json", (CORPUS / LONG).read_bytes(), run_id, thread_id)
    await cluster.wait_status(run_id, "completed")


async def _detached(cluster: Cluster, run_id: str) -> Any:
    rec = await cluster.record(run_id)
    return rec if rec.HasField("detached_since") else None


async def test_detach_with_cancel_on_disconnect_cancels_and_log_still_replays(cluster: Cluster) -> None:
    started = await cluster.start_run(cluster.hosts[0], LONG, delay=SLOW, cancel_on_disconnect=True)
    run_id = started.record.run_id
    _, reader = await _read_until(cluster, run_id, 5)
    pgid = await _pgid(cluster, run_id)
    await _detach(cluster, run_id)
    async with asyncio.timeout(30):
        live = await reader
    await _assert_cancelled(cluster, run_id, live, "disconnected", pgid)
    later = [c for _, c in await cluster.read_all(run_id)]  # a later reader gets the whole log
    assert later == live


async def test_drain_hands_runs_over_and_finalizes_nothing(cluster: Cluster) -> None:
    a = cluster.hosts[1]
    started = await cluster.start_run(a, LONG, delay=0.02)
    run_id, thread_id = started.record.run_id, started.record.thread_id
    _, reader = await _read_until(cluster, run_id, 30)
    await a.stop()  # SIGTERM: drain
    assert a.proc is not None and a.proc.returncode == 0
    rec_mid = await cluster.record(run_id)
    assert status_of(rec_mid) == "running"
    async with asyncio.timeout(60):
        chunks = await reader
    expected = translate_bytes("claude-stream-json", (CORPUS / LONG).read_bytes(), run_id, thread_id)
    assert chunks[1]["name"] == "run.accepted" and [chunks[0], *chunks[2:]] == expected
    rec = await cluster.wait_status(run_id, "completed")
    assert rec.driver_epoch == 2 and rec.driver_host != a.host_id
    assert f"run {run_id}: Drain" in a.log_text()
    await a.start()
