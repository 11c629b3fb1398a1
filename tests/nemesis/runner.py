"""One nemesis session: a cluster, the schedule's faults applied on time while the workload
runs, the heal, the history collected and checked; the figures per fault kind; a failing
history saved, its schedule shrunk.
"""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
import platform
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

from tests.faults.harness import REPO
from tests.nemesis.checker import History, Violation, check, tally
from tests.nemesis.cluster import NemesisCluster
from tests.nemesis.schedule import KINDS, Fault, Schedule, Topology, dumps
from tests.nemesis.workload import Workload, collect, finish

RESULTS = REPO / "bench" / "results" / "nemesis.json"
FAILURES = REPO / "bench" / "results" / "nemesis-failures"
#: Seconds a fault's effects are counted past its end (a takeover, a reconnect).
AFTERMATH = 15.0


@dataclass
class Outcome:
    """A session's history, its violations, what went wrong in the nemesis or workload
    itself, and its length (s)."""

    schedule: Schedule
    history: History
    violations: list[Violation]
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: Seconds spent in each phase: ``start`` (the cluster), ``schedule``, ``heal`` (and
    #: every run's end), ``collect`` (the history read back; ``leak_wait`` of it waited for
    #: the last sandboxes, agents and claims to go), ``check``.
    phases: dict[str, float] = field(default_factory=dict)


async def play(tmp: pathlib.Path, schedule: Schedule, topology: Topology, *, slots: int,
               length: float | None = None) -> Outcome:
    """Run ``schedule`` against a fresh cluster under the workload (seeded by the schedule's
    seed) for ``length`` seconds (default: the schedule's minutes), heal, check.

    Returns:
        The :class:`Outcome`; the cluster is closed.
    """
    length = schedule.minutes * 60.0 if length is None else length
    c = NemesisCluster(tmp, f"nemesis-{schedule.seed}", topology)
    t_start = time.monotonic()
    phases: dict[str, float] = {}

    def lap(name: str, since: float) -> float:
        now = time.monotonic()
        phases[name] = round(now - since, 1)
        return now
    try:
        await c.start_all()
        t0 = lap("start", t_start)
        wl = Workload(c, schedule.seed, t0)
        errors: list[str] = []

        async def one(f: Fault) -> None:
            await asyncio.sleep(max(0.0, f.at - (time.monotonic() - t0)))
            try:
                await c.inject(f)
            except Exception as exc:  # noqa: BLE001 - the nemesis's own trouble, reported
                errors.append(f"{f.describe()}: {exc!r}")

        faults = [asyncio.create_task(one(f)) for f in schedule.faults if f.at < length]
        # The workload stops starting runs 20 s before the end: the last ones end in calm.
        await wl.run(slots, max(10.0, length - 20.0))
        await asyncio.gather(*faults)
        t = lap("schedule", t0)
        await c.heal_all()
        await finish(wl)
        t = lap("heal", t)
        history = await collect(wl)
        t = lap("collect", t)
        phases["leak_wait"] = wl.leak_wait  # (part of collect)
        violations = check(history)
        lap("check", t)
        return Outcome(schedule, history, violations, errors + wl.errors + c.trouble,
                       time.monotonic() - t_start, phases)
    finally:
        await c.close()


def figures(outcome: Outcome) -> dict[str, Any]:
    """Per fault kind: faults injected; the runs alive during one (or within
    :data:`AFTERMATH` after it), their chunks stored and reads checked, their violations.
    ``all`` counts every run once."""
    h, runs = outcome.history, outcome.history.runs
    by_run: dict[str, list[Violation]] = {}
    for v in outcome.violations:
        by_run.setdefault(v.run_id, []).append(v)

    def row(selected: list[Any], faults: int) -> dict[str, int]:
        return {"faults": faults, "runs": len(selected),
                "chunks": sum(sum(1 for x in r.stored if x.kind == "chunk") for r in selected),
                "reads": sum(len(r.fresh) + sum(len(rd.items) for rd in r.readers) for r in selected),
                "violations": sum(len(by_run.get(r.run_id, [])) for r in selected)}
    out = {}
    for kind in KINDS:
        fs = outcome.schedule.of_kind(kind)
        hit = [r for r in runs if any(r.started <= f.end + AFTERMATH and f.at <= r.ended for f in fs)]
        out[kind] = row(hit, len(fs))
    out["all"] = row(runs, len(outcome.schedule.faults))
    out["all"]["violations"] = len(outcome.violations)  # leaks too (not tied to a run)
    out["all"]["threads"] = len(h.transcripts)
    return out


def approval_figures(outcome: Outcome) -> dict[str, int]:
    """The approvals of the session: runs that asked, questions asked, answers accepted and
    delivered, second answers sent (and refused), questions a cancel left open (and late
    answers to them refused), ``answer_once`` violations."""
    runs = [r for r in outcome.history.runs if r.asked or r.answers]
    return {"runs": len(runs), "asked": sum(len(r.asked) for r in runs),
            "answered": sum(len(r.answers) for r in runs),
            "delivered": sum(len(r.answer_deliveries) for r in runs),
            "duplicates_sent": sum(len(r.duplicate_answers) for r in runs),
            "duplicates_refused": sum(1 for r in runs for _, st, _ in r.duplicate_answers if st == 409),
            "left_open_at_cancel": sum(len(r.unanswered) for r in runs),
            "late_refused": sum(1 for r in runs for _, st, why in r.late_answers if (st, why) == (409, "RUN_ENDED")),
            "violations": sum(1 for v in outcome.violations if v.prop == "answer_once")}


def write_results(outcome: Outcome, path: pathlib.Path = RESULTS) -> dict[str, Any]:
    """bench/results/nemesis.json: the session's figures and the table's rows."""
    data = {"bench": "nemesis", "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seed": outcome.schedule.seed,
            "minutes": outcome.schedule.minutes, "seconds": round(outcome.seconds), "phases": outcome.phases,
            "by_kind": figures(outcome),
            "by_property": tally(outcome.violations), "approvals": approval_figures(outcome), "nemesis_errors": outcome.errors[:50]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return data


def table(data: dict[str, Any]) -> str:
    phases = ", ".join(f"{k} {v}s" for k, v in data.get("phases", {}).items())
    lines = [f"nemesis seed {data['seed']}, {data['minutes']} min ({data['seconds']}s in all: {phases})",
             f"{'fault kind':<12} {'faults':>6} {'runs':>5} {'chunks':>7} {'reads':>7} {'violations':>10}"]
    for kind, r in data["by_kind"].items():
        lines.append(f"{kind:<12} {r['faults']:>6} {r['runs']:>5} {r['chunks']:>7} {r['reads']:>7} {r['violations']:>10}")
    if "approvals" in data:
        lines.append("approvals: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in data["approvals"].items()))
    return "\n".join(lines)


def save_failure(outcome: Outcome, shrunk: Schedule | None = None) -> pathlib.Path:
    """bench/results/nemesis-failures/seed-<seed>.json: the schedule (and its shrunk form),
    the violations, the errors and the whole history."""
    FAILURES.mkdir(parents=True, exist_ok=True)
    path = FAILURES / f"seed-{outcome.schedule.seed}.json"
    path.write_text(json.dumps({
        "seed": outcome.schedule.seed, "schedule": json.loads(dumps(outcome.schedule)),
        "shrunk": None if shrunk is None else json.loads(dumps(shrunk)),
        "violations": [str(v) for v in outcome.violations], "errors": outcome.errors,
        "history": outcome.history.to_json()}, indent=1) + "\n")
    if shrunk is not None:
        (FAILURES / f"seed-{outcome.schedule.seed}.schedule.json").write_text(dumps(shrunk) + "\n")
    return path


#: What of a failing session's directory is kept: the process logs, the sandboxes left on
#: disk (each local sandbox daemon's ``.baton/daemon.log``, address and spawn files) and the
#: journals with their stderr files. A sandbox a host destroyed is gone already; what is
#: kept is what was still there when the failure was seen.
KEPT = ("logs", "sandboxes", "journals")


def keep_logs(tmp: pathlib.Path, seed: int) -> pathlib.Path | None:
    """Copy the failing session's process logs, sandbox directories (with their daemons'
    logs) and journals beside its history, before pytest's temporary directory is dropped.

    Args:
        tmp: the session's directory (the cluster's ``tmp``).
        seed: the schedule's seed (names the copy).

    Returns:
        ``bench/results/nemesis-failures/seed-<seed>-logs/`` holding ``logs/``,
        ``sandboxes/`` and ``journals/`` (those that existed), or None if none did.
    """
    kept = [tmp / name for name in KEPT if (tmp / name).exists()]
    if not kept:
        return None
    dest = FAILURES / f"seed-{seed}-logs"
    shutil.rmtree(dest, ignore_errors=True)
    for src in kept:
        try:  # sockets and files removed mid-copy are skipped; the rest is copied
            shutil.copytree(src, dest / src.name, symlinks=True, ignore_dangling_symlinks=True)
        except shutil.Error as e:
            (dest / f"{src.name}.copy-errors.txt").write_text("\n".join(map(str, e.args[0])) + "\n")
    return dest
