"""The takeover trigger of a join (docs/design.md §6 table).

Beside serving a join, the gateway looks at the run: when the record is ``running`` and no
live claim exists, it asks a live host to take the run over (``AttachRun``) in a task owned
by the app. The response is never broken by it: every failure is logged, and a failed drive
reports itself in the run's own log (``RUN_ERROR``).

| situation                          | decision       | what happens                       |
|------------------------------------|----------------|------------------------------------|
| no run id or no record             | ``no-record``  | serve the log, drive nothing       |
| record terminal                    | ``terminal``   | serve the log, drive nothing       |
| record interrupted (HITL pause)    | ``interrupted``| serve the log, drive nothing       |
| another host holds the claim       | ``claimed``    | serve and tail, drive nothing      |
| running, still ``starting``        | ``starting``   | serve and tail, drive nothing (its |
|                                    |                | input may not be durable: only a   |
|                                    |                | retried POST starts it)            |
| running, no live claim             | ``takeover``   | AttachRun on the least loaded host |
| …and a cancel is requested         | ``finalize``   | AttachRun(purpose=finalize)        |
| a takeover of it already in flight | ``in-flight``  | nothing more (one takeover)        |
"""
from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any, Literal

from baton import errors as e, telemetry
from baton.runs import TERMINAL_PB
from baton.v1 import runs_pb2, sandbox_host_pb2
from gateway._hosts import HostPool, try_hosts
from gateway._metrics import Metrics

log = logging.getLogger("gateway.takeover")

Decision = Literal["no-record", "terminal", "interrupted", "claimed", "starting", "takeover", "finalize",
                   "in-flight"]


def decide(record: runs_pb2.RunRecord | None, claim: Any | None) -> Decision:
    """The table's decision for a run (pure).

    Args:
        record: the run record, or ``None`` when there is none.
        claim: the live claim (``baton.v1.runs_pb2.Claim``) or ``None``.
    """
    if record is None:
        return "no-record"
    if record.status in TERMINAL_PB:
        return "terminal"
    if record.status == runs_pb2.RUN_STATUS_INTERRUPTED:
        return "interrupted"
    if claim is not None:
        return "claimed"
    if record.starting and not record.cancel_requested:
        return "starting"
    return "finalize" if record.cancel_requested else "takeover"


class TakeoverTrigger:
    """Fires at most one ``AttachRun`` per run at a time from this gateway, in owned tasks.

    Across gateways, the coordinator's ``ClaimRun`` makes a second attach fail with
    ``RunClaimNotAcquired(held)``, which is an expected outcome, not an error.

    Args:
        hosts: the host pool.
        metrics: where decisions and outcomes are counted.
    """

    def __init__(self, hosts: HostPool, metrics: Metrics) -> None:
        self._hosts = hosts
        self._metrics = metrics
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._closed = False

    def consider(self, run_id: str, record: runs_pb2.RunRecord | None, claim: Any | None) -> Decision:
        """Decide, count the decision, and start the attach when the table says so.

        Never raises and never blocks: the attach runs in a task this trigger owns.
        """
        decision = decide(record, claim)
        if decision in ("takeover", "finalize"):
            if run_id in self._inflight or self._closed:
                decision = "in-flight"
            else:
                purpose = "finalize" if decision == "finalize" else "drive"
                trace_parent = record.trace_parent if record is not None else ""
                task = asyncio.get_running_loop().create_task(self._attach(run_id, purpose, trace_parent),
                                                              name=f"takeover:{run_id}")
                self._inflight[run_id] = task
                task.add_done_callback(functools.partial(self._done, run_id))
        self._metrics.takeover_decisions.labels(decision).inc()
        return decision

    def _done(self, run_id: str, task: asyncio.Task[None]) -> None:
        if self._inflight.get(run_id) is task:
            del self._inflight[run_id]

    async def _attach(self, run_id: str, purpose: str, trace_parent: str = "") -> None:
        # Its own task: the run's log field, and (when the run is traced) a span in the run's
        # trace, which its AttachRun carries to the host.
        telemetry.bind_fields(run_id=run_id)
        if not trace_parent:
            await self._attach_traced(run_id, purpose, None)
            return
        span = telemetry.run_span("run.takeover", trace_parent, {"baton.run_id": run_id, "baton.purpose": purpose},
                                  takeover=True)
        with telemetry.in_span(span):
            await self._attach_traced(run_id, purpose, span)

    async def _attach_traced(self, run_id: str, purpose: str, span: Any) -> None:
        outcome = "attached"
        try:
            hosts = await self._hosts.live_hosts()

            async def attempt(h: Any) -> Any:
                req = sandbox_host_pb2.AttachRunRequest(run_id=run_id, purpose=purpose)
                return await self._hosts.call(h.address, "AttachRun", req)

            # A host that cannot reach the run's sandbox provider refuses it: the next one may.
            host, resp = await try_hosts(self._hosts, hosts, attempt, next_on=(e.ProviderUnreachable,))
            log.info("run %s taken over by %s at epoch %s (%s)", run_id, host.host_id, resp.epoch, purpose)
        except e.RunClaimNotAcquired as exc:
            # Someone else (another gateway, the coordinator's failover) got there first,
            # or the run ended meanwhile: nothing to do.
            outcome = f"not-acquired-{exc.reason}"
            log.info("takeover of run %s not needed: %s", run_id, exc.reason)
        except e.BatonError as exc:
            outcome = type(exc).__name__
            log.warning("takeover of run %s failed: %s", run_id, exc)
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except Exception:
            outcome = "error"
            log.exception("takeover of run %s failed", run_id)
        finally:
            self._metrics.takeovers.labels(outcome).inc()
            if span is not None:
                span.set_attribute("baton.outcome", outcome)

    async def aclose(self) -> None:
        """Cancel and await every in-flight attach (idempotent)."""
        self._closed = True
        tasks = list(self._inflight.values())
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks)
