"""A successor stopped by a cancel keeps the run input in the saved transcript.

The interleaving a loaded machine produced (``test_cancel_of_a_run_whose_host_died_is_
carried_out_by_another`` saved an empty transcript once in a while): the successor's
``WatchRun`` reports the cancel while its body is still reading the stored ``run.accepted``
(the run input; it comes with the body's read of the stored log), so the body is cancelled
inside that read. The final writes must load the input again, not save a transcript without
the user's messages.

Here the read is held open until the cancel stops the body, so the interleaving happens
every time; etcd, NATS and the coordinator are real. The cluster has no host, so the
leader's failover (which would take the orphaned run first) finds nobody to hand it to.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Callable


from baton.v1 import runs_pb2
from sandbox_host.machine import accepted_chunk
from sandbox_host.driver import RunDriver
from sandbox_host.deps import HostDeps, HostSettings
from tests.conftest import unique
from tests.driver.conftest import CORPUS, Cluster

LONG = "claude-stream-json/partial-messages-parallel-bash-denied.jsonl"
USER = [{"id": "u1", "role": "user", "content": "replay it"}]


class _FirstInputReadHangs(HostDeps):
    """Host deps whose body read of the stored log (which brings the run input) answers
    only when cancelled."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.held = asyncio.Event()

    async def stored_before_fence(self, run_id: str, fenced_over: int) -> tuple[list[Any], dict[int, bytes]]:
        if not self.held.is_set():
            self.held.set()
            await asyncio.Event().wait()  # ends only by cancellation (the cancel stops the body)
        return await super().stored_before_fence(run_id, fenced_over)


async def _orphan(c: Cluster, tail: Callable[[str, str], list[dict[str, Any]]] | None = None) -> tuple[str, str]:
    """A run whose first host claimed it, wrote its opening (then ``tail(run_id, thread_id)``,
    journal chunks) and died before it had a sandbox or closed the log."""
    run_id, thread_id = unique("run-"), unique("thr-")
    opts = {"journal": str(CORPUS / LONG), "speed": 1.0, "delay": 0.0}
    rec, _ = await c.cc.create_or_resume_run(runs_pb2.RunRecord(
        run_id=run_id, thread_id=thread_id, status=runs_pb2.RUN_STATUS_RUNNING,
        agent=runs_pb2.AgentSpec(kind="replay", options_json=json.dumps(opts))))
    first = await c.cc.open_session(ttl=2, owner="first-host")
    epoch, rec = await c.cc.claim_run(run_id, first, "first-host", purpose="drive")
    w = c.log.writer(run_id, epoch)
    await w.fence()
    await w.append([{"type": "RUN_STARTED", "threadId": thread_id, "runId": run_id}], origin="journal")
    await w.append([accepted_chunk(rec.run_id, rec.thread_id, rec.agent.kind, USER)], origin="host")
    if tail is not None:
        await w.append(tail(run_id, thread_id), origin="journal")
    await first.close()
    return run_id, thread_id


async def _assert_aborted_with_input(c: Cluster, run_id: str, thread_id: str, epoch: int) -> None:
    chunks = [ch for _, ch in await c.read_all(run_id, timeout=30)]
    assert chunks[-1] == {"type": "RUN_ERROR", "message": "run cancelled (user)", "code": "cancelled"}
    done = await c.wait_status(run_id, "aborted")
    assert done.driver_epoch == epoch
    msgs, _ = await c.transcripts.load(thread_id)
    assert msgs == USER


async def test_cancel_seen_while_the_successor_loads_the_run_input_keeps_the_users_messages(
        hostless: Cluster) -> None:
    c = hostless
    run_id, thread_id = await _orphan(c)
    session = await c.cc.open_session(ttl=2, owner="successor")
    try:
        deps = _FirstInputReadHangs(host_id="successor", cc=c.cc, session=session, log=c.log,
                                    transcripts=c.transcripts, providers={}, settings=HostSettings(cancel_grace=1.0))
        epoch2, rec2 = await c.cc.claim_run(run_id, session, "successor", purpose="drive")
        driver = RunDriver(deps, rec2, epoch2, "attach", c.log.writer(run_id, epoch2))
        running = asyncio.create_task(driver.run())
        async with asyncio.timeout(30):
            await deps.held.wait()  # the body is inside the read now
        await c.cc.request_run_cancel(run_id, reason="user")
        async with asyncio.timeout(30):
            await running
    finally:
        await session.close()
    await _assert_aborted_with_input(c, run_id, thread_id, epoch2)


class _ReadSwallowsTheCancel(HostDeps):
    """The body's read of the stored log (with the run input) answers, then holds until
    cancelled and swallows that cancel (as a client library's ``wait_for`` does on Python
    3.11 when its inner read completed in the same loop turn), so the body goes on to its
    own decision after the driver's."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.held = asyncio.Event()

    async def stored_before_fence(self, run_id: str, fenced_over: int) -> tuple[list[Any], dict[int, bytes]]:
        body = await super().stored_before_fence(run_id, fenced_over)
        if not self.held.is_set():
            self.held.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                pass
        return body


class _WatchOnceHeld:
    """The coordinator client, whose ``WatchRun`` starts once the body holds in its read."""

    def __init__(self, cc: Any, held: asyncio.Event) -> None:
        self._cc, self._held = cc, held

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cc, name)

    async def watch_run(self, run_id: str) -> AsyncIterator[Any]:
        await self._held.wait()
        async for ev in self._cc.watch_run(run_id):
            yield ev


async def test_finalize_whose_body_decides_after_the_watched_cancel_still_finishes_the_run(
        hostless: Cluster) -> None:
    # The 30 s hang of test_cancel_of_a_run_whose_host_died_is_carried_out_by_another: the
    # body, whose cancel was swallowed, returned the machine's CONTINUE after the driver had
    # decided the cancel, and the driver executed that CONTINUE: nothing written, claim held.
    c = hostless
    run_id, thread_id = await _orphan(c)
    await c.cc.request_run_cancel(run_id, reason="user")
    session = await c.cc.open_session(ttl=2, owner="successor")
    try:
        held = asyncio.Event()
        deps = _ReadSwallowsTheCancel(host_id="successor", cc=_WatchOnceHeld(c.cc, held), session=session,
                                      log=c.log, transcripts=c.transcripts, providers={},
                                      settings=HostSettings(cancel_grace=1.0))
        deps.held = held
        epoch2, rec2 = await c.cc.claim_run(run_id, session, "successor", purpose="finalize")
        driver = RunDriver(deps, rec2, epoch2, "finalize", c.log.writer(run_id, epoch2),
                           cancel_reason=rec2.cancel_reason or None)
        async with asyncio.timeout(30):
            await driver.run()
    finally:
        await session.close()
    assert driver.stats.outcome == "aborted"
    await _assert_aborted_with_input(c, run_id, thread_id, epoch2)
