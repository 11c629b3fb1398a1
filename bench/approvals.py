"""Answer latency of a tool approval (docs/hitl.md), side by side with its floor.

One etcd, one nats-server, a coordinator and one sandbox host (the stand-in ``claude`` on its
``PATH``). A ``claude-code`` run with ``approvals: true`` runs ``ASKS`` Bash commands, each of
which asks; a reader follows the run's delivery log. For every ask, the bench answers as a
gateway does (one ``PutRunInput ANSWER`` to the coordinator) and measures, from the moment
the answer is sent:

(a) answer → ``approval_answer`` chunk at the reader: the record write, the host's
    ``WatchRun`` event, the inbox append, the wrapper's relay (GNU ``tail -f``, woken by
    inotify on the append; its 0.2 s ``-s`` only paces the ``--pid`` check), the
    ``baton_input`` journal line, the translator, the log append, the reader;
(b) answer → the command's ``TOOL_CALL_RESULT`` at the reader (the agent ran it).

Floor, measured in the same process between the samples (so load drifts hit both alike):
what the path cannot beat without dropping a hop: a record write through the coordinator
seen by a ``WatchRun`` client (etcd put → watch), plus a JetStream publish → a subscriber's
delivery on the run's subject (the log hop). The ratio (a) / floor is the figure (target:
p50 within 3x).

Writes ``bench/results/approvals.json``. ``python -m bench.approvals [asks]``.
"""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "approvals.json"
REPO = pathlib.Path(__file__).resolve().parent.parent
ASKS = 20
#: Target: (a) p50 within this many times the floor's p50.
TARGET_RATIO = 3.0


def _pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def _stats(xs: list[float]) -> dict[str, float]:
    return {"p50": statistics.median(xs), "p99": _pct(xs, 99), "max": max(xs), "n": len(xs)}


async def _floor_sample(cc: Any, nc: Any, run_id: str, subject: str, n: int) -> tuple[float, float]:
    """One record write → WatchRun event, and one NATS publish → delivery (seconds)."""
    from baton.v1.coordinator_pb2 import PutRunInputRequest
    from baton.v1.runs_pb2 import RunInput

    seen = asyncio.Event()

    async def watch() -> None:
        async for ev in cc.watch_run(run_id):
            if ev.record is not None and any(i.id == f"f{n}" for i in ev.record.inputs):
                seen.set()
                return

    w = asyncio.create_task(watch())
    await asyncio.sleep(0.05)  # the watch is open (its first event is the record as it is)
    t0 = time.monotonic()
    await cc.put_run_input(run_id, PutRunInputRequest.STEER, RunInput(id=f"f{n}", message="floor"))
    await asyncio.wait_for(seen.wait(), 10)
    store = time.monotonic() - t0
    w.cancel()
    await asyncio.gather(w, return_exceptions=True)

    got = asyncio.Event()

    async def on_msg(_msg: Any) -> None:
        got.set()

    sub = await nc.subscribe(subject, cb=on_msg)
    t1 = time.monotonic()
    await nc.publish(subject, b'{"type":"CUSTOM"}')
    await nc.flush()
    await asyncio.wait_for(got.wait(), 10)
    log_hop = time.monotonic() - t1
    await sub.unsubscribe()
    return store, log_hop


async def measure(asks: int = ASKS) -> dict[str, Any]:
    from baton.coordinator_client import CoordinatorClient
    from baton.log import DeliveryLog, LogConfig
    from baton.v1 import runs_pb2, sandbox_host_pb2, sandbox_host_pb2_grpc
    from baton.v1.coordinator_pb2 import PutRunInputRequest
    from baton.v1.runs_pb2 import RunInput, RunRecord
    from baton_tools.standins import STANDINS_DIR
    from baton_tools.testing.cluster import start_coordinator, start_host
    from baton_tools.testing.servers import EtcdServer, NatsServer
    import grpc

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-approvals-"))
    etcd, nats = EtcdServer(tmp / "etcd"), NatsServer(tmp / "nats")
    etcd.start()
    nats.start()
    tag = f"b{uuid.uuid4().hex[:8]}"
    env = {"BATON_RUNS_STREAM": f"RUNS_{tag}", "BATON_SUBJECT_PREFIX": f"baton.{tag}",
           "BATON_THREADS_BUCKET": f"threads-{tag}", "BATON_JOURNAL_DIR": str(tmp / "journals"),
           "BATON_SANDBOX_DIR": str(tmp / "sandboxes"), "BATON_SESSION_TTL": "5", "BATON_LOG_LEVEL": "WARNING",
           "BATON_WORKSPACE_OBJECTS": f"ws-objects-{tag}", "BATON_WORKSPACE_HEADS": f"ws-heads-{tag}"}
    old_path = os.environ["PATH"]
    os.environ["PATH"] = f"{STANDINS_DIR}:{old_path}"
    os.environ.setdefault("ANTHROPIC_API_KEY", "bench-key")
    coord = host = None
    try:
        coord = await start_coordinator(etcd.endpoint, f"/{tag}/", log_dir=tmp / "logs", BATON_REAPER_INTERVAL="0")
        host = await start_host(coord.address, nats.url, host_id="bench-host", log_dir=tmp / "logs", **env)
        async with CoordinatorClient(coord.address) as cc:
            dlog = await DeliveryLog.connect(nats.url, LogConfig.from_env(env))
            await dlog.provision()
            floor_run = f"floor-{uuid.uuid4().hex[:8]}"
            await cc.create_or_resume_run(RunRecord(run_id=floor_run, thread_id=f"t-{floor_run}"))
            run_id = f"run-{uuid.uuid4().hex[:10]}"
            prompt = "\n".join(f"run echo {n}" for n in range(asks))
            ch = grpc.aio.insecure_channel(host.address, options=[("grpc.enable_http_proxy", 0)])
            await sandbox_host_pb2_grpc.SandboxHostStub(ch).StartRun(sandbox_host_pb2.StartRunRequest(
                run_id=run_id, thread_id=f"thr-{run_id}",
                agent=runs_pb2.AgentSpec(kind="claude-code", options_json=json.dumps({"approvals": True})),
                messages_json=json.dumps([{"id": "u1", "role": "user", "content": prompt}])),
                timeout=30, wait_for_ready=True)
            answered: list[float] = []
            ran: list[float] = []
            floor_store: list[float] = []
            floor_log: list[float] = []
            sent: dict[str, float] = {}
            asks_seen: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
            results_for: dict[str, str] = {}

            async def read() -> None:
                async with dlog.read(run_id) as r:
                    async for _off, chunk in r:
                        now = time.monotonic()
                        if chunk.get("type") == "CUSTOM" and chunk.get("name") == "approval-requested":
                            v = chunk["value"]
                            results_for[v["toolCallId"]] = v["approval"]["id"]
                            await asks_seen.put((v["approval"]["id"], v["toolCallId"]))
                        elif chunk.get("type") == "ACTIVITY_SNAPSHOT" and chunk.get("activityType") == "approval_answer":
                            aid = chunk["content"]["approvalId"]
                            if aid in sent:
                                answered.append(now - sent[aid])
                        elif chunk.get("type") == "TOOL_CALL_RESULT":
                            aid = results_for.get(chunk.get("toolCallId", ""), "")
                            if aid in sent:
                                ran.append(now - sent[aid])

            reader = asyncio.create_task(read())
            for n in range(asks):
                aid, _tool = await asyncio.wait_for(asks_seen.get(), 60)
                s, lg = await _floor_sample(cc, dlog.nc, floor_run, f"bench.floor.{tag}", n)
                floor_store.append(s)
                floor_log.append(lg)
                await asyncio.sleep(0.05)
                sent[aid] = time.monotonic()
                await cc.put_run_input(run_id, PutRunInputRequest.ANSWER,
                                       RunInput(id=aid, decision="allow", answered_by="user", answered_at=time.time()))
            await asyncio.wait_for(reader, 120)
            await ch.close()
            await dlog.close()
    finally:
        os.environ["PATH"] = old_path
        if host is not None:
            await host.stop()
        if coord is not None:
            await coord.stop()
        nats.kill()
        etcd.kill()
    floors = [a + b for a, b in zip(floor_store, floor_log)]
    a, b, f = _stats(answered), _stats(ran), _stats(floors)
    return {
        "asks": asks,
        "a_answer_to_answer_chunk_s": a,
        "b_answer_to_tool_result_s": b,
        "floor_store_watch_plus_log_hop_s": f,
        "floor_parts_p50_s": {"store_watch": statistics.median(floor_store), "log_hop": statistics.median(floor_log)},
        "ratio_a_p50_to_floor_p50": a["p50"] / f["p50"],
        "target_ratio": TARGET_RATIO,
        "target_met": a["p50"] / f["p50"] <= TARGET_RATIO,
        "machine_load_1m_after": os.getloadavg()[0],
    }


def _print(r: dict[str, Any]) -> None:
    rows = [("(a) answer → approval_answer chunk", r["a_answer_to_answer_chunk_s"]),
            ("(b) answer → the command's result", r["b_answer_to_tool_result_s"]),
            ("floor: store→watch + log hop", r["floor_store_watch_plus_log_hop_s"])]
    print(f"{'figure':40} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'n':>4}")
    for name, s in rows:
        print(f"{name:40} {s['p50'] * 1000:8.1f} {s['p99'] * 1000:8.1f} {s['max'] * 1000:8.1f} {s['n']:4d}")
    print(f"ratio (a) p50 / floor p50: {r['ratio_a_p50_to_floor_p50']:.1f}x "
          f"(target <= {r['target_ratio']:g}x: {'met' if r['target_met'] else 'NOT met'})")


async def main(asks: int = ASKS) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    os.environ.pop("http_proxy", None)
    os.environ.pop("https_proxy", None)
    r = await measure(asks)
    _print(r)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(r, indent=2, sort_keys=True) + "\n")
    return r


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else ASKS))
