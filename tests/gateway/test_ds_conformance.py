"""The Durable Streams conformance suite from npm against a real gateway (+ NATS, etcd).

The suite (``@durable-streams/server-conformance-tests``, vitest) runs through node against
``<gateway>/ds``; its JSON report is parsed and every test must pass except those listed in
:data:`REFERENCE_FAILS` (tests the reference server ``@durable-streams/server`` fails too,
each with why) and the suite's own skips.
"""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
from typing import Any

import pytest

from tests.conftest import REPO, require
from tests.gateway.conftest import GatewayFactory

NODE_DIR = REPO / "tests" / "node"
SUITE = "@durable-streams/server-conformance-tests"

# Tests that also fail against the reference server on this machine, and why they may fail
# against baton (docs/design.md §6.4 lists them). Empty when baton passes them all.
REFERENCE_FAILS: dict[str, str] = {
    "Chunking and Large Payloads should handle large payload appropriately": (
        "the PUT opening the test fails in undici ('fetch failed') right after the previous test's 100 KB "
        "pagination, against the reference server too (same line); alone it passes (413 for 10 MB)"),
}
# vitest's default 5 s per test measures this machine's load more than the server: the
# property-based tests make hundreds of requests each, and the reference server misses 5 s
# with them too when the two cores are shared. Both servers are run with this one timeout.
TEST_TIMEOUT_MS = 30_000


async def run_suite(base_url: str, report: pathlib.Path, timeout: float = 600) -> dict[str, Any]:
    """Run the conformance suite against ``base_url``; → vitest's JSON report."""
    vitest = NODE_DIR / "node_modules" / ".bin" / "vitest"
    require(vitest.exists() and (NODE_DIR / "node_modules" / SUITE).is_dir(), f"{SUITE} missing (make node-deps)")
    proc = await asyncio.create_subprocess_exec(
        str(vitest), "run", "ds/conformance.test.mjs", "--no-coverage", "--reporter=json", f"--testTimeout={TEST_TIMEOUT_MS}",
        f"--outputFile={report}", cwd=NODE_DIR, env={**os.environ, "CONFORMANCE_TEST_URL": base_url},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        async with asyncio.timeout(timeout):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert report.exists(), f"no report from vitest (rc={proc.returncode}): {out.decode()[-3000:]}"
    return json.loads(report.read_text())  # type: ignore[no-any-return]


def outcomes(report: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Test name → (status, first line of the failure)."""
    res: dict[str, tuple[str, str]] = {}
    for f in report["testResults"]:
        for a in f["assertionResults"]:
            msg = (a.get("failureMessages") or [""])[0].splitlines()
            res[a["fullName"]] = (a["status"], msg[0] if msg else "")
    return res


@pytest.mark.node
@pytest.mark.timeout(900)
async def test_conformance_suite_passes(make_gateway: GatewayFactory, tmp_path: pathlib.Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # A short long-poll keeps the suite's waits short (the suite allows up to 20 s).
    monkeypatch.setenv("BATON_DS_LONG_POLL_S", "2")
    gw = await make_gateway()
    report = await run_suite(f"{gw.url}/ds", tmp_path / "report.json")
    res = outcomes(report)
    (tmp_path / "outcomes.json").write_text(json.dumps(res, indent=1))
    failed = {n: m for n, (s, m) in res.items() if s == "failed" and n not in REFERENCE_FAILS}
    passed = sum(1 for s, _ in res.values() if s == "passed")
    assert len(res) >= 338
    assert not failed, f"{len(failed)} failed, {passed} passed: " + json.dumps(failed, indent=1)[:6000]
