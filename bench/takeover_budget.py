"""What a takeover costs in CPU, per process group, apart from the streaming around it.

On a 2-core machine the fast failover's stall is CPU-bound (every core busy from the SIGKILL
to the last run's next chunk, bench/results/README.md "Takeover"), so its length is the CPU
the takeovers need plus the CPU of whatever else runs meanwhile (the runs' agents keep
writing, and each line costs its host and sandbox daemon). This bench takes the two apart.

One cluster of three hosts (``bench/takeover.py``'s ``Side``, session TTL ``FAST_TTL``).
Per kill: ``RUNS_PER_KILL`` runs on one host, each with a reader, until every reader saw
``FAST_KILL_AT`` chunks; then the runs' agents are stopped (SIGSTOP), so no line is written
from there on, and the host is given ``DRAIN`` s to stream what they wrote. Then two windows
of ``WINDOW`` s each, every process's CPU read from ``/proc/<pid>/task/*/schedstat`` (ns):

* ``quiet``: nothing written, nothing killed: what the cluster uses standing still;
* ``takeover``: the SIGKILL of the host, and the takeover of each of its runs by the other
  two (revoke, hand-over, claim, fence, stored-log read, sandbox attach, replay and
  alignment); there is no new line to append, so no catch-up is in it. The coordinator's
  takeover notes read their cause at once (in the window) and wait ``NOTE_DEFER`` (0.5 s)
  before their connect and write (outside it). Each run's successor fence is looked for
  at the window's end (``fenced_in_window``): a takeover not done by then is not all in it.

Then the agents go on (SIGCONT), the runs end on their successors, and the victim restarts.

Only this bench's processes are counted (its cluster, etcd, nats-server, itself). Figures
(ms, medians of the kills): per process group, ``takeover`` minus ``quiet`` (the victim's own
quiet use is in ``quiet`` and gone in ``takeover``, so the hosts' figure is a little under
the successors' cost); their sum per kill and per run taken over; and that sum over the
machine's cores: the least wall time one kill's takeovers need with no other work on the
machine. ``python -m bench takeover_budget`` (``BATON_BENCH_KILLS`` kills, default 8).
Writes ``bench/results/takeover_budget.json``.
"""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
import statistics
import time
from typing import Any

from bench._cpu import calibration_ms, cpu_seconds_exact, processes
from bench._servers import etcd_and_nats
from bench.takeover import FAST_TTL, RESULTS, RUNS_PER_KILL, Side, _drive, _successor_delays

OUT = RESULTS.with_name("takeover_budget.json")
KILLS = int(os.environ.get("BATON_BENCH_KILLS", "8"))
WINDOW = 0.4  # s: each window (the stall is 0.1-0.3 s; the notes' connects and writes come after 0.5 s)
DRAIN = 0.3  # s after the agents stopped: the host streams what they wrote


def _groups(side: Side, servers: dict[str, int], sandboxed: list[tuple[int, str]]) -> dict[int, str]:
    """pid → group of this bench's processes only (other clusters on the machine are left
    out): the side's hosts, coordinator, etcd and nats-server from ``servers`` (group → pid),
    this process (its readers), and ``sandboxed`` (pid, command line): the processes running
    in its sandboxes, each a sandbox daemon or one of the agents'."""
    out = {h.pid: "hosts" for h in side.hosts if h.pid is not None}
    out[side.coordinator.proc.pid] = "coordinators"
    out.update({pid: group for group, pid in servers.items()})
    out[os.getpid()] = "bench (readers)"
    for pid, argv in sandboxed:
        out.setdefault(pid, "sandbox daemons" if _is_daemon(argv) else "agents")
    return out


def _snapshot(groups: dict[int, str]) -> dict[int, tuple[str, float]]:
    """pid → (group, CPU seconds so far) of ``groups``' live processes
    (:func:`bench._cpu.cpu_seconds_exact`: their live threads, to the ns)."""
    out = {}
    for pid, group in groups.items():
        try:
            out[pid] = (group, cpu_seconds_exact(pid))
        except OSError:
            continue
    return out


def _used(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU ms per group between two snapshots (processes alive at both; a thread that ended
    in between takes its time with it, so a group's figure can come out a little low)."""
    out: dict[str, float] = {}
    for pid, (group, cpu) in after.items():
        if pid in before:
            out[group] = out.get(group, 0.0) + (cpu - before[pid][1]) * 1000
    return out


def _is_daemon(argv: str) -> bool:
    """Whether a command line is a sandbox daemon's (``python -m sandbox_host.daemon``)."""
    return "sandbox_host.daemon" in argv


def _cwd_in(pid: int, root: pathlib.Path) -> bool:
    """Whether process ``pid`` runs in a directory under ``root`` (an agent runs in its
    sandbox, under the side's directory; its command line names the program relatively)."""
    try:
        return pathlib.Path(os.readlink(f"/proc/{pid}/cwd")).is_relative_to(root.resolve())
    except OSError:
        return False


def _signal(pids: list[int], sig: int) -> None:
    """Send ``sig`` to each of ``pids``; one already gone is skipped."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            continue


async def _taken_over(side: Side, run_ids: list[str]) -> int:
    """How many of ``run_ids`` have a successor's fence (epoch ≥ 2) in their log."""
    n = 0
    for r in run_ids:
        heads = await side.log.stored_headers(r)
        n += any(h.kind == "fence" and h.epoch >= 2 for h in heads)
    return n


async def one_kill(side: Side, servers: dict[str, int]) -> dict[str, Any]:
    """One kill of ``side.hosts[0]`` with its runs' agents stopped.

    Returns:
        ``{"agents": python agents stopped, "fenced_in_window": runs whose successor's fence
        landed within the takeover window, "quiet_ms" / "takeover_ms" / "net_ms": {group:
        CPU ms}}`` (``net_ms`` = takeover − quiet).

    Raises:
        RuntimeError: not every run's agent was found to stop.
    """
    victim = side.hosts[0]
    run_ids, arrivals, readers = await _drive(side, victim, RUNS_PER_KILL, 0.01)
    # The processes in the runs' sandboxes (one pass over /proc): the daemons, and those to
    # stop: each agent, its wrapper shell and relay.
    sandboxed = [(pid, argv) for pid, _p, _c, argv in processes() if _cwd_in(pid, side.tmp)]
    in_sandboxes = [pid for pid, argv in sandboxed if not _is_daemon(argv)]
    agents = [pid for pid, argv in sandboxed
              if not _is_daemon(argv) and argv.split(" ", 1)[0].rsplit("/", 1)[-1].startswith("python")
              and "replay_agent" in argv]
    if len(agents) != RUNS_PER_KILL:
        raise RuntimeError(f"found {len(agents)} python agents for the {RUNS_PER_KILL} runs")
    _signal(in_sandboxes, signal.SIGSTOP)
    try:
        await asyncio.sleep(DRAIN)
        groups = _groups(side, servers, sandboxed)
        s0 = await asyncio.to_thread(_snapshot, groups)
        await asyncio.sleep(WINDOW)
        s1 = await asyncio.to_thread(_snapshot, groups)
        t0 = time.monotonic()
        victim.kill_now()
        await asyncio.sleep(WINDOW)
        s2 = await asyncio.to_thread(_snapshot, groups)
        fenced = await _taken_over(side, run_ids)
    finally:
        _signal(in_sandboxes, signal.SIGCONT)
    await _successor_delays(side, run_ids, arrivals, readers, t0)
    await victim.start()
    quiet, takeover = _used(s0, s1), _used(s1, s2)
    return {"agents": len(agents), "fenced_in_window": fenced, "quiet_ms": quiet, "takeover_ms": takeover,
            "net_ms": {g: takeover.get(g, 0.0) - quiet.get(g, 0.0) for g in takeover}}


async def main() -> dict[str, Any]:
    """Run the kills, print the table, write :data:`OUT`; returns what it wrote."""
    if KILLS < 1:
        raise SystemExit("BATON_BENCH_KILLS must be at least 1")
    kills: list[dict[str, Any]] = []
    with etcd_and_nats("bench-takeover-budget-") as (tmp, etcd, nats):
        side = Side("budget", 0.0, tmp / "budget", fast=True, n_hosts=3, ttl=FAST_TTL)
        try:
            await side.start(etcd, nats)
            assert etcd.proc is not None and nats.proc is not None
            servers = {"etcd": etcd.proc.pid, "nats-server": nats.proc.pid}
            for i in range(KILLS):
                k = await one_kill(side, servers)
                kills.append(k)
                print(f"  kill {i + 1}: takeover CPU (net of quiet) "
                      + ", ".join(f"{g} {v:.1f}" for g, v in sorted(k["net_ms"].items(), key=lambda x: -x[1]))
                      + " ms", flush=True)
        finally:
            await side.close()
    groups = sorted({g for k in kills for g in k["net_ms"]})
    net = {g: round(statistics.median(k["net_ms"].get(g, 0.0) for k in kills), 1) for g in groups}
    quiet = {g: round(statistics.median(k["quiet_ms"].get(g, 0.0) for k in kills), 1) for g in groups}
    totals = [sum(k["net_ms"].values()) for k in kills]
    cores = os.cpu_count() or 1
    r: dict[str, Any] = {
        "kills": KILLS, "runs_per_kill": RUNS_PER_KILL, "window_s": WINDOW, "cores": cores,
        "takeover_net_ms_p50": net, "quiet_ms_p50": quiet,
        "takeover_total_ms_p50": round(statistics.median(totals), 1),
        "takeover_total_ms_range": [round(min(totals), 1), round(max(totals), 1)],
        "fenced_in_window_min": min(k["fenced_in_window"] for k in kills),
        "per_run_ms_p50": round(statistics.median(totals) / RUNS_PER_KILL, 2),
        "least_wall_ms_all_runs": round(statistics.median(totals) / cores, 1),
        "machine_calibration_ms": calibration_ms(),
        "per_kill": kills,
    }
    _print(r)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(r, indent=2, sort_keys=True) + "\n")
    return r


def _print(r: dict[str, Any]) -> None:
    """The table of :func:`main`'s result."""
    print(f"takeover CPU, {r['runs_per_kill']} runs per kill, {r['kills']} kills (ms, median; quiet = "
          f"the same {r['window_s']} s with nothing written or killed)")
    print(f"{'group':<24}{'takeover':>10}{'quiet':>10}")
    for g, v in sorted(r["takeover_net_ms_p50"].items(), key=lambda x: -x[1]):
        print(f"{g:<24}{v:>10.1f}{r['quiet_ms_p50'].get(g, 0.0):>10.1f}")
    print(f"{'total':<24}{r['takeover_total_ms_p50']:>10.1f}   per run {r['per_run_ms_p50']:.1f} ms; "
          f"over {r['cores']} cores at least {r['least_wall_ms_all_runs']:.0f} ms for all runs")
    print(f"runs fenced within the window: at least {r['fenced_in_window_min']} of {r['runs_per_kill']} per kill; "
          f"calibration {r['machine_calibration_ms']} ms")


if __name__ == "__main__":
    asyncio.run(main())
