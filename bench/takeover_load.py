"""Fast failover on a loaded machine: SIGKILL → next chunk, with and without a CPU burner.

(h) of the takeover bench (``bench/takeover.py`` has (a)-(g); this module reuses its
clusters and its killer). One cluster of three hosts (``fast``: the fast path on, session TTL
``FAST_TTL``) and, with ``BATON_BENCH_BEFORE=<dir>`` (a checkout of another revision, e.g.
``git archive main | tar -x -C <dir>``), a ``before`` cluster running that revision's
coordinator and hosts, their kills interleaved so load drifts hit both alike. Each side is
measured ``unloaded``, then with busy-loop processes (``python -c 'while 1: pass'``) beside
the cluster for a whole phase: ``loaded_1`` with one (a CPU burner, as the target is
worded), ``loaded`` with ``BURNERS`` (one per core of this machine, the harsher).

Per kill a host driving ``RUNS_PER_KILL`` runs is SIGKILLed; per run, the seconds from the
SIGKILL to its successor's first chunk at a reader connected the whole time (p50, max).
``fast_path`` counts the kills whose lease the coordinator revoked (its log line ``lease
revoked (fast failover)``) before the TTL could have expired it; the rest took the TTL path.

``python -m bench takeover_load`` (``BATON_BENCH_KILLS`` kills per side and phase, default 6).
Writes ``bench/results/takeover_load.json``.
"""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from bench._cpu import calibration_ms
from bench._servers import etcd_and_nats
from bench.takeover import FAST_TTL, RESULTS, Killer, Side, _log_times, _pct

if TYPE_CHECKING:
    from baton_tools.testing.servers import EtcdServer, NatsServer

KILLS = int(os.environ.get("BATON_BENCH_KILLS", "6"))
BURNERS = 2  # busy loops beside the cluster in the ``loaded`` phase (the machine has 2 cores)
PHASES = (("unloaded", 0), ("loaded_1", 1), ("loaded", BURNERS))  # (name, busy loops)
OUT = RESULTS.with_name("takeover_load.json")


def _fast_path_kills(side: Side, kill_times: list[float]) -> int:
    """How many of the kills at ``kill_times`` (wall clock) were followed by a fast revoke
    within the TTL (a revoke after it would not have been needed)."""
    text = side.coordinator.log_path.read_text(errors="replace")
    revokes = [_log_times(x) for x in text.splitlines() if "lease revoked (fast failover)" in x]
    return sum(any(0 <= r - k < FAST_TTL for r in revokes) for k in kill_times)


async def _phase(sides: list[Side], killers: dict[str, Killer], kills: int) -> dict[str, Any]:
    """``kills`` interleaved kills per side; the figures of this phase only."""
    start = {name: (len(k.delays), len(k.kill_times)) for name, k in killers.items()}
    for _ in range(kills):
        for s in sides:
            await killers[s.name].once()
    out: dict[str, Any] = {}
    for s in sides:
        k = killers[s.name]
        d0, t0 = start[s.name]
        times = k.kill_times[t0:]
        out[s.name] = {**_pct(k.delays[d0:]), "kills": len(times), "fast_path": _fast_path_kills(s, times)}
    return out


def _burners(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(n)]


async def _phases(tmp: pathlib.Path, etcd: "EtcdServer", nats: "NatsServer", r: dict[str, Any]) -> None:
    """Every phase of :data:`PHASES` on the sides (a ``before`` side too when
    ``BATON_BENCH_BEFORE`` names a checkout), each phase's figures into ``r[phase]``."""
    sides = [Side("fast", 0.0, tmp / "fast", fast=True, n_hosts=3, ttl=FAST_TTL, log_level="INFO")]
    before = os.environ.get("BATON_BENCH_BEFORE")
    if before:
        sides.append(Side("before", 0.0, tmp / "before", fast=True, n_hosts=3, ttl=FAST_TTL, log_level="INFO",
                          repo=pathlib.Path(before)))
    killers = {s.name: Killer(s) for s in sides}
    try:
        for s in sides:
            await s.start(etcd, nats)
        try:
            for phase, n in PHASES:
                burn = _burners(n)
                try:
                    r[phase] = await _phase(sides, killers, KILLS)
                finally:
                    for p in burn:
                        p.kill()
                        p.wait()
                print(f"(h) {phase} {r[phase]}", flush=True)
        finally:
            for k in killers.values():
                await k.finish()
    finally:
        for s in sides:
            await s.close()


async def main() -> dict[str, Any]:
    r: dict[str, Any] = {"lease_ttl_s": FAST_TTL, "burners": BURNERS, "kills_per_phase": KILLS}
    with etcd_and_nats("bench-takeover-load-") as (tmp, etcd, nats):
        await _phases(tmp, etcd, nats, r)
    r["machine_load_1m_after"] = os.getloadavg()[0]
    r["machine_calibration_ms"] = calibration_ms()
    r["at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    _print(r)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(r, indent=2, sort_keys=True) + "\n")
    return r


def _print(r: dict[str, Any]) -> None:
    print(f"{'side':8} {'phase':9} {'p50 ms':>8} {'max ms':>8} {'runs':>5} {'fast path':>10}")
    for phase, _n in PHASES:
        for name, x in r.get(phase, {}).items():
            if not x.get("n"):
                print(f"{name:8} {phase:9} {'-':>8} {'-':>8} {0:5d} {x.get('fast_path', 0):4d}/{x.get('kills', 0)}")
                continue
            print(f"{name:8} {phase:9} {x['p50'] * 1000:8.0f} {x['max'] * 1000:8.0f} {x['n']:5d} "
                  f"{x['fast_path']:4d}/{x['kills']}")


if __name__ == "__main__":
    asyncio.run(main())
