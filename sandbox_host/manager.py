"""The run driver of a sandbox host: fresh runs, takeovers, cancels, drain (docs/design.md §5.5).

:class:`RunManager` owns every :class:`~sandbox_host.driver.RunDriver` of the host (a per-run
dict of tasks, drained on shutdown); :class:`HostDeps` bundles the clients and settings a
driver needs, built once by the composition root (``sandbox_host.__main__``).

What a reader sees: a fresh start appends ``CUSTOM run.accepted`` (origin ``host``, it
carries the run input's messages) and then the translator's chunks; a takeover appends no
host chunk of its own, only the replay's new suffix. So a reader connected through any
number of takeovers receives exactly the chunk sequence of the same run without one.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any, Iterator

from baton import config
from baton.telemetry import bind_fields
from baton.errors import (
    HostAtCapacity, HostDraining, InvalidArgument, JournalAttachUnavailable, RunClaimLost,
    RunClaimNotAcquired, SessionLost,
)
from baton.ids import validate_id
from baton.retry import Deadline
from baton.v1 import runs_pb2
from sandbox_host import machine as M
from baton.runs import record_status
from sandbox_host import run_trace, turns
from sandbox_host.deps import HostDeps
from sandbox_host.driver import Mode, RunDriver
from sandbox_host.manager_claims import HOLDER_WAIT, ClaimUpkeep


#: Largest input (``messages``, compact JSON bytes) a run accepts: it is stored in the
#: ``run.accepted`` chunk, one delivery-log message, with room left for the rest of the chunk.
MAX_MESSAGES_BYTES = 768 * 1024

log = logging.getLogger("baton.sandbox_host.manager")


def _parse_messages(messages_json: str) -> list[dict[str, Any]]:
    """The run input's messages from ``StartRunRequest.messages_json``.

    Raises:
        InvalidArgument: not a JSON array of objects, a lone surrogate, or over
            :data:`MAX_MESSAGES_BYTES` as compact JSON.
    """
    try:
        messages = json.loads(messages_json or "[]")
    except ValueError:
        raise InvalidArgument("messages_json", "must be a JSON array") from None
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise InvalidArgument("messages_json", "must be a JSON array of message objects")
    try:
        size = len(json.dumps(messages, separators=(",", ":"), ensure_ascii=False).encode())
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 store can hold it
        raise InvalidArgument("messages_json", "must not contain a lone surrogate") from None
    if size > MAX_MESSAGES_BYTES:
        # They travel in the run.accepted chunk, one delivery-log message (NATS refuses
        # messages over max_payload, 1 MiB by default), where a successor reads them back.
        raise InvalidArgument("messages_json", f"is {size} bytes of JSON; at most {MAX_MESSAGES_BYTES}")
    return messages


class _Phases:
    """Seconds spent in each step of a start, for the host's log (where a slow start's time goes)."""

    def __init__(self) -> None:
        self._t0 = self._last = time.monotonic()
        self._steps: list[tuple[str, float]] = []

    def mark(self, step: str) -> None:
        now = time.monotonic()
        self._steps.append((step, now - self._last))
        self._last = now

    def __str__(self) -> str:
        steps = " ".join(f"{k}={v:.3f}" for k, v in self._steps)
        return f"{self._last - self._t0:.3f}s ({steps})"


class RunManager:
    """Every run this host drives: start, attach, cancel, drain, shutdown.

    Args:
        deps: the host's shared clients and settings.
    """

    def __init__(self, deps: HostDeps) -> None:
        self.deps = deps
        self.draining = False
        self._drivers: dict[str, RunDriver] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._finished: list[RunDriver] = []
        self._reserved = 0  # slots taken by a StartRun/AttachRun between its check and its spawn
        # Starts in progress by run id: a StartRun of a run id this host is starting joins it.
        self._starting: dict[str, asyncio.Task[tuple[runs_pb2.RunRecord, bool]]] = {}
        # Attaches in progress by run id: an AttachRun of a run id this host is attaching joins it.
        self._attaching: dict[str, asyncio.Task[tuple[int, runs_pb2.RunRecord]]] = {}
        #: The claims of this host no driver holds: released, followed, superseded.
        self.claims = ClaimUpkeep(deps, self._drivers, self._tasks)

    @property
    def load(self) -> int:
        """How many runs this host drives now."""
        return sum(1 for t in self._tasks.values() if not t.done())

    @contextlib.contextmanager
    def _slot(self) -> Iterator[None]:
        """Hold one unit of capacity from the check until the driver is spawned (or failed).

        The check and the reservation happen with no ``await`` between them, so concurrent
        requests cannot overshoot ``settings.capacity`` (docs/design.md §9 ``BATON_HOST_CAPACITY``).

        Raises:
            HostAtCapacity: the host already drives (or is starting) ``capacity`` runs.
        """
        capacity = self.deps.settings.capacity
        if capacity > 0 and self.load + self._reserved >= capacity:
            raise HostAtCapacity(self.deps.host_id, capacity)
        self._reserved += 1
        try:
            yield
        finally:
            self._reserved -= 1

    def driver(self, run_id: str) -> RunDriver | None:
        return self._drivers.get(run_id)

    def _spawn(self, driver: RunDriver) -> None:
        run_id = driver.run_id
        task = asyncio.create_task(driver.run(), name=f"run:{run_id}")
        self._drivers[run_id] = driver
        self._tasks[run_id] = task

        def done(t: "asyncio.Task[None]") -> None:
            if self._tasks.get(run_id) is t:
                del self._tasks[run_id]
                self._drivers.pop(run_id, None)
            if not t.cancelled() and t.exception() is not None:
                log.error("run %s: driver crashed", run_id, exc_info=t.exception())

        task.add_done_callback(done)

    def _busy(self, run_id: str) -> bool:
        t = self._tasks.get(run_id)
        d = self._drivers.get(run_id)
        # A driver releasing its claim writes nothing more: the run may be taken again
        # (failover may hand a let-go run back to this host at once).
        return t is not None and not t.done() and not (d is not None and d.releasing)

    async def start_run(self, req: Any) -> tuple[runs_pb2.RunRecord, bool]:
        """``StartRun``: create (or resume) the record, claim, fence, ``run.accepted``.

        Start is atomic as the rest of the cluster sees it, and idempotent by run id:

        * The record is created ``starting`` (``RunRecord.starting``): while it is, failover,
          gateway takeovers and the reaper never hand the run to a host to *drive* (hosts
          refuse such an ``AttachRun``), so nobody can launch an agent for it before its
          input is durable.
        * This host then claims, fences, appends ``RUN_STARTED`` and ``run.accepted`` (the
          input), and clears ``starting`` by an owner write fenced by its claim. Only then
          is the driver spawned: a run still ``starting`` never had an agent.
        * When any step fails the claim is released (retried until it lands or the session
          is lost) and the error raised; the run stays ``starting``. A retried ``StartRun``
          with the same run id (on any host) resumes it: it claims anew, appends only what
          the log lacks (the first stored input wins) and clears ``starting``. A retry
          while another start of it holds the claim follows that start: it joins once the
          run started (or ended), and resumes it when that claim goes first (up to
          :data:`~sandbox_host.manager_claims.HOLDER_WAIT` seconds, then it joins); a retry
          reaching the host that is still starting it awaits that start.
        * A start that finishes after the host's session was lost spawns no driver: the
          run is started, and the failover hands it over once the claim lapses.
        * A start nobody retries (its gateway or host died) is ended by the reaper after
          its start grace: cancel, then a ``finalize`` attach (``aborted``, no agent).

        The alternatives were rejected: the input in the etcd record (up to 768 KiB per
        record write, for every run) costs etcd far more than one small write; ending a
        failed start as ``failed`` at once would turn a 3-second NATS pause into failed
        runs a retry could not start.

        Returns:
            (record, started): ``started`` is false when the run existed already and this
            call started nothing (the caller joins it).

        Raises:
            HostDraining: the host takes no new runs.
            HostAtCapacity: the host already drives ``settings.capacity`` runs.
            InvalidArgument: bad ids, messages or agent options.
            ThreadBusy, RunClaimNotAcquired, StoreUnavailable, LogUnavailable: from below;
                after ``StoreUnavailable``/``LogUnavailable`` from the claim on, the run
                exists, ``starting``, and a retry with the same run id starts it.
        """
        if self.draining:
            raise HostDraining("host is draining")
        inflight = self._starting.get(req.run_id)
        if inflight is not None:
            # The same run id is being started here (its caller's deadline passed under load
            # and the gateway asks again): wait for that start; this call starts nothing. The
            # gateway checks the record's thread and tenant as for any existing run.
            record, _ = await asyncio.shield(inflight)
            return record, False
        # A start once begun runs to its end even when the caller goes away (its gateway
        # died, its deadline passed): cancelled half-way it could leave a claim that no
        # driver holds (the claim landed, the answer did not), which nobody would release.
        task = asyncio.create_task(self._start_in_slot(req), name=f"start:{req.run_id}")
        self._starting[req.run_id] = task
        task.add_done_callback(lambda t: self._start_done(req.run_id, t))
        return await asyncio.shield(task)

    def _start_done(self, run_id: str, task: "asyncio.Task[tuple[runs_pb2.RunRecord, bool]]") -> None:
        if self._starting.get(run_id) is task:
            del self._starting[run_id]
        if not task.cancelled() and task.exception() is not None:
            log.info("start %s failed: %r", task.get_name(), task.exception())  # also told to the caller

    async def _start_in_slot(self, req: Any) -> tuple[runs_pb2.RunRecord, bool]:
        bind_fields(run_id=req.run_id, thread_id=req.thread_id)  # its own task: the start's lines
        with contextlib.nullcontext() if self._busy(req.run_id) else self._slot():  # joins a run driven here
            session = self.deps.session
            try:
                return await self._start_run(req)
            except (RunClaimLost, SessionLost):
                lost = getattr(session, "lost", None)
                if lost is None or not lost.is_set():
                    raise
            # The host's session expired mid-start (a pause past its lease): the run is
            # still ``starting``; resume it once under the session the host opens next.
            await self._next_session(session)
            return await self._start_run(req)

    async def _next_session(self, old: Any, timeout: float = 10.0) -> None:
        """Wait (polling, bounded) until the host holds a live session other than ``old``.

        Raises:
            SessionLost: none within ``timeout`` seconds.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.deps.session is old or self.deps.session.lost.is_set():
            if loop.time() >= deadline:
                raise SessionLost(getattr(old, "id", 0))
            await asyncio.sleep(0.05)

    async def _start_run(self, req: Any) -> tuple[runs_pb2.RunRecord, bool]:
        """One attempt of a start: its steps, each small (see :meth:`start_run`)."""
        if self.draining:
            raise HostDraining("host is draining")
        messages, seed = self._start_input(req)
        # Where a thread's claude-code/codex run starts (its workspace snapshot, the agent
        # session to resume), decided once, before the record exists, and recorded on it.
        seed.workspace_json, seed.turn_json = await turns.plan_start(self.deps, req, seed.agent.kind,
                                                                     seed.workspace_json)
        # One session for the whole start: the claim, the clear and the driver live under it.
        # The host replaces ``deps.session`` when it is lost, and a write under the new one
        # would compare against a claim the old one made.
        session = self.deps.session
        clock = _Phases()
        record, created = await self.deps.cc.create_or_resume_run(seed, interrupt_active=req.interrupt_active)
        clock.mark("create")
        if not self._ours_to_start(req, record, created):
            return record, False
        claim_ns = run_trace.now_ns()
        claimed = await self._claim_to_start(req, session)
        if isinstance(claimed, runs_pb2.RunRecord):
            return claimed, False  # joined: another start (or its finalizer) has it
        epoch, record, mode = claimed
        run_trace.claimed(self.deps.host_id, record, epoch, mode, claim_ns)
        bind_fields(epoch=epoch)
        clock.mark("claim")
        writer = self.deps.log.writer(req.run_id, epoch)
        record, fence_seq, opened, messages = await self._make_input_durable(
            record, writer, session, messages, created=created, clock=clock)
        if session.lost.is_set():
            # The session was lost while the start was in flight (the clear landed before its
            # lease lapsed in etcd): the host told its drivers to stop before this one existed,
            # so a driver spawned now would never hear it, and would sit in this host's
            # drivers with no claim (the host then refused the failover's AttachRun
            # of this very run as ``held``, and the run never ended). The run is started (its
            # input is durable, ``starting`` is cleared); its claim goes with the lease, and
            # failover hands it to a live host, this one included.
            log.info("run %s: session %x lost during the start; the run is left to failover", req.run_id,
                     session.id)
            return record, True
        # No await from the check above to the spawn: a session lost from now on reaches
        # this driver through session_lost().
        self._spawn(RunDriver(self.deps, record, epoch, mode, writer, input_messages=messages, fence_seq=fence_seq,
                              cancel_reason=record.cancel_reason or None, opened=opened))
        log.info("run %s started in %s (load %d)", req.run_id, clock, self.load)
        return record, True

    def _start_input(self, req: Any) -> tuple[list[dict[str, Any]], runs_pb2.RunRecord]:
        """Check a ``StartRunRequest``: the run input's messages and the record to seed.

        Raises:
            InvalidArgument: bad ids, messages or agent options, or an agent needing a
                credential this host lacks (refused up front, before any record exists).
        """
        from sandbox_host.agents import prepare_agent, prompt_from_messages

        validate_id(req.run_id, "run_id")
        validate_id(req.thread_id, "thread_id")
        messages = _parse_messages(req.messages_json)
        kind = req.agent.kind or config.get("BATON_DEFAULT_AGENT")
        try:
            options = json.loads(req.agent.options_json or "{}")
        except ValueError:
            raise InvalidArgument("agent.options", "must be a JSON object") from None
        launch = prepare_agent(kind, options, prompt=prompt_from_messages(messages))
        self.deps.agent_secrets(launch, req.tenant)
        workspace_json = self.deps.check_workspace(req)  # likewise: a bad workspace, an unknown credential
        # No started_at: the coordinator stamps it with its clock (it times the reaper's start
        # grace, so it must not come from whichever host started the run: hosts' clocks may
        # disagree). The coordinator also numbers the run in its thread (thread_seq), which
        # is what orders a thread's runs (the transcript fence), never a clock.
        seed = runs_pb2.RunRecord(
            run_id=req.run_id, thread_id=req.thread_id, status=runs_pb2.RUN_STATUS_RUNNING,
            agent=runs_pb2.AgentSpec(kind=kind, options_json=json.dumps(dict(launch.options))),
            cancel_on_disconnect=req.cancel_on_disconnect, keep_sandbox=req.keep_sandbox, tenant=req.tenant,
            parent_run_id=req.parent_run_id, driver_host=self.deps.host_id, starting=True,
            workspace_json=workspace_json, trace_parent=run_trace.start_trace_parent())
        return messages, seed

    def _ours_to_start(self, req: Any, record: runs_pb2.RunRecord, created: bool) -> bool:
        """Whether this call starts the run (else it joins it as it is)."""
        if created:
            return True
        if not (record.starting and record_status(record) == "running"
                and record.thread_id == req.thread_id and record.tenant == req.tenant):
            # Started already (join it), or not this caller's run: the gateway checks the
            # record it gets back and refuses another tenant's or thread's run.
            return False
        return not self._busy(req.run_id)

    async def _claim_to_start(self, req: Any, session: Any) -> tuple[int, runs_pb2.RunRecord, Mode] | runs_pb2.RunRecord:
        """Claim the run to start it.

        Returns:
            ``(epoch, record, mode)``: ``fresh``, or ``finalize`` when it was cancelled
            between its creation and this claim (it still ends ``aborted``, by us); or the
            record to join, when another start holds it and started (or ended) it, or it ended.

        Raises:
            RunClaimNotAcquired: refused for another reason.
        """
        deps = self.deps
        mode: Mode = "fresh"
        holder_wait = Deadline.after(HOLDER_WAIT)
        purpose: Any = "drive"
        while True:
            try:
                epoch, record = await deps.cc.claim_run(req.run_id, session, deps.host_id, purpose=purpose)
                return epoch, record, mode
            except RunClaimNotAcquired as refused:
                if refused.reason == "held":
                    # Another start of it holds it: a retry that came first, its finalizer
                    # (a cancel's), or a start whose host lost its session after the input
                    # was durable (its claim lapses with the lease). Join it once it started
                    # or ended; take it over when its claim goes first.
                    joined = await self.claims.once_started(req.run_id, holder_wait)
                    if joined is not None:
                        return joined
                    continue
                if refused.reason == "terminal":
                    return (await deps.cc.get_run(req.run_id)).record
                if refused.reason != "cancel_requested" or purpose == "finalize":
                    raise
                # Cancelled between create and claim: still ends aborted, by us (or joined,
                # when another finalizer's claim comes first: the loop's ``held``).
                purpose = mode = "finalize"
            except BaseException:
                # The claim may have landed with its answer lost (a timeout): a claim no
                # driver holds would keep the run from every retry until the host died. Not
                # while an attach of the run on this host is in flight: the claim may be that
                # attach's, not yet driven (it releases its own when it fails).
                if req.run_id not in self._attaching:
                    await asyncio.shield(self.claims.release_if_mine(req.run_id, session))
                raise

    async def _make_input_durable(
        self, record: runs_pb2.RunRecord, writer: Any, session: Any, messages: list[dict[str, Any]], *,
        created: bool, clock: _Phases,
    ) -> tuple[runs_pb2.RunRecord, int, list[Any], list[dict[str, Any]]]:
        """Under the claim: fence, open the log with the run input, clear ``starting``. On
        any failure the claim is released (retried while the session lives) and the error raised.

        Returns:
            (the record, the fence's sequence, the stored opening records, the run input).
        """
        run_id = record.run_id
        self.claims.start_claims.add(run_id)
        try:
            fence_seq = await writer.fence()
            clock.mark("fence")
            opened, messages = await self._open_log(record, writer, fence_seq, messages, fresh_record=created)
            clock.mark("accepted")
            # The input is durable: from here on anyone may take the run over. The same write
            # names the provider of its sandbox (none exists yet), so a successor of a host that
            # dies before registering the sandbox builds on that provider, not its own.
            _, cleared = await self.deps.cc.update_run(
                run_id, runs_pb2.RunRecord(starting=False, sandbox_provider=self.deps.settings.provider),
                ["starting", "sandbox_provider"], epoch=writer.epoch, session_id=session)
            clock.mark("clear")
        except BaseException:
            await asyncio.shield(self.claims.release(run_id, session, writer.epoch))
            raise
        finally:
            self.claims.start_claims.discard(run_id)
        return (cleared if cleared is not None else record), fence_seq, opened, messages

    async def _open_log(self, record: runs_pb2.RunRecord, writer: Any, fence_seq: int,
                        messages: list[dict[str, Any]], *, fresh_record: bool) -> tuple[list[Any], list[dict[str, Any]]]:
        """Make the log open with ``RUN_STARTED`` then ``run.accepted``; append what it lacks.

        The log opens with the translator's RUN_STARTED (origin journal: a replay on any
        host reproduces it at index 0), then the host's run.accepted, so a joiner sees
        bytes before the sandbox exists and the stream still starts with RUN_STARTED, as
        the AG-UI verifier requires. A resumed start (an earlier attempt failed half-way)
        may find either already stored; a stored ``run.accepted`` is the run's input, even
        if the retry carried other messages.

        Returns:
            (the stored journal-origin opening records, the run input's messages).

        Raises:
            LogUnavailable: JetStream did not answer.
            RunClaimLost: a higher epoch fenced the log meanwhile.
        """
        from baton.fingerprint import fingerprint
        from baton.log import StoredRecord

        deps, run_id = self.deps, record.run_id
        stored = [] if fresh_record else [
            r for r in await deps.log.stored_headers(run_id, before=fence_seq) if r.kind == "chunk"]
        host = next((r for r in stored if r.origin == "host"), None)
        opened: list[Any] = [r for r in stored if r.origin == "journal" and (host is None or r.offset < host.offset)]
        if not opened and host is None:
            opening = deps.translator(record, run_id).start()
            offsets = await writer.append(opening, origin="journal")
            opened = [StoredRecord(int(off), "chunk", writer.epoch, "journal", fingerprint(c))
                      for off, c in zip(offsets, opening)]
        if host is None:
            from sandbox_host.thread_session import TurnStart

            turn = TurnStart.from_json(record.turn_json)
            await writer.append([M.accepted_chunk(run_id, record.thread_id, record.agent.kind, messages,
                                                  turn.lost if turn is not None else None)], origin="host")
            return opened, messages
        body = await deps.read_chunk(run_id, host.offset)
        value = body.get("value") if isinstance(body, dict) else None
        if isinstance(value, dict) and isinstance(value.get("messages"), list):
            messages = list(value["messages"])
        return opened, messages

    async def attach_run(self, run_id: str, purpose: str = "drive") -> tuple[int, runs_pb2.RunRecord]:
        """``AttachRun``: claim the run; fence, replay, align and drive in the background.

        Purpose ``finalize`` (carry out a cancel or a reap) is taken even at capacity: it
        ends quickly, and a cancelled run must end ``aborted`` even when every host is full.

        An attach once begun runs to its end even when its caller goes away, as a start
        does: the coordinator's failover gives each host 5 s, and a host busy under load
        answered later. Cancelled with the caller, the attach left a claim whose answer
        came after the cancel and that no driver held; the failover then found the run
        ``held`` on every other host, and the run waited for ever (the
        unfinished runs of the 200-run bench). An ``AttachRun`` of a run this host is
        attaching already joins that attach. Whether the run is ``held`` is the claim's
        answer, never this host's own drivers': a driver of the run still running here
        under an older claim (its session lapsed) is stopped once the new claim landed
        (:meth:`ClaimUpkeep.supersede`).

        Raises:
            HostDraining: the host takes no new runs.
            HostAtCapacity: ``drive`` while the host already drives ``settings.capacity`` runs.
            JournalAttachUnavailable: ``unknown-run`` or ``terminal-run``, at once.
            RunClaimNotAcquired: a live claim holds the run (``held``; this host's own
                included) etc.
            SessionLost: the host's session was lost before the driver could start.
            ProviderUnreachable: the run's sandbox is on a provider this host cannot reach
                (its claim released: another host may take the run).
        """
        if self.draining:
            raise HostDraining("host is draining")
        inflight = self._attaching.get(run_id)
        if inflight is not None:
            return await asyncio.shield(inflight)
        task = asyncio.create_task(self._attach_in_slot(run_id, purpose), name=f"attach:{run_id}")
        self._attaching[run_id] = task
        task.add_done_callback(lambda t: self._attach_done(run_id, t))
        return await asyncio.shield(task)

    def _attach_done(self, run_id: str, task: "asyncio.Task[tuple[int, runs_pb2.RunRecord]]") -> None:
        if self._attaching.get(run_id) is task:
            del self._attaching[run_id]
        if not task.cancelled() and task.exception() is not None:
            log.debug("attach %s failed: %r", run_id, task.exception())  # also told to the caller

    async def _attach_in_slot(self, run_id: str, purpose: str) -> tuple[int, runs_pb2.RunRecord]:
        bind_fields(run_id=run_id)  # its own task: the attach's lines
        if purpose == "finalize":
            return await self._attach_run(run_id, purpose)
        with self._slot():
            return await self._attach_run(run_id, purpose)

    async def _attach_run(self, run_id: str, purpose: str) -> tuple[int, runs_pb2.RunRecord]:
        validate_id(run_id, "run_id")
        purpose = purpose or "drive"
        if purpose not in ("drive", "finalize"):
            raise InvalidArgument("purpose", "must be drive or finalize")
        deps = self.deps
        session = deps.session
        asked_ns = run_trace.now_ns()
        await self.claims.refuse_unreachable(run_id)
        # No read of the record first: the claim itself refuses an unknown, ended or (for
        # drive) still starting run, inside its write. (Read first, then claimed, cost one
        # more coordinator and etcd round trip per takeover.) Nor is a driver of the run on
        # this host taken as an answer: the claim in etcd says whether the run is held. A
        # driver here may hold no claim any more (its session lapsed, and it has not seen it
        # yet); refused as ``held`` from that belief, the failover took the run for driven
        # and never offered it again (two runs of the 200-run bench never ended).
        try:
            try:
                epoch, record, entry = await deps.cc.claim_run_with_sandbox(
                    run_id, session, deps.host_id, purpose=purpose, require_started=purpose == "drive")
            except RunClaimNotAcquired as refused:
                if refused.reason == "cancel_requested" and purpose == "drive":
                    epoch, record, entry = await deps.cc.claim_run_with_sandbox(run_id, session, deps.host_id, "finalize")
                    purpose = "finalize"
                elif refused.reason == "unknown":
                    raise JournalAttachUnavailable(run_id, "unknown-run") from None
                elif refused.reason == "terminal":
                    raise JournalAttachUnavailable(run_id, "terminal-run") from None
                else:
                    raise
        except (RunClaimNotAcquired, JournalAttachUnavailable, SessionLost):
            raise  # nothing claimed
        except BaseException:
            # The claim may have landed with its answer lost (a timeout under load): a
            # claim no driver holds would keep the run from every other host.
            await asyncio.shield(self.claims.release_if_mine(run_id, session))
            raise
        if session.lost.is_set():
            # Lost while the claim was in flight: the claim went with the lease, and the
            # drivers were told to stop before this one existed. Failover hands the run
            # to a host with a session (the claim's deletion reports it).
            raise SessionLost(session.id)
        sandbox_read = await self.claims.sandbox_of(  # ProviderUnreachable: released
            record, session, epoch, builds=purpose == "drive" and not record.cancel_requested, entry=entry)
        await self.claims.supersede(run_id, epoch)
        if session.lost.is_set():
            raise SessionLost(session.id)
        mode: Mode = "finalize" if purpose == "finalize" else "attach"
        run_trace.claimed(deps.host_id, record, epoch, mode, asked_ns)
        bind_fields(thread_id=record.thread_id, epoch=epoch)
        # No await from the check above to here: a session lost from now on reaches this
        # driver through session_lost().
        self._spawn(RunDriver(deps, record, epoch, mode, deps.log.writer(run_id, epoch),
                              cancel_reason=record.cancel_reason or None, sandbox_read=sandbox_read))
        return epoch, record

    def cancel(self, run_id: str, reason: str = "user") -> bool:
        """In-process fast path of a cancel; ``True`` when this host drives the run."""
        d = self._drivers.get(run_id)
        if d is None or not self._busy(run_id):
            return False
        return d.post(M.CancelRequested(reason=reason or "user", path="fast"))

    def session_lost(self) -> None:
        """The host's session expired: every driver stops without writing."""
        for d in list(self._drivers.values()):
            d.post(M.SessionLost())

    async def drain(self, timeout: float = 10.0) -> list[str]:
        """Stop taking runs and hand every driven run over (claims released, nothing final).

        Returns:
            The run ids handed over.
        """
        self.draining = True
        handed: list[str] = []
        tasks = []
        for run_id, d in list(self._drivers.items()):
            if self._busy(run_id) and d.post(M.Drain()):
                handed.append(run_id)
                tasks.append(self._tasks[run_id])
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
        return handed

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Cancel every start and driver (final writes in flight still finish) and await them."""
        tasks = [*self._starting.values(), *self._attaching.values(), *self._tasks.values()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
