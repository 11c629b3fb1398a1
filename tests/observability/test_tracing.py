"""One trace per run (OpenTelemetry, OTLP): the POST, the claim, a SIGKILL takeover and the
end of a run are spans of one trace, the takeover linked to the run's stored context, and the
agent gets the trace context in its environment (``TRACEPARENT``).

Real processes (:class:`~tests.faults.harness.FaultCluster`) export to an in-process OTLP
receiver (:class:`~baton_tools.testing.otlp.OtlpReceiver`).
"""
from __future__ import annotations

import asyncio
import pathlib
from typing import Callable

import pytest

from baton_tools.testing.otlp import OtlpReceiver, ReceivedSpan
from tests.faults.harness import FaultCluster, eventually

pytestmark = pytest.mark.servers


def agents_in_trace(trace_id: str) -> list[tuple[str, str]]:
    """``(command line, TRACEPARENT)`` of every live process whose environment holds a
    ``TRACEPARENT`` of ``trace_id`` (only agents get one: the services do not)."""
    out = []
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        for var in env:
            if var.startswith(b"TRACEPARENT=00-" + trace_id.encode()):
                out.append((cmd, var.split(b"=", 1)[1].decode()))
    return out


@pytest.mark.timeout(180)
async def test_one_trace_spans_a_run_its_claim_a_sigkill_takeover_and_its_end(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with OtlpReceiver() as otlp:
        # The services' environment (the launchers copy this process's): export at once.
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        c = FaultCluster(tmp_path, "tracing")
        try:
            await c.start(hosts=2)
            [run] = await c.start_runs(1, seconds=12)
            rid = run.run_id

            def of_run(name: str, **attrs: object) -> Callable[[ReceivedSpan], bool]:
                return lambda s: (s.name == name and s.attributes.get("baton.run_id") == rid
                                  and all(s.attributes.get(k) == v for k, v in attrs.items()))

            root = await otlp.wait_for(of_run("run.start"), what="the gateway's run.start")
            assert root.service == "baton-gateway" and root.parent_span_id == ""
            trace = root.trace_id
            first = await otlp.wait_for(of_run("run.claim", **{"baton.epoch": 1}), what="the first claim")
            assert first.service == "baton-sandbox-host" and first.trace_id == trace
            assert first.parent_span_id == root.span_id and not first.links
            # The claim went through the coordinator, in the run's trace.
            await otlp.wait_for(lambda s: s.service == "baton-coordinator" and s.trace_id == trace
                                and s.name == "baton.v1.Coordinator/ClaimRun", what="the coordinator's ClaimRun")
            # The agent runs with the run's trace context (its host's drive span).
            async def agent_in_trace() -> list[tuple[str, str]]:
                found = await asyncio.to_thread(agents_in_trace, trace)
                assert found, "no process with the run's TRACEPARENT"
                return found
            agents = await eventually(agent_in_trace, 30)
            assert any("replay" in cmd for cmd, _ in agents), agents
            assert all(tp.split("-")[2] != root.span_id for _, tp in agents), agents

            victim = c.host(first.attributes["baton.host"])
            async with c.fault(f"SIGKILL {victim.host_id}"):
                await victim.kill()
            await c.finish()

            drive = await otlp.wait_for(of_run("run.drive", **{"baton.epoch": 2}), what="the successor's drive")
        finally:
            await c.close()

        assert drive.service == "baton-sandbox-host" and drive.attributes["baton.host"] != victim.host_id
        assert drive.trace_id == trace and drive.parent_span_id == root.span_id
        assert drive.attributes["baton.mode"] == "attach"
        assert drive.links == [(trace, root.span_id, {"baton.link": "takeover"})]
        assert drive.attributes["baton.outcome"] == "completed", drive.attributes
        claim2 = otlp.find(of_run("run.claim", **{"baton.epoch": 2}))
        assert claim2 and claim2[0].links and claim2[0].trace_id == trace
        # Whoever handed it over (the coordinator's failover or a gateway's takeover) did so
        # in the run's trace.
        assert otlp.find(lambda s: s.name in ("run.failover", "run.takeover") and s.trace_id == trace)
        # The end went through the coordinator under the successor's drive span.
        assert otlp.find(lambda s: s.service == "baton-coordinator" and s.parent_span_id == drive.span_id)
        # Every span naming the run is in its one trace.
        assert {s.trace_id for s in otlp.spans if s.attributes.get("baton.run_id") == rid} == {trace}
