"""Fixtures of the fault suite: a :class:`FaultCluster` per test, tiers, and the
recovery-time table.

Tiers: a test marked ``faults_slow`` runs only under ``make test-faults``
(``BATON_FAULTS=all``); the rest also run in ``make test``. Each test records its recovery
time (fault end → every reader got its next chunk, or the end); the session writes them
to ``bench/results/faults.json`` and prints a table at the end.
"""
from __future__ import annotations

import json
import os
import pathlib
import platform
import time
from typing import Any, AsyncIterator, Awaitable, Callable

import pytest

from tests.faults.harness import REPO, FaultCluster

RESULTS = REPO / "bench" / "results" / "faults.json"
_results: list[dict[str, Any]] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "faults_slow: a fault case that runs only under `make test-faults`")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mode = os.environ.get("BATON_FAULTS")
    if mode == "all":
        return
    if mode == "slow":  # CI after `make test`: only the cases make test skipped
        fast = pytest.mark.skip(reason="fast fault case: `make test` runs it")
        for item in items:
            if "faults_slow" not in item.keywords and "tests/faults/" in item.nodeid:
                item.add_marker(fast)
        return
    skip = pytest.mark.skip(reason="slow fault case: `make test-faults` (BATON_FAULTS=all) runs it")
    for item in items:
        if "faults_slow" in item.keywords:
            item.add_marker(skip)


ClusterFactory = Callable[..., Awaitable[FaultCluster]]


@pytest.fixture
async def fault_cluster(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> AsyncIterator[ClusterFactory]:
    """``c = await fault_cluster(hosts=3, etcd_proxy=True, ...)``: every process started
    (see :meth:`FaultCluster.start`); closed, and its recovery time recorded, at the end."""
    made: list[FaultCluster] = []
    t0 = time.monotonic()

    async def make(**kw: Any) -> FaultCluster:
        c = FaultCluster(tmp_path, request.node.name)
        made.append(c)
        return await c.start(**kw)

    yield make
    for c in made:
        await c.close()
    outcome = getattr(request.node, "rep_call", None)
    for c in made:
        _results.append({
            "case": request.node.name,
            "fault": "; ".join(c.notes),
            "runs": len(c.runs),
            "recovery_s": None if c.recovery is None else round(c.recovery, 2),
            "test_s": round(time.monotonic() - t0, 1),
            "outcome": _outcome(outcome),
        })


def _outcome(report: Any) -> str:
    if report is None:
        return "error"
    if hasattr(report, "wasxfail"):
        return "xpassed" if report.passed else "xfailed"
    return str(report.outcome)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    report = rep.get_result()
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _results:
        return
    # Only the whole suite (make test-faults) writes the results file: `make test` leaves the
    # checkout as it found it.
    write = os.environ.get("BATON_FAULTS") == "all"
    if write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps({
            "bench": "faults", "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cases": _results}, indent=2) + "\n")
    tr = terminalreporter
    tr.section("fault suite: recovery times")
    tr.write_line(f"{'case':<52} {'outcome':<8} {'runs':>4} {'recovery':>9} {'test':>7}  fault")
    for r in _results:
        rec = "-" if r["recovery_s"] is None else f"{r['recovery_s']:.2f}s"
        tr.write_line(f"{r['case'][:52]:<52} {r['outcome']:<8} {r['runs']:>4} {rec:>9} {r['test_s']:>6.1f}s  {r['fault']}")
    if write:
        tr.write_line(f"(written to {RESULTS.relative_to(REPO)})")
