"""A burst of concurrent starts: do busy hosts keep their sessions, and does every start get
a clear answer? (docs/operating.md "Overload").

Each side is a whole cluster of real processes on this machine: etcd and nats-server, one
coordinator, ``hosts`` sandbox hosts with the shipped defaults (``BATON_SESSION_TTL`` 2 s,
``BATON_HOST_CAPACITY`` 64) and one gateway. ``runs`` ``POST /api/chat`` are sent **at
once**, each with its SSE reader (a raw socket in this process; the replay agent plays a
recorded journal at a real agent's pace for ``SECONDS``).

Figures per side:
- ``accepted`` / ``refused`` (by the error reason of the answer);
- ``takeovers``: accepted runs whose record's epoch went past 1. No host dies here, so every
  takeover is one the load caused (target 0); ``session_losses``: "session … lost" lines in
  the hosts' logs;
- ``first_chunk_s`` p50/p99: ``POST`` → the first chunk at its reader;
- exactly once: ``completed`` (the reader got the run's end), ``duplicates`` /
  ``out_of_order`` (log offsets a reader got twice / below one it had), and ``refused_left``:
  refused starts that nevertheless left a run record; ``refused_left_untold`` of those, the
  ones whose refusal did not say ``runExists: true`` (target 0: the client was told nothing
  of a run that exists), with each left record's status in ``refused_left_runs``.

Sides: 200 starts on 2 hosts, 500 on 3 (``BENCH_OVERLOAD_SIDES=200x2`` to run one).
Writes ``bench/results/overload.json``.
"""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
import platform
import re
import signal
import statistics
import tempfile
import time
import uuid
from typing import Any

import httpx

from baton.retry import Deadline
from bench.scale_runs import CORPUS, Reader, StageOverrun, _stage

REPO = pathlib.Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "overload.json"
JOURNAL = "claude-stream-json/subagents-parallel-tools-v2.0.25.jsonl"
SECONDS = float(os.environ.get("BENCH_OVERLOAD_SECONDS", "10"))
SIDES = {"200x2": (200, 2), "500x3": (500, 3), "4x2": (4, 2)}
SIDE_BUDGET = 600.0
_LOST = re.compile(rb"session [0-9a-f]+ lost")


def _pct(xs: list[float], q: float) -> float | None:
    return round(xs[min(len(xs) - 1, int(len(xs) * q))], 2) if xs else None


async def side(label: str, runs: int, n_hosts: int, tmp: pathlib.Path) -> dict[str, Any]:
    """One cluster, ``runs`` concurrent starts; its figures."""
    from baton_tools.reference import speed_for
    from baton_tools.testing.cluster import start_coordinator, start_gateway, start_host
    from baton_tools.testing.servers import EtcdServer, NatsServer

    deadline = Deadline.after(SIDE_BUDGET)
    tag = f"o{uuid.uuid4().hex[:6]}"
    etcd, nats_ = EtcdServer(tmp / "etcd"), NatsServer(tmp / "nats")
    await _stage(deadline, "etcd start", asyncio.to_thread(etcd.start))
    await _stage(deadline, "nats start", asyncio.to_thread(nats_.start))
    env: dict[str, Any] = {"BATON_RUNS_STREAM": f"RUNS_{tag}", "BATON_SUBJECT_PREFIX": f"baton.{tag}",
                           "BATON_THREADS_BUCKET": f"threads-{tag}", "BATON_REPLAY_DIRS": str(CORPUS),
                           "BATON_JOURNAL_DIR": str(tmp / "journals"), "BATON_SANDBOX_DIR": str(tmp / "sandboxes"),
                           "BATON_LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "WARNING"),
                           **{k: v for k, v in os.environ.items() if k.startswith("BATON_START_")}}
    coordinator: Any = None
    hosts: list[Any] = []
    gateway: Any = None
    logs = tmp / "logs"
    try:
        coordinator = await _stage(deadline, "coordinator start", start_coordinator(
            etcd.endpoint, f"/{tag}/", log_dir=logs, detached_run_ttl=3600, BATON_LOG_LEVEL=env["BATON_LOG_LEVEL"]))
        for i in range(n_hosts):
            hosts.append(await _stage(deadline, f"host {i} start", start_host(
                coordinator.address, nats_.url, host_id=f"{tag}-h{i}", log_dir=logs, **env)))
        gateway = await _stage(deadline, "gateway start", start_gateway(coordinator.address, nats_.url,
                                                                        log_dir=logs, **env))
        port = int(gateway.url.rsplit(":", 1)[1])
        speed = speed_for(CORPUS / JOURNAL, SECONDS)
        readers = []
        for i in range(runs):
            run_id = f"{tag}-r{i}"
            body = json.dumps({"threadId": f"{run_id}-t", "runId": run_id,
                               "messages": [{"id": f"{run_id}-u", "role": "user", "content": "bench"}],
                               "agent": {"kind": "replay", "journal": JOURNAL, "speed": speed}}).encode()
            readers.append(Reader(port, run_id, body, 0.0))
        t0 = time.time()
        tasks = [asyncio.create_task(r.run()) for r in readers]
        _, late = await asyncio.wait(tasks, timeout=max(1.0, deadline.left() - 120))
        for t in late:
            t.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        reader_errors: dict[str, int] = {}
        for o in outcomes:
            if isinstance(o, BaseException) and not isinstance(o, asyncio.CancelledError):
                reader_errors[type(o).__name__] = reader_errors.get(type(o).__name__, 0) + 1
        accepted = [r for r in readers if 0 < r.status < 400]
        refused_rs = [r for r in readers if r.status >= 400]
        refused: dict[str, int] = {}
        for r in refused_rs:
            refused[r.reason or str(r.status)] = refused.get(r.reason or str(r.status), 0) + 1
        # What the records say once it is over: epochs (takeovers) and leftovers of refusals.
        epochs: list[int] = []
        refused_left = 0
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30, trust_env=False) as http:
            sem = asyncio.Semaphore(16)

            async def view(run_id: str) -> dict[str, Any] | None:
                async with sem:
                    got = await http.get(f"/api/runs/{run_id}")
                return dict(got.json()) if got.status_code == 200 else None

            views = await asyncio.gather(*(view(r.run_id) for r in readers))
        left: list[dict[str, Any]] = []  # the refused starts' records (what a client would find)
        for r, v in zip(readers, views):
            if r in refused_rs and v is not None:
                refused_left += 1
                left.append({"run_id": r.run_id, "reason": r.reason, "run_exists": r.run_exists,
                             "status": v.get("status"), "epoch": v.get("epoch")})
            elif v is not None and r in accepted:
                epochs.append(int(v.get("epoch") or 0))
        firsts = sorted(min(r.arrivals.values()) - r.posted for r in accepted if r.arrivals and r.posted)
        ends = [r for r in accepted if r.ended is not None]
        lost = 0
        for f in logs.glob(f"{tag}-h*.log"):
            lost += len(_LOST.findall(f.read_bytes()))
        return {
            "side": label, "runs": runs, "hosts": n_hosts,
            "accepted": len(accepted), "refused": len(refused_rs), "refused_by_reason": refused,
            "refused_left": refused_left,
            # Of those, the ones whose refusal said ``runExists: false`` or nothing: a client
            # told nothing of a run that exists (target 0; ``true`` is the contract's answer).
            "refused_left_untold": sum(1 for x in left if x["run_exists"] is not True),
            "refused_left_runs": left,
            "takeovers": sum(1 for ep in epochs if ep > 1), "max_epoch": max(epochs) if epochs else None,
            "session_losses": lost,
            "completed": len(ends) - sum(1 for r in ends if r.failed),
            "ended_failed": sum(1 for r in ends if r.failed),
            "unfinished": len(late), "reader_errors": reader_errors,
            "duplicates": sum(r.duplicates for r in readers), "out_of_order": sum(r.out_of_order for r in readers),
            "first_chunk_s": {"p50": round(statistics.median(firsts), 2) if firsts else None,
                              "p99": _pct(firsts, 0.99)},
            "wall_s": round(time.time() - t0, 1),
        }
    finally:
        if gateway is not None:
            await gateway.stop(timeout=10)
        await asyncio.gather(*(h.stop(timeout=10) for h in hosts), return_exceptions=True)
        if coordinator is not None:
            await coordinator.stop(timeout=10)
        await asyncio.to_thread(nats_.kill)
        await asyncio.to_thread(etcd.kill)


async def main() -> dict[str, Any]:
    """Each side in turn; prints a table, writes the results."""
    me = asyncio.current_task()
    assert me is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, me.cancel)
    wanted = os.environ.get("BENCH_OVERLOAD_SIDES", ",".join(SIDES)).split(",")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-overload-") as d:
        for label in wanted:
            runs, n_hosts = SIDES[label]
            try:
                rows.append(await side(label, runs, n_hosts, pathlib.Path(d) / label))
            except (StageOverrun, RuntimeError, TimeoutError, OSError) as exc:
                rows.append({"side": label, "runs": runs, "hosts": n_hosts, "error": f"{type(exc).__name__}: {exc}"[:2000]})
            print(json.dumps(rows[-1]), flush=True)
    print(f"{'side':<7} {'accepted':>8} {'refused':>7} {'takeovers':>9} {'lost':>4} {'done':>5} "
          f"{'1st p50 s':>9} {'1st p99 s':>9} {'dup':>4}")
    for r in rows:
        if "error" in r:
            print(f"{r['side']:<7} ERROR {r['error'][:200]}")
            continue
        f = r["first_chunk_s"]
        print(f"{r['side']:<7} {r['accepted']:>8} {r['refused']:>7} {r['takeovers']:>9} {r['session_losses']:>4} "
              f"{r['completed']:>5} {f['p50']!s:>9} {f['p99']!s:>9} {r['duplicates']:>4}"
              + (f"  refused {r['refused_by_reason']}" if r["refused_by_reason"] else "")
              + f"  left behind a refusal {r['refused_left']} (untold {r['refused_left_untold']})")
    out = {"bench": "overload", "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
           "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "journal": JOURNAL,
           "seconds_per_run": SECONDS, "rows": rows}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    asyncio.run(main())
