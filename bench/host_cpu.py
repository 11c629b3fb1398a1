"""CPU per streamed chunk of sandbox hosts and their sandbox daemons, in steady state.

Each side is one cluster (a coordinator and one sandbox host, sharing one etcd and one
nats-server with the other sides) driving ``RUNS`` runs of the replay agent at once (a
recorded Claude Code journal, ``DELAY`` s a line, each run with a reader). From the moment
every run streams (each reader saw its first chunks: the daemons' and agents' start-up left
out) to the end of the last run, the CPU seconds the side's host, its sandbox daemons and its
coordinator used, divided by the chunks the readers got: µs per chunk, per process group.

Sides, their rounds interleaved (a load drift hits every side alike):

* ``this``: this checkout, the host on its default loop (uvloop);
* ``this-asyncio``: this checkout, the host on asyncio's loop (``BATON_EVENT_LOOP=asyncio``);
* ``base``: with ``BATON_BENCH_BEFORE=<dir>`` (a checkout of another revision, e.g. ``git
  archive <rev> | tar -x -C <dir>``), that revision's coordinator and host.

The figure a side is judged by is ``host_and_daemons`` (the work on a run's chain that
scales with its chunks); ``this`` against ``base``: lower is better. On a 2-core machine a
takeover is CPU-bound (bench/results/README.md, "Takeover"), so this per-chunk cost is also
what a successor's catch-up and every other run on its host pay.

Writes ``bench/results/host_cpu.json``. ``BENCH_HOST_CPU_ROUNDS`` rounds (default 4).
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
from typing import Any

from bench._cpu import processes
from bench.takeover import Side, _drive

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "host_cpu.json"
REPO = pathlib.Path(__file__).resolve().parent.parent
RUNS = 10
DELAY = 0.01  # seconds per journal line


def _snapshot(side: Side) -> dict[int, tuple[str, float]]:
    """pid → (group, CPU seconds so far) of the side's host, coordinator and sandbox daemons
    (a daemon is the side's when its command line names the side's directory: the other
    sides' idle daemons, which poll until they exit, are not counted)."""
    host, coordinator = side.hosts[0].pid, getattr(side.coordinator.proc, "pid", None)
    out: dict[int, tuple[str, float]] = {}
    for pid, _parent, cpu, argv in processes():
        if pid == host:
            out[pid] = ("hosts", cpu)
        elif pid == coordinator:
            out[pid] = ("coordinators", cpu)
        elif "sandbox_host.daemon" in argv and str(side.tmp) in argv:
            out[pid] = ("daemons", cpu)
    return out


def _used(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per group between two snapshots (a process born between them counts
    whole; one that ended between them is left out)."""
    out = {"hosts": 0.0, "daemons": 0.0, "coordinators": 0.0}
    for pid, (group, cpu) in after.items():
        out[group] += cpu - (before[pid][1] if pid in before else 0.0)
    return out


async def _round(side: Side) -> dict[str, float]:
    run_ids, arrivals, readers = await _drive(side, side.hosts[0], RUNS, DELAY)
    t0, before, seen = time.monotonic(), _snapshot(side), sum(len(a) for a in arrivals.values())
    async with asyncio.timeout(300):
        await asyncio.gather(*readers)
    used = _used(before, _snapshot(side))
    chunks = sum(len(a) for a in arrivals.values()) - seen
    out = {g: s * 1e6 / chunks for g, s in used.items()}
    out["host_and_daemons"] = out["hosts"] + out["daemons"]
    out["chunks"], out["seconds"] = chunks, time.monotonic() - t0
    return out


async def main() -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    os.environ.pop("http_proxy", None)
    os.environ.pop("https_proxy", None)
    from baton_tools.testing.servers import EtcdServer, NatsServer

    rounds = int(os.environ.get("BENCH_HOST_CPU_ROUNDS", "4"))
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-host-cpu-"))
    etcd, nats = EtcdServer(tmp / "etcd"), NatsServer(tmp / "nats")
    sides = [Side("this", 0.0, tmp / "this", n_hosts=1, ttl=5.0),
             Side("this-asyncio", 0.0, tmp / "asyncio", n_hosts=1, ttl=5.0, host_env={"BATON_EVENT_LOOP": "asyncio"})]
    before = os.environ.get("BATON_BENCH_BEFORE")
    if before:
        sides.append(Side("base", 0.0, tmp / "base", n_hosts=1, ttl=5.0, repo=pathlib.Path(before)))
    per_round: dict[str, list[dict[str, float]]] = {s.name: [] for s in sides}
    etcd.start()
    nats.start()
    try:
        for s in sides:
            await s.start(etcd, nats)
        for i in range(rounds):
            for s in sides[i % len(sides):] + sides[:i % len(sides)]:  # the order rotated round by round
                got = await _round(s)
                per_round[s.name].append(got)
                print(f"  round {i + 1} {s.name}: " + ", ".join(f"{k} {v:.0f}" for k, v in got.items()), flush=True)
    finally:
        for s in sides:
            await s.close()
        nats.kill()
        etcd.kill()
    medians = {name: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for name, rs in per_round.items()}
    r: dict[str, Any] = {"runs": RUNS, "line_delay_s": DELAY, "rounds": rounds, "us_per_chunk": medians,
                         "per_round": per_round, "base": before or None}
    this = medians["this"]["host_and_daemons"]
    r["this_asyncio_vs_this"] = medians["this-asyncio"]["host_and_daemons"] / this
    if before:
        r["this_vs_base"] = this / medians["base"]["host_and_daemons"]
    r["machine_load_1m_after"] = os.getloadavg()[0]
    print(f"{'side':<14}{'hosts':>8}{'daemons':>9}{'coordinators':>14}{'host+daemons':>14}   µs per chunk (medians)")
    for name, m in medians.items():
        print(f"{name:<14}{m['hosts']:>8.0f}{m['daemons']:>9.0f}{m['coordinators']:>14.0f}{m['host_and_daemons']:>14.0f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(r, indent=2, sort_keys=True) + "\n")
    return r


if __name__ == "__main__":
    asyncio.run(main())
