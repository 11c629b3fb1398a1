"""Takeover scenarios (docs/design.md §5.2, §5.4, §4.1): fencing, races, preflight, divergence."""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
from typing import Any

import grpc
import pytest

from baton.errors import JournalAttachUnavailable, RunClaimNotAcquired
from baton.grpc_errors import from_rpc_error
from baton.v1 import coordinator_pb2, runs_pb2, sandbox_host_pb2
from sandbox_host.translate import translate_bytes
from tests.conftest import assert_eventually, unique
from tests.driver.conftest import CORPUS, Cluster, status_of

LONG = "claude-stream-json/partial-messages-parallel-bash-denied.jsonl"
SHORT = "codex-exec-json/zsh-commands-and-file-change.jsonl"


async def _wait_log(host: Any, needle: str, timeout: float = 20.0) -> None:
    await assert_eventually(lambda: needle in host.log_text(), timeout=timeout, interval=0.05)


async def test_paused_old_host_lands_nothing_after_its_successor(cluster: Cluster) -> None:
    a = cluster.hosts[0]
    started = await cluster.start_run(a, LONG, delay=0.02)
    run_id = started.record.run_id
    got: list[dict[str, Any]] = []
    async with cluster.log.read(run_id) as reader:
        async for _, chunk in reader:
            got.append(chunk)
            if len(got) == 20:
                a.sigstop()  # frozen past its lease: the leader hands the run to the other host
    try:
        done = await cluster.wait_status(run_id, "completed")
        assert done.driver_epoch == 2 and done.driver_host != a.host_id
        heads_before = await cluster.log.stored_headers(run_id)
    finally:
        a.sigcont()
    # The old host wakes up, finds its session gone and its writer fenced, and stops.
    await _wait_log(a, f"run {run_id}: driver ended at epoch 1")
    heads = await cluster.log.stored_headers(run_id)
    assert heads == heads_before
    fence2 = next(i for i, h in enumerate(heads) if h.kind == "fence" and h.epoch == 2)
    assert all(h.epoch == 2 for h in heads[fence2:]) and heads[-1].kind == "close"
    after = await cluster.record(run_id)
    assert status_of(after) == "completed" and after.driver_epoch == 2 and after.finished_at == done.finished_at
    assert sum(1 for c in got if c["type"] == "RUN_STARTED") == 1 and got[-1]["type"] == "RUN_FINISHED"
    await a.stop()
    await a.start()


async def _seed_record(cluster: Cluster, journal: str, *, sandbox_key: str = "", fmt: str | None = None) -> runs_pb2.RunRecord:
    opts: dict[str, Any] = {"journal": str(CORPUS / journal), "speed": 0, "delay": 0}
    if fmt:
        opts["format"] = fmt
    seed = runs_pb2.RunRecord(run_id=unique("run-"), thread_id=unique("thr-"), status=runs_pb2.RUN_STATUS_RUNNING,
                              sandbox_key=sandbox_key,
                              agent=runs_pb2.AgentSpec(kind="replay", options_json=json.dumps(opts)))
    rec, created = await cluster.cc.create_or_resume_run(seed)
    assert created and rec.driver_epoch == 0  # never claimed: the leader's failover leaves it alone
    return rec


async def test_two_hosts_attach_at_once_one_drives_the_other_appends_nothing(cluster: Cluster) -> None:
    rec = await _seed_record(cluster, SHORT)
    req = sandbox_host_pb2.AttachRunRequest(run_id=rec.run_id)
    results = await asyncio.gather(*(cluster.stub(h).AttachRun(req, timeout=10, wait_for_ready=True)
                                     for h in cluster.hosts[:2]), return_exceptions=True)
    ok = [r for r in results if isinstance(r, sandbox_host_pb2.AttachRunResponse)]
    refused = [from_rpc_error(r) for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(ok) == 1 and len(refused) == 1
    assert isinstance(refused[0], RunClaimNotAcquired) and refused[0].reason == "held"
    chunks = [c for _, c in await cluster.read_all(rec.run_id)]
    assert chunks == translate_bytes("codex-exec-json", (CORPUS / SHORT).read_bytes(), rec.run_id, rec.thread_id)
    heads = await cluster.log.stored_headers(rec.run_id)
    assert [h.kind for h in heads].count("fence") == 1
    assert {h.epoch for h in heads} == {ok[0].epoch}
    await cluster.wait_status(rec.run_id, "completed")


async def test_attach_terminal_run_whose_journal_is_gone_is_terminal_run(cluster: Cluster) -> None:
    started = await cluster.start_run(cluster.hosts[1], SHORT)
    await cluster.read_all(started.record.run_id)
    rec = await cluster.wait_status(started.record.run_id, "completed")
    await assert_eventually(lambda: _sandbox_gone(cluster, rec.sandbox_key))
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await cluster.stub(cluster.hosts[0]).AttachRun(sandbox_host_pb2.AttachRunRequest(run_id=rec.run_id), timeout=5)
    exc = from_rpc_error(ei.value)
    assert isinstance(exc, JournalAttachUnavailable) and exc.reason == "terminal-run"


async def _sandbox_gone(cluster: Cluster, key: str) -> bool:
    return await cluster.cc.get_sandbox(key) is None


NONCE = "0123456789abcdef0123456789abcdef"


async def test_journal_that_appears_late_is_waited_for(cluster: Cluster) -> None:
    key = unique("sbx-")
    rec = await _seed_record(cluster, SHORT, sandbox_key=key, fmt="codex-exec-json")
    _, journal = await _register_bare_sandbox_with_key(cluster, rec.run_id, key)
    resp = await cluster.stub(cluster.hosts[0]).AttachRun(sandbox_host_pb2.AttachRunRequest(run_id=rec.run_id),
                                                          timeout=10, wait_for_ready=True)
    assert resp.epoch == 1
    reader = asyncio.create_task(cluster.read_all(rec.run_id))
    await _wait_log(cluster.hosts[0], f"run {rec.run_id}: waiting up to")  # the preflight waits
    assert not reader.done()
    body = (CORPUS / SHORT).read_bytes() + json.dumps({"__exit": 0, "__nonce": NONCE}).encode() + b"\n"
    tmp = journal.with_suffix(".tmp")
    tmp.write_bytes(body)
    os.replace(tmp, journal)
    chunks = [c for _, c in await reader]
    assert chunks == translate_bytes("codex-exec-json", (CORPUS / SHORT).read_bytes(), rec.run_id, rec.thread_id)
    await cluster.wait_status(rec.run_id, "completed")


async def _register_bare_sandbox_with_key(cluster: Cluster, run_id: str, key: str) -> tuple[str, pathlib.Path]:
    journal = cluster.tmp / "journals" / f"{key}.ndjson"
    journal.parent.mkdir(parents=True, exist_ok=True)
    # The sandbox's directory, as the local provider's create leaves it (its daemon keeps its
    # state in .baton/); the agent is "launched" by the test writing the journal.
    (cluster.tmp / "sandboxes" / key / ".baton").mkdir(parents=True)
    (cluster.tmp / "sandboxes" / key / "workspace").mkdir()
    handle = {"provider": "local", "key": key, "journal_path": str(journal), "stderr_path": f"{journal}.err",
              "workdir": str(cluster.tmp / "sandboxes" / key / "workspace"),
              "data": {"dir": str(cluster.tmp / "sandboxes" / key), "pgid": None, "launched": True},
              "nonce": NONCE}
    await cluster.cc.put_sandbox(coordinator_pb2.SandboxInstance(
        sandbox_key=key, provider="local", handle_json=json.dumps(handle), run_id=run_id, journal_path=str(journal)))
    return key, journal


async def test_journal_that_never_appears_is_journal_timeout(cluster: Cluster) -> None:
    key = unique("sbx-")
    rec = await _seed_record(cluster, SHORT, sandbox_key=key, fmt="codex-exec-json")
    await _register_bare_sandbox_with_key(cluster, rec.run_id, key)
    await cluster.stub(cluster.hosts[1]).AttachRun(sandbox_host_pb2.AttachRunRequest(run_id=rec.run_id),
                                                   timeout=10, wait_for_ready=True)
    chunks = [c for _, c in await cluster.read_all(rec.run_id)]
    assert chunks == [{"type": "RUN_ERROR", "message": "cannot attach: journal-timeout", "code": "journal_timeout"}]
    done = await cluster.wait_status(rec.run_id, "failed")
    assert done.error.code == "journal_timeout"


async def test_journal_rewritten_under_a_detached_run_fails_loudly(cluster: Cluster) -> None:
    a = cluster.hosts[0]
    started = await cluster.start_run(a, LONG, delay=0.05)  # the kill must land before the agent's end, with the reader behind on a loaded machine
    run_id, thread_id = started.record.run_id, started.record.thread_id
    original = (CORPUS / LONG).read_bytes()
    lines = original.split(b"\n")
    at = next(i for i, line in enumerate(lines) if b"text_delta" in line)
    lines[at] = lines[at].replace(b"I'll test conversation", b"I will test a conversation")
    tampered = b"\n".join(lines)
    want = translate_bytes("claude-stream-json", original, run_id, thread_id)
    replay = translate_bytes("claude-stream-json", tampered, run_id, thread_id)
    n = next(i for i, (x, y) in enumerate(zip(want, replay)) if x != y)
    got: list[dict[str, Any]] = []
    async with cluster.log.read(run_id) as reader:
        async for _, chunk in reader:
            got.append(chunk)
            if len(got) == n + 20:
                # The host dies and its agent is stopped; someone rewrites the journal
                # before the successor replays it.
                rec = await cluster.record(run_id)
                inst = await cluster.cc.get_sandbox(rec.sandbox_key)
                assert inst is not None
                os.killpg(json.loads(inst.handle_json)["data"]["pgid"], signal.SIGKILL)
                a.kill_now()
                pathlib.Path(inst.journal_path).write_bytes(tampered)
    restart = asyncio.create_task(a.start())
    msg = f"journal replay diverged at index {n}"
    assert got[-1] == {"type": "RUN_ERROR", "message": msg, "code": "journal_replay_diverged"}
    assert sum(1 for c in got if c["type"] == "RUN_ERROR") == 1
    assert got[1]["name"] == "run.accepted"
    assert [got[0], *got[2:-1]] == want[: len(got) - 2]  # the stored prefix stays, nothing doubled
    rec = await cluster.wait_status(run_id, "failed")
    assert rec.error.message == msg and rec.error.code == "journal_replay_diverged" and rec.driver_epoch == 2
    await restart
