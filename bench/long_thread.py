"""A 500-turn thread: what opening it costs, paged against not paged, in one run.

A real gateway, coordinator, etcd and NATS; the thread is written straight into them (no
host: 500 finished runs, each a record, a log of ``RUN_STARTED``, ``run.accepted`` with the
turn's user message, one text message of ``WORDS`` words in ``DELTAS`` deltas,
``RUN_FINISHED``, and the saved transcript of the 1,000 messages). The run input holds the
turn's prompt only (a TanStack client sends the whole conversation, which would make the
logs grow with the thread, not change what is compared here).

Figures, each the median of ``ROUNDS`` rounds with the paths interleaved (noise hits all):

* ``hydrate``: the TanStack hydration ``GET /api/chat?threadId`` whole, and paged
  (``&limit=PAGE``, what ``ChatClient({history: {pageSize}})`` asks first): time to the
  whole answer and its bytes. ``hydrate_paged_cold`` is the thread's first hydration (one
  sample), which reads every run's log; the rounds after it are answered from the gateway's
  fold of the thread (kept until another run of it finishes).
* ``transcript``: ``GET /api/threads/{id}/messages`` whole and paged (``?limit=PAGE``).
* ``page_logs``: the chat page's own first paint needs the run listing and each shown run's
  log; this reads the listing and then the logs of every run (unpaged page) or of the newest
  ``PAGE_RUNS`` runs (paged page), one after the other over HTTP as the page does. A stand-in for the page's
  first paint measured in a browser: no Chromium is used here.

Paged vs whole is a ratio of the same build side by side. The hydration folds every finished
run's log of the thread whatever the page size (docs/api.md), so paging it cuts the bytes
sent, not the cold time to read. Writes ``bench/results/long_thread.json``.
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
from typing import Any, Awaitable, Callable

REPO = pathlib.Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "long_thread.json"
TURNS = 500
WORDS, DELTAS = 60, 12
PAGE = 20  # hydration / transcript page (messages)
PAGE_RUNS = 10  # runs the paged page shows first (= PAGE messages)
ROUNDS = 3


def _run(thread: str, run_id: str, turn: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A turn's log chunks and its two transcript messages."""
    prompt = {"id": f"{run_id}-u", "role": "user", "content": f"question {turn}: what next?"}
    mid = f"{run_id}-m"
    words = [f"word{(turn * 7 + i) % 97} " for i in range(WORDS)]
    per = WORDS // DELTAS
    deltas = ["".join(words[i:i + per]) for i in range(0, WORDS, per)]
    chunks: list[dict[str, Any]] = [
        {"type": "RUN_STARTED", "threadId": thread, "runId": run_id},
        {"type": "CUSTOM", "name": "run.accepted", "value": {"runId": run_id, "threadId": thread, "messages": [prompt]}},
        {"type": "TEXT_MESSAGE_START", "messageId": mid, "role": "assistant"},
        *({"type": "TEXT_MESSAGE_CONTENT", "messageId": mid, "delta": d} for d in deltas),
        {"type": "TEXT_MESSAGE_END", "messageId": mid},
        {"type": "RUN_FINISHED", "threadId": thread, "runId": run_id}]
    return chunks, [prompt, {"id": mid, "role": "assistant", "content": "".join(deltas)}]


async def _timed(fn: Callable[[], Awaitable[int]]) -> tuple[float, int]:
    t = time.perf_counter()
    n = await fn()
    return time.perf_counter() - t, n


async def measure(turns: int = TURNS, rounds: int = ROUNDS) -> dict[str, Any]:
    import httpx

    from baton.coordinator_client import CoordinatorClient
    from baton.log import DeliveryLog, LogConfig, TranscriptStore
    from baton.v1.runs_pb2 import RunRecord, RunStatus
    from baton_tools.testing.cluster import start_coordinator, start_gateway
    from baton_tools.testing.servers import EtcdServer, NatsServer

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-long-thread-"))
    etcd, nats = EtcdServer(tmp / "etcd"), NatsServer(tmp / "nats")
    etcd.start()
    nats.start()
    tag = f"b{uuid.uuid4().hex[:8]}"
    cfg = LogConfig(stream=f"RUNS_{tag}", subject_prefix=f"baton.{tag}", bucket=f"threads-{tag}")
    log_env: dict[str, Any] = {"BATON_RUNS_STREAM": cfg.stream, "BATON_SUBJECT_PREFIX": cfg.subject_prefix,
               "BATON_THREADS_BUCKET": cfg.bucket}
    coord = gw = None
    samples: dict[str, list[tuple[float, int]]] = {}
    try:
        coord = await start_coordinator(etcd.endpoint, f"/{tag}/", log_dir=tmp / "logs", BATON_REAPER_INTERVAL="0")
        gw = await start_gateway(coord.address, nats.url, log_dir=tmp / "logs", log_level="WARNING", **log_env)
        dlog = await DeliveryLog.connect(nats.url, cfg)
        await dlog.provision()
        thread = f"long-{tag}"
        run_ids = [f"{thread}-r{i:04d}" for i in range(turns)]
        transcript: list[dict[str, Any]] = []
        t_seed = time.perf_counter()
        async with CoordinatorClient(coord.address) as cc:
            for i, rid in enumerate(run_ids):
                await cc.create_or_resume_run(RunRecord(run_id=rid, thread_id=thread, started_at=1_000_000.0 + i))
                chunks, msgs = _run(thread, rid, i)
                w = dlog.writer(rid, 1)
                await w.fence()
                await w.append(chunks, origin="journal")
                await w.close("completed")
                await cc.update_run(rid, RunRecord(status=RunStatus.RUN_STATUS_COMPLETED, finished_at=1_000_000.5 + i),
                                    ["status", "finished_at"])
                transcript += msgs
        await TranscriptStore(dlog.nc, cfg).save(thread, transcript)
        seed_s = time.perf_counter() - t_seed
        await dlog.close()

        async with httpx.AsyncClient(base_url=gw.url, trust_env=False, timeout=300) as http:
            async def get(path: str, **params: Any) -> int:
                r = await http.get(path, params=params)
                r.raise_for_status()
                return len(r.content)

            async def page_logs(newest: int | None) -> int:
                listing = (await http.get(f"/api/threads/{thread}/runs")).json()["runs"]
                shown = listing[-newest:] if newest else listing
                # One after the other, as the page reads them (gateway/static/js/chat.js).
                return sum([await get("/api/chat", runId=r["runId"], offset="-1") for r in shown])

            paths: dict[str, Callable[[], Awaitable[int]]] = {
                "hydrate_whole": lambda: get("/api/chat", threadId=thread),
                "hydrate_paged": lambda: get("/api/chat", threadId=thread, limit=PAGE),
                "transcript_whole": lambda: get(f"/api/threads/{thread}/messages"),
                "transcript_paged": lambda: get(f"/api/threads/{thread}/messages", limit=PAGE),
                "page_logs_whole": lambda: page_logs(None),
                "page_logs_paged": lambda: page_logs(PAGE_RUNS),
            }
            # The first hydration reads every log (cold); the gateway then keeps the fold.
            cold = await _timed(paths["hydrate_paged"])
            for name, fn in paths.items():  # warm-up (imports, caches), not counted
                await fn()
            names = list(paths)
            for r in range(rounds):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    samples.setdefault(name, []).append(await _timed(paths[name]))
            hydrated = (await http.get("/api/chat", params={"threadId": thread})).json()
    finally:
        for h in (gw, coord):
            if h is not None:
                await h.stop()
        nats.kill()
        etcd.kill()

    figures: dict[str, dict[str, Any]] = {name: {"median_s": statistics.median(t for t, _ in xs), "bytes": xs[-1][1],
                      "rounds_s": [round(t, 4) for t, _ in xs]} for name, xs in samples.items()}
    ratios = {}
    for what in ("hydrate", "transcript", "page_logs"):
        whole, paged = figures[f"{what}_whole"], figures[f"{what}_paged"]
        ratios[what] = {"bytes_whole_over_paged": whole["bytes"] / paged["bytes"],
                        "time_whole_over_paged": whole["median_s"] / paged["median_s"]}
    figures["hydrate_paged_cold"] = {"median_s": cold[0], "bytes": cold[1], "rounds_s": [round(cold[0], 4)]}
    return {"bench": "long_thread", "turns": turns, "page_messages": PAGE, "page_runs": PAGE_RUNS,
            "rounds": rounds, "seed_s": seed_s, "hydrated_messages": len(hydrated["messages"]),
            "figures": figures, "ratios": ratios, "machine_load_1m_after": os.getloadavg()[0]}


def _print(r: dict[str, Any]) -> None:
    print(f"{r['turns']} turns, {r['hydrated_messages']} messages; page {r['page_messages']} messages "
          f"/ {r['page_runs']} runs; median of {r['rounds']} rounds")
    print(f"{'figure':20} {'median ms':>10} {'bytes':>10}")
    for name, f in r["figures"].items():
        print(f"{name:20} {f['median_s'] * 1000:10.1f} {f['bytes']:10d}")
    for what, x in r["ratios"].items():
        print(f"{what:20} whole/paged: bytes {x['bytes_whole_over_paged']:.1f}x, time {x['time_whole_over_paged']:.1f}x")


async def main(turns: int = TURNS, rounds: int = ROUNDS) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        os.environ.pop(k, None)
    r = await measure(turns, rounds)
    _print(r)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(r, indent=2, sort_keys=True) + "\n")
    return r


if __name__ == "__main__":
    argv = [int(a) for a in sys.argv[1:3]]
    asyncio.run(main(*argv))
