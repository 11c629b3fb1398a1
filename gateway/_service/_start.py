"""Starting a run: on a live host, idempotently by run id, or joining the run that id names.

The start path of the run service (:meth:`gateway._service.RunService.start`), whatever the
edge: a retried start or a transport reconnect serves the existing run and starts nothing;
a run whose start failed half-way (still ``starting``) is resumed by the next host.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Awaitable

from opentelemetry.trace import SpanKind

from baton import errors as e, telemetry
from baton.coordinator_client import RunView
from baton.retry import Deadline
from baton.runs import TERMINAL_PB
from baton.v1 import coordinator_pb2, runs_pb2, sandbox_host_pb2
from gateway._auth import check_run_visible
from gateway._errors import NoHostAvailable, StartFailed, mapping_for
from gateway._hosts import RPC_TIMEOUT, HostTimedOut, try_hosts
from gateway._service._requests import StartRequest
from gateway._service._views import thread_visible_for
from gateway._state import GatewayState

log = logging.getLogger("gateway.start")

#: Seconds a start may keep asking live hosts that are slow to answer (:func:`start_on`).
START_BUDGET = 60.0
#: Seconds a start's reads of the coordinator may take (its default is 5 s): a coordinator
#: busy with a burst of starts (200 at once on replicated etcd took longer) is slow, not
#: gone; one that is gone refuses the connection at once, whatever the timeout.
START_READ_TIMEOUT = 20.0
#: Seconds the read of a run that a start failed on every host may have started takes at most
#: (it runs inside the start's admission slot, after a start of 10 s or more already).
JOIN_LOOKUP_TIMEOUT = 5.0
#: Seconds a start waits for the thread's previous run to write its terminal status once that
#: run's log is closed.
FINISHING_WAIT = 5.0


def host_request(req: StartRequest, tenant_id: str) -> sandbox_host_pb2.StartRunRequest:
    """The host's ``StartRunRequest`` for a start (a new start field is passed on here)."""
    return sandbox_host_pb2.StartRunRequest(
        run_id=req.run_id,
        thread_id=req.thread_id,
        agent=runs_pb2.AgentSpec(kind=req.agent.kind, options_json=req.agent.to_json()),
        messages_json=json.dumps(req.messages, separators=(",", ":")),
        cancel_on_disconnect=req.cancel_on_disconnect,
        tenant=tenant_id,
        interrupt_active=req.interrupt_active,
        parent_run_id=req.parent_run_id,
        workspace_json=req.workspace.to_record() if req.workspace is not None else "",
    )


async def open_start(st: GatewayState, req: StartRequest, tenant_id: str, after: str) -> str:
    """:func:`_open_start`, timed and counted by outcome (``baton_gateway_start*``)."""
    t0 = time.monotonic()
    try:
        served, started = await _open_start(st, req, tenant_id, after)
    except e.BatonError as exc:
        m = mapping_for(exc.cause if isinstance(exc, StartFailed) else exc)
        st.metrics.starts.labels(m.reason if m is not None else "INTERNAL").inc()
        st.metrics.start_seconds.labels("failed").observe(time.monotonic() - t0)
        raise
    outcome = "started" if started else "joined"
    st.metrics.starts.labels(outcome).inc()
    st.metrics.start_seconds.labels(outcome).observe(time.monotonic() - t0)
    return served


async def _open_start(st: GatewayState, req: StartRequest, tenant_id: str, after: str) -> tuple[str, bool]:
    """Start the run on a host, or, when the run id exists (a retry or a reconnect), check it
    is the caller's run of the same thread and start nothing (the takeover trigger looks at
    it as a join would).

    Args:
        after: the offset to serve from when the run exists (``-1``: from the start).

    Returns:
        Where to serve the log from, and whether this call started the run.

    Raises:
        UnknownRun, UnknownThread, InvalidArgument, ThreadBusy, NoHostAvailable, StartFailed, …
    """
    try:
        view = await st.coordinator.get_run(req.run_id, timeout=START_READ_TIMEOUT)
    except e.UnknownRun:
        view = None
    if view is not None and not view.record.starting:
        # A retried POST or a transport reconnect: serve the existing run, start nothing.
        _check_same_run(view.record, req, tenant_id, st.settings.auth_enabled)
        st.takeovers.consider(req.run_id, view.record, view.claim)
        return after, False
    # No run, or one whose start failed half-way (still ``starting``): StartRun creates or
    # resumes it, idempotently by run id; a start in progress elsewhere is joined.
    if view is not None:
        _check_same_run(view.record, req, tenant_id, st.settings.auth_enabled)
    else:
        await thread_visible_for(st, tenant_id, req.thread_id, must_exist=False)
    try:
        await _check_log_stores(st, req.run_id)
    except e.LogUnavailable as exc:
        raise StartFailed(exc, view is not None) from exc
    # The run's trace starts here (or continues the caller's): the host stores this span's
    # context on the record, and every host that drives the run later continues it.
    span = telemetry.run_span("run.start", None, {"baton.run_id": req.run_id, "baton.thread_id": req.thread_id},
                              kind=SpanKind.SERVER)
    with telemetry.in_span(span):
        record = await _start_or_explain(st, req, tenant_id)
        span.set_attribute("baton.host", record.driver_host)
    # A concurrent start with the same run id may have created the record between our lookup
    # and StartRun (the host then answers with that record, unchanged): the same checks as
    # for a record found above, or another tenant's or thread's log is served.
    _check_same_run(record, req, tenant_id, st.settings.auth_enabled)
    return "-1", True


def _check_same_run(record: runs_pb2.RunRecord, req: StartRequest, tenant_id: str, auth_enabled: bool) -> None:
    """An existing record may be served to this start only if it is the caller's run.

    Raises:
        UnknownRun: the record belongs to another tenant (they must not learn it exists).
        InvalidArgument: the run id already names a run of another thread.
    """
    check_run_visible(record, tenant_id, auth_enabled)
    if record.thread_id != req.thread_id:
        raise e.InvalidArgument("runId", "already names a run of another thread")


async def _start_run(st: GatewayState, req: StartRequest, tenant_id: str) -> runs_pb2.RunRecord:
    return await start_host_request(st, host_request(req, tenant_id))


async def start_host_request(st: GatewayState, host_req: sandbox_host_pb2.StartRunRequest) -> runs_pb2.RunRecord:
    """``StartRun`` of ``host_req`` on a live host (the next one on a host's trouble), once
    this gateway's admission control gives it a slot (gateway/_admission.py); a thread whose
    previous run is finishing is waited for (:func:`run_finishing`).

    Raises:
        TooManyStarts: no start slot (nothing was created).
        ThreadBusy, NoHostAvailable, and the host's other errors.
    """
    hosts = await st.hosts.live_hosts(timeout=START_READ_TIMEOUT)
    _refuse_when_full(st, hosts)
    asked = time.monotonic()
    async with st.admission.slot(host_req.tenant, len(hosts)):
        if time.monotonic() - asked > 1.0:  # it waited its turn: the hosts may have changed
            hosts = await st.hosts.live_hosts(timeout=START_READ_TIMEOUT)
        return await _start_admitted(st, host_req, hosts)


def _refuse_when_full(st: GatewayState, hosts: list[coordinator_pb2.HostInfo]) -> None:
    """Refuse a start at once when the hosts have no room left for it: their published load
    plus the starts in flight and those already waiting take every run they may drive
    (waiting for a slot would only end in ``HOST_AT_CAPACITY`` later).

    Raises:
        HostAtCapacity: no room (``host_id`` names the fullest host, ``capacity`` the total).
    """
    if not hosts or any(h.capacity <= 0 for h in hosts):
        return
    room = sum(max(0, h.capacity - h.load - st.hosts.in_flight[h.host_id]) for h in hosts)
    if room <= st.admission.waiting:
        fullest = max(hosts, key=lambda h: (h.load, h.host_id))
        raise e.HostAtCapacity(fullest.host_id, sum(h.capacity for h in hosts))


async def _start_admitted(st: GatewayState, host_req: sandbox_host_pb2.StartRunRequest,
                          hosts: list[coordinator_pb2.HostInfo]) -> runs_pb2.RunRecord:
    t0 = time.monotonic()
    resp: sandbox_host_pb2.StartRunResponse
    # A host whose session expired half-way through the start (a pause or a starved loop past
    # its lease) answers RUN_CLAIM_LOST; the run is left ``starting`` (or was taken over), and
    # a start with the same run id on the next host starts or joins it (StartRun is
    # idempotent by run id), so the client never sees that host's trouble.
    # A start that failed on the log (a JetStream append timed out), or whose host found no
    # new session in time after losing its own, left the run ``starting`` too: the next host
    # resumes it.
    deadline = Deadline.after(START_BUDGET)
    unanswered: list[str] = []  # the hosts whose StartRun went unanswered once (start_on)

    def start(h: coordinator_pb2.HostInfo) -> Awaitable[sandbox_host_pb2.StartRunResponse]:
        return start_on(st, h, host_req, deadline, unanswered)

    next_on = (e.RunClaimLost, e.SessionLost, e.LogUnavailable)

    async def on_hosts() -> tuple[str, sandbox_host_pb2.StartRunResponse]:
        """The start on the first host that takes it; after an unanswered ask, a failure on
        every host is checked against the run's record (:func:`_started_meanwhile`).

        Returns:
            ``(host id, the host's answer)``; a run joined that way: its driver host, and an
            answer with the record and ``created`` false.

        Raises:
            HostAtCapacity, NoHostAvailable, RunClaimLost, SessionLost, LogUnavailable: every
                host failed and the run did not start; ThreadBusy and the hosts' other errors
                as they come.
        """
        try:
            host, resp = await try_hosts(st.hosts, hosts, start, next_on=next_on)
            return host.host_id, resp
        except (e.HostAtCapacity, NoHostAvailable, *next_on):
            view = await _started_meanwhile(st, host_req.run_id) if unanswered else None
            if view is None:
                raise
            log.info("run %s: the StartRun that %s did not answer in time started it; joining",
                     host_req.run_id, ", ".join(unanswered))
            # As for an existing run found before the start: its host may be the one gone.
            st.takeovers.consider(host_req.run_id, view.record, view.claim)
            return view.record.driver_host, sandbox_host_pb2.StartRunResponse(record=view.record, created=False)

    try:
        try:
            host_id, resp = await on_hosts()
        except e.ThreadBusy as busy:
            if not await run_finishing(st, busy.active_run_id):
                raise
            host_id, resp = await on_hosts()
    except e.ThreadBusy:
        st.metrics.appends.labels("thread-busy").inc()
        raise
    st.metrics.appends.labels("created" if resp.created else "existing").inc()
    log.info("run %s started on %s (created=%s) in %.3fs", host_req.run_id, host_id, resp.created,
             time.monotonic() - t0)
    return resp.record


async def start_on(st: GatewayState, host: coordinator_pb2.HostInfo, req: sandbox_host_pb2.StartRunRequest,
                   deadline: Deadline, unanswered: list[str] | None = None) -> sandbox_host_pb2.StartRunResponse:
    """``StartRun`` on ``host``; asked again while it is busy, not dead.

    A host that did not answer within ``RPC_TIMEOUT`` seconds but is still
    registered (its session lease is live, so it is running) is busy: many starts at once on
    a loaded machine. Its start goes on regardless of our deadline (a host finishes every
    start it began), and a ``StartRun`` of the same run id on that host awaits it, so asking
    again neither starts the run twice nor gives up on a start that is about to succeed.
    Moving on to the next host instead would also be safe (the claim lets one start win) but
    lands the same load on a host that is as busy, and gives the client
    ``NO_HOST_AVAILABLE`` when every host is slow. A host that is gone (unregistered: dead,
    or paused past its lease), or a start past ``deadline``, raises, and :func:`try_hosts`
    moves on (a host is always asked once).

    Args:
        unanswered: where the host's id is added when a call of it went unanswered: that
            start may go on, and may start the run, whatever this call's outcome.

    Raises:
        HostTimedOut: the host did not answer and is gone, or ``deadline`` passed.
        Any other error of the host's ``StartRun``.
    """
    while True:
        try:
            # Every call gets the whole per-call deadline: past the budget a host tried for
            # the first time (the next one of try_hosts) is still asked once.
            return await st.hosts.call(host.address, "StartRun", req, timeout=RPC_TIMEOUT)
        except HostTimedOut:
            if unanswered is not None and host.host_id not in unanswered:
                unanswered.append(host.host_id)
            if deadline.expired or not await st.hosts.registered(host, timeout=START_READ_TIMEOUT):
                raise
            log.info("host %s busy: StartRun of %s not answered within %gs; asking it again",
                     host.host_id, req.run_id, RPC_TIMEOUT)


async def _started_meanwhile(st: GatewayState, run_id: str) -> RunView | None:
    """The record (and claim) of ``run_id`` when the run exists and is past ``starting``
    (``None``: not created, still ``starting``, or the coordinator could not say).

    Asked when every host failed a start after one of them did not answer a ``StartRun`` in
    time: that start went on, and may have started the run (taking the host's last slot, or
    while the host was then found gone or the start's budget spent). Such a run is joined
    as a retried start joins an existing run (the caller checks its thread and tenant),
    instead of answering ``503`` while it goes on without the client.
    """
    try:
        view = await st.coordinator.get_run(run_id, timeout=JOIN_LOOKUP_TIMEOUT)
    except e.BatonError:
        return None
    return None if view.record.starting else view


async def run_finishing(st: GatewayState, run_id: str) -> bool:
    """Whether ``run_id`` ended: its log is closed and its record turned terminal in time.

    A host closes a run's log before it writes the terminal status (a successor finalizes a
    ``running`` record from a closed log, never the other way round), so a client that read
    to the end and at once sends the thread's next message can meet the previous run still
    ``running`` for one write's time. That run is over for the client: wait for its status
    (at most :data:`FINISHING_WAIT` seconds) instead of answering ``409 THREAD_BUSY``.

    The close record decides, in one read, whether there is anything to wait for: a log
    that is not closed is a run that goes on (``False`` at once). The wait itself cannot end
    on the close: the thread stays busy for the coordinator (its active-run index) until
    the record is terminal, so a start retried before that would be refused again. It
    follows the record's changes (``WatchRun``, whose first event is the record as it is
    now, so a status that landed before the watch began counts) instead of polling it.
    """
    try:
        if await st.log.close_record(run_id) is None:
            return False
        with st.metrics.finishing_waits.track_inprogress():
            async with asyncio.timeout(FINISHING_WAIT):
                async with contextlib.aclosing(st.coordinator.watch_run(run_id)) as changes:
                    async for change in changes:
                        # A record removed (retention) no longer holds the thread either.
                        if change.record is None or change.record.status in TERMINAL_PB:
                            return True
    except (e.BatonError, TimeoutError):
        return False
    return False


async def _check_log_stores(st: GatewayState, run_id: str) -> None:
    """Refuse a new run at once while the delivery log cannot store.

    Its fence and ``run.accepted`` could not land, so the start would hang; the client gets
    ``503 LOG_STORAGE_FULL`` (or ``LOG_UNAVAILABLE``) naming the cause instead.

    Raises:
        LogStorageFull: the log answers but does not store.
        LogUnavailable: JetStream does not answer.
    """
    problem = await st.log_health.problem()
    if isinstance(problem, e.LogStorageFull):
        raise e.LogStorageFull(run_id, problem.detail, problem.err_code)
    if problem is not None:
        raise e.LogUnavailable(run_id, problem.detail)


async def _start_or_explain(st: GatewayState, req: StartRequest, tenant_id: str) -> runs_pb2.RunRecord:
    """:func:`_start_run`; a server-side failure (5xx) says whether the run exists.

    Raises:
        StartFailed: the start failed with a 5xx cause (``runExists`` in the body).
        BatonError: a client error (4xx) as is.
    """
    try:
        return await _start_run(st, req, tenant_id)
    except e.BatonError as exc:
        m = mapping_for(exc)
        if m is None or m.status < 500:
            raise
        exists: bool | None
        if isinstance(exc, e.LogUnavailable):
            exists = True  # the host touches the log only once the record exists
        else:
            try:
                await st.coordinator.get_run(req.run_id, timeout=2.0)
                exists = True
            except e.UnknownRun:
                exists = False
            except e.BatonError:
                exists = None
        raise StartFailed(exc, exists) from exc
