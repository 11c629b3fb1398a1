"""The fuzz suite's engine: a fixed, reproducible batch of inputs per surface, sent
concurrently, each answer judged, the figures recorded.

Inputs come from seeded generators (:mod:`tests.fuzz._strategies`: input ``i`` is a function
of the seed and ``i``) and go to the servers ``concurrency`` at a time: a join of an unknown
run waits 3 s by design (``JOIN_RECORD_WAIT``), so inputs sent one after another would spend
the budget waiting. There is no shrinking: a failure names the exact input (and its index,
which with the seed reproduces it).

Budget (environment; ``make test`` uses the defaults):

- ``BATON_FUZZ_EXAMPLES``: inputs per surface (default per surface, a few seconds each on
  2 cores); ``BATON_FUZZ_SCALE``: a factor on those defaults instead.
- ``BATON_FUZZ_SECONDS``: a deadline per surface; inputs not sent by then are not tried
  (the figures say how many were).
- ``BATON_FUZZ_SEED`` (default 0) and ``BATON_FUZZ_CONCURRENCY`` (default 16).
- ``BATON_FUZZ_WRITE=1`` (``make test-fuzz``): the summary also goes to
  ``bench/results/fuzz.json``.
- ``BATON_FUZZ_LOG=<file>``: one JSON line per input sent (index, outcome, seconds, the
  request and the start of the answer), to study what a run reached.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import pathlib
import platform
import time
from typing import Any, Awaitable, Callable, Generic, Sequence, TypeVar

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
#: Per-surface figures of the last run (``artifacts/`` is not versioned).
FIGURES_DIR = REPO / "artifacts" / "fuzz"
RESULTS = REPO / "bench" / "results" / "fuzz.json"

T = TypeVar("T")

#: Defects known and being fixed elsewhere: a finding that matches one is counted and makes
#: the test xfail (not strict), never pass silently; once fixed, the test passes.
#: None now: the deep /ds JSON 500, the /ds %00 path's dropped connection and the corrupt
#: protobufs answered UNKNOWN (Runs, and grpcio's health and reflection) are fixed.
KNOWN_DEFECTS: dict[str, str] = {}


def fuzz_timeout() -> float:
    """Seconds a fuzz test may take (pytest-timeout): its batch's deadline plus the
    gateways' start, the seeding and the snapshots."""
    return float(os.environ.get("BATON_FUZZ_SECONDS") or 60) + 90


def log(entry: dict[str, Any]) -> None:
    """Append ``entry`` to ``BATON_FUZZ_LOG`` (nothing when unset)."""
    path = os.environ.get("BATON_FUZZ_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")


@dataclasses.dataclass(frozen=True)
class Budget:
    examples: int
    seconds: float
    seed: int
    concurrency: int

    @classmethod
    def from_env(cls, default_examples: int) -> "Budget":
        env = os.environ
        examples = int(env["BATON_FUZZ_EXAMPLES"]) if env.get("BATON_FUZZ_EXAMPLES") else int(
            default_examples * float(env.get("BATON_FUZZ_SCALE") or 1))
        return cls(examples=max(examples, 1), seconds=float(env.get("BATON_FUZZ_SECONDS") or 60),
                   seed=int(env.get("BATON_FUZZ_SEED") or 0), concurrency=int(env.get("BATON_FUZZ_CONCURRENCY") or 16))


@dataclasses.dataclass
class Finding:
    """One input whose answer broke a property."""

    index: int
    request: str
    answer: str
    known: str | None = None  # a key of KNOWN_DEFECTS


@dataclasses.dataclass
class Tally(Generic[T]):
    """What one surface's run saw."""

    surface: str
    drawn: int = 0
    tried: int = 0
    outcomes: dict[str, int] = dataclasses.field(default_factory=dict)
    findings: list[Finding] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)
    first: dict[str, int] = dataclasses.field(default_factory=dict)  # outcome -> lowest input index

    def count(self, outcome: str, index: int) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        self.first[outcome] = min(index, self.first.get(outcome, index))


Judge = Callable[[int, T], Awaitable[tuple[str, Finding | None]]]


async def run_batch(tally: Tally[T], inputs: Sequence[T], judge: Judge[T], budget: Budget) -> None:
    """Send ``inputs`` through ``judge`` (which sends one and returns its outcome label and a
    finding or ``None``), ``budget.concurrency`` at a time, until done or the deadline."""
    tally.drawn = len(inputs)
    t0 = time.monotonic()
    deadline = t0 + budget.seconds
    it = iter(enumerate(inputs))

    async def worker() -> None:
        for i, x in it:
            if time.monotonic() > deadline:
                return
            label, finding = await judge(i, x)
            tally.tried += 1
            tally.count(label, i)
            if finding is not None:
                tally.findings.append(finding)

    # asyncio's debug mode (pyproject.toml) records a stack for every callback and task: half
    # of a batch's CPU time, measured with cProfile. The rest of the suite keeps it; a batch
    # is about the servers' answers, so it runs without it.
    loop = asyncio.get_running_loop()
    debug = loop.get_debug()
    loop.set_debug(False)
    try:
        async with asyncio.TaskGroup() as tg:
            for _ in range(budget.concurrency):
                tg.create_task(worker())
    finally:
        loop.set_debug(debug)
    tally.seconds = round(time.monotonic() - t0, 2)


def record(tally: Tally[Any], budget: Budget) -> dict[str, Any]:
    """Write the surface's figures to ``artifacts/fuzz/<surface>.json`` and return them."""
    known: dict[str, int] = {}
    for f in tally.findings:
        if f.known:
            known[f.known] = known.get(f.known, 0) + 1
    figures = {
        "surface": tally.surface, "seed": budget.seed, "examples": budget.examples, "drawn": tally.drawn,
        "tried": tally.tried, "seconds": tally.seconds, "concurrency": budget.concurrency,
        "outcomes": dict(sorted(tally.outcomes.items())),
        "first_input_of_outcome": dict(sorted(tally.first.items())), "known_defects": known,
        "violations": sum(1 for f in tally.findings if not f.known), **tally.notes,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    # New findings first, then a few of each known defect's.
    ordered = sorted(tally.findings, key=lambda f: (f.known is not None, f.index))
    figures["findings"] = [dataclasses.asdict(f) for f in ordered[:50]]
    FIGURES_DIR.mkdir(parents=True, exist_ok=True)
    (FIGURES_DIR / f"{tally.surface}.json").write_text(json.dumps(figures, indent=2) + "\n")
    return figures


def conclude(tally: Tally[Any], budget: Budget) -> None:
    """Fail on any finding that is no known defect; xfail when only known defects were hit."""
    record(tally, budget)
    new = [f for f in tally.findings if not f.known]
    if new:
        lines = [f"#{f.index}: {f.request}\n    -> {f.answer}" for f in new[:15]]
        pytest.fail(f"{tally.surface}: {len(new)} of {tally.tried} inputs broke a property "
                    f"(BATON_FUZZ_SEED={budget.seed}):\n" + "\n".join(lines), pytrace=False)
    known = sorted({f.known for f in tally.findings if f.known})
    if known:
        first = {k: next(f for f in tally.findings if f.known == k) for k in known}
        pytest.xfail("known defects: " + "; ".join(
            f"{KNOWN_DEFECTS[k]} (e.g. #{f.index}: {f.request[:160]} -> {f.answer[:120]})" for k, f in first.items()))


def terminal_summary(terminalreporter: Any, started: float) -> None:
    """Print the figures of the surfaces fuzzed in this session (read back from their files:
    under xdist the tests ran in workers)."""
    if not FIGURES_DIR.is_dir():
        return
    rows = []
    for path in sorted(FIGURES_DIR.glob("*.json")):
        if path.stat().st_mtime < started:
            continue
        try:
            rows.append(json.loads(path.read_text()))
        except ValueError:
            continue
    if not rows:
        return
    tr = terminalreporter
    tr.section("fuzz: inputs tried per surface")
    tr.write_line(f"{'surface':<14} {'tried':>6} {'drawn':>6} {'seconds':>8} {'violations':>10}  known defects hit")
    for r in rows:
        known = ", ".join(f"{k} x{n}" for k, n in r["known_defects"].items()) or "-"
        tr.write_line(f"{r['surface']:<14} {r['tried']:>6} {r['drawn']:>6} {r['seconds']:>8.1f} "
                      f"{r['violations']:>10}  {known}")
    tr.write_line(f"(figures: {FIGURES_DIR.relative_to(REPO)}/<surface>.json)")
    if os.environ.get("BATON_FUZZ_WRITE") == "1":  # `make test-fuzz`; `make test` leaves the checkout alone
        RESULTS.write_text(json.dumps({
            "bench": "fuzz", "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "surfaces": rows}, indent=2) + "\n")
        tr.write_line(f"(written to {RESULTS.relative_to(REPO)})")
