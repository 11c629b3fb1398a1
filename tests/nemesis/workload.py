"""The nemesis's workload and the history it records.

``slots`` coroutines run side by side until the schedule's end, each a user at a chat page:
a thread of up to three turns (each turn's input is the last turn's transcript plus a new
message), each turn a replay-agent run started with ``POST /api/chat``. Drawn per run from
the workload seed: the journal and length; a reader that stays (reconnecting with
``Last-Event-ID`` through every fault) or one that leaves after the first chunk (a detached
run); a second tab that joins mid-run; a cancel; for a share of the Claude runs, questions
the agent asks and the user answers (:mod:`tests.nemesis.approvals`). Drains are the
schedule's ``restart`` of a host. Then :func:`collect` reads back what the checker needs
(:class:`History`).
"""
from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from baton.retry import Attempts, Deadline
from baton.fingerprint import fingerprint
from baton.log import DeliveryLog, LogConfig
from baton_tools.reference import reference_chunks, speed_for
from tests.faults.harness import CODEX, CORPUS, LONG, SHORT, TERMINAL, FaultRun, _format_of, agent_processes, \
    eventually
from tests.faults.readers import Reader
from tests.nemesis.approvals import ASKS, MODES, Answerer, Answers, Plan, approval_journal, asked, deliveries
from tests.nemesis.checker import History, ReaderHistory, Record, RunHistory, unhandled_lines
from tests.nemesis.cluster import NemesisCluster

JOURNALS = (LONG, LONG, SHORT, CODEX)
#: The AG-UI chunk types that end a run (the agent's terminal chunk).
TERMINAL_CHUNKS = ("RUN_FINISHED", "RUN_ERROR")
#: The share of the runs of a journal with asks (:data:`~tests.nemesis.approvals.ASKS`) whose
#: agent asks for approval; the share of asks allowed (the rest are denied).
APPROVAL_SHARE = 0.4
ALLOW_SHARE = 0.7
#: Runs read back at once at the check.
COLLECT_CONCURRENCY = 8
#: Longest wait for one run's end inside a slot; past it the slot moves on (the end check
#: at the close of the schedule still waits for it).
RUN_WAIT = 180.0


@dataclass
class WorkRun:
    """One run as the workload drove it."""

    run: FaultRun
    turn: int
    started: float
    readers: list[Reader] = field(default_factory=list)
    cancel_acked: bool = False
    cancel_sent: bool = False
    first_chunk: float | None = None
    ended: float | None = None
    #: When the cancel's 202 arrived, and the stored log read right after it (see
    #: :class:`~tests.nemesis.checker.RunHistory`).
    cancel_acked_at: float | None = None
    ack_journal: int | None = None
    ack_log_ended: bool | None = None
    #: The answers of an approval run (one letter per ask, see
    #: :func:`~tests.nemesis.approvals.approval_journal`), ``""`` for a run that asks nothing;
    #: what its answerer did; set once its cancel was acknowledged or given up.
    decisions: str = ""
    answers: Answers | None = None
    cancel_done: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set when a question the plan leaves open for the cancel was asked.
    question_open: asyncio.Event = field(default_factory=asyncio.Event)


class Workload:
    """Runs :meth:`slot` coroutines until ``until`` (seconds from ``t0``)."""

    def __init__(self, cluster: NemesisCluster, seed: int, t0: float) -> None:
        self.c = cluster
        self.rng = random.Random(seed * 7919 + 1)
        self.t0 = t0
        self.runs: list[WorkRun] = []
        self.errors: list[str] = []
        #: Seconds :func:`collect` waited for the last sandboxes, agents and claims to go.
        self.leak_wait = 0.0

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def run(self, slots: int, until: float) -> None:
        """``slots`` users until ``until``; returns once every slot stopped starting runs."""
        await asyncio.gather(*(self.slot(i, until) for i in range(slots)))

    async def slot(self, i: int, until: float) -> None:
        rng = random.Random(self.rng.random())
        thread, turn, history = "", 0, []
        while self.now() < until:
            if not thread or turn >= 3:
                thread, turn, history = f"n{self.c.tag}-s{i}-{len(self.runs)}", 0, []
            w = await self.start(rng, thread, turn, history)
            ok = await self.drive(rng, w)
            if ok and not w.cancel_acked:
                history, turn = w.run.transcript, turn + 1
            else:
                thread = ""
            await asyncio.sleep(rng.uniform(0.0, 2.0))  # a user's pause between turns

    async def start(self, rng: random.Random, thread: str, turn: int, history: list[dict[str, Any]]) -> WorkRun:
        journal = rng.choice(JOURNALS)
        seconds = rng.uniform(6.0, 20.0)
        decisions = ""
        if journal in ASKS and rng.random() < APPROVAL_SHARE:
            decisions = "".join("a" if rng.random() < ALLOW_SHARE else "d" for _ in ASKS[journal])
            journal = approval_journal(CORPUS, self.c.replay_extra, journal, decisions)
        path = (self.c.replay_extra if decisions else CORPUS) / journal
        run_id = f"{thread}-r{turn}"
        messages = [*history, {"id": f"{run_id}-user", "role": "user", "content": f"turn {turn}: replay {journal}"}]
        run = FaultRun(run_id, thread, journal, speed_for(path, seconds), messages,
                       reference_chunks(path, _format_of(journal), run_id, thread),
                       detached=rng.random() < 0.25)
        self.c.runs.append(run)
        w = WorkRun(run, turn, self.now(), decisions=decisions)
        run.reader = Reader(self.c.http, self.c.url, run).start()
        w.readers.append(run.reader)
        self.runs.append(w)
        return w

    async def drive(self, rng: random.Random, w: WorkRun) -> bool:
        """Play one run's user; true when it ended with its replay's status in time."""
        run, reader = w.run, w.readers[0]
        join = rng.random() < 0.3
        cancel_at = rng.randint(3, 40) if rng.random() < 0.15 else None
        if not await self._first_chunk(reader):
            return False
        w.first_chunk = self.now()
        if join:  # a second tab on the same run, from the start of its log
            w.readers.append(Reader(self.c.http, self.c.url, run).start(post=False))
        if run.detached:
            await reader.stop()
        plan = None
        if w.decisions:
            plan = Plan(w.decisions, rng.choice((0.0, 0.5, 2.0)), rng.choice(MODES), rng.random() < 0.3,
                        frozenset({len(w.decisions) - 1}) if cancel_at is not None and rng.random() < 0.5
                        else frozenset())
        answerer = asyncio.create_task(self._answer(w, plan)) if plan is not None else None
        try:
            if cancel_at is not None:
                if plan is not None and plan.skip:  # the cancel comes while that question is open
                    with contextlib.suppress(TimeoutError, AssertionError):
                        await eventually(lambda: w.question_open.is_set() or _terminal(self.c, run.run_id),
                                         RUN_WAIT, interval=0.5)
                await self._cancel(w, reader, cancel_at)
            w.cancel_done.set()
            try:
                async with asyncio.timeout(RUN_WAIT):
                    for rd in w.readers:
                        if not (run.detached and rd is reader):
                            await _reader_done(rd)
                    await eventually(lambda: _terminal(self.c, run.run_id), RUN_WAIT, interval=0.5)
                    if answerer is not None:
                        await answerer
            except (TimeoutError, AssertionError):
                self.errors.append(f"{run.run_id}: not ended within {RUN_WAIT}s at t={self.now():.0f}s")
                return False
        finally:
            if answerer is not None and not answerer.done():
                answerer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await answerer
        w.ended = self.now()
        return (await self.c.view(run.run_id)).get("status") == run.expected_status

    async def _answer(self, w: WorkRun, plan: Plan) -> None:
        """The run's user answering its questions (:class:`~tests.nemesis.approvals.Answerer`):
        from the reading tab, a reloaded one or the run's view; at once or after a pause;
        sometimes each answer twice; with a cancel drawn, sometimes the last question left
        open for the cancel to close."""
        run = w.run

        def chunks() -> list[dict[str, Any]]:
            return [ch for rd in w.readers for _, ch, _ in rd.got.items]

        def join() -> Any:
            tab = Reader(self.c.http, self.c.url, run).start(post=False)
            w.readers.append(tab)
            return lambda: [ch for _, ch, _ in tab.got.items]

        answerer = Answerer(self.c.http, self.c.url, run.run_id, plan, chunks=chunks,
                            terminal=lambda: _terminal(self.c, run.run_id), cancel_done=w.cancel_done,
                            cancel_acked=lambda: w.cancel_acked, join=join, opened=w.question_open)
        w.answers = answerer.out
        try:
            await answerer.run()
        finally:
            self.errors += w.answers.errors

    async def _first_chunk(self, reader: Reader) -> bool:
        assert reader.task is not None
        got = asyncio.create_task(reader.first_chunk.wait())
        try:
            await asyncio.wait({got, reader.task}, timeout=RUN_WAIT, return_when=asyncio.FIRST_COMPLETED)
        finally:
            got.cancel()
        if not reader.first_chunk.is_set():
            self.errors.append(f"{reader.run.run_id}: no first chunk ({_task_error(reader)})")
            return False
        return True

    async def _cancel(self, w: WorkRun, reader: Reader, after_chunks: int) -> None:
        """``POST /api/chat/cancel`` once the live reader got ``after_chunks`` (or a few
        seconds passed), retried through 5xx and dropped connections for a minute."""
        with contextlib.suppress(TimeoutError):
            await eventually(lambda: len(reader.got.items) >= after_chunks or reader.got.ended, 5.0)
        async for _ in Attempts(Deadline.after(60.0), first_pause=0.5, max_pause=0.5):
            if reader.got.ended and not w.run.detached:
                return  # it ended first: nothing to cancel
            if (await self.c.view(w.run.run_id)).get("status") in TERMINAL:
                return
            w.cancel_sent = True
            try:
                resp = await self.c.http.post(f"{self.c.url}/api/chat/cancel", json={"runId": w.run.run_id}, timeout=10)
            except httpx.TransportError:
                continue
            if resp.status_code == 202:
                w.cancel_acked, w.cancel_acked_at = True, self.now()
                await self._log_at_ack(w)
                return
            if resp.status_code < 500:
                self.errors.append(f"{w.run.run_id}: cancel refused {resp.status_code} {resp.text[:200]}")
                return


    async def _log_at_ack(self, w: WorkRun) -> None:
        """Read the stored log right after a cancel's 202 (so after its flag landed):
        whether it already held the run's end, which then may have been stored first.

        Retried for a minute through the faults (a later read only admits more); a log
        never read leaves the fields ``None`` and the checker wants the run cancelled."""
        ends = {fingerprint(ch) for ch in w.run.reference if ch.get("type") in TERMINAL_CHUNKS}
        async for _ in Attempts(Deadline.after(60.0), first_pause=0.5, max_pause=0.5):
            try:
                async with asyncio.timeout(10):
                    stored = (await self.c.stored_log(w.run.run_id)).records
            except Exception:  # noqa: BLE001 - NATS under the nemesis: read again
                continue
            journal = [x.fingerprint for x in stored if x.kind == "chunk" and x.origin == "journal"]
            w.ack_journal = len(journal)
            w.ack_log_ended = any(x.kind == "close" for x in stored) or any(fp in ends for fp in journal)
            return
        self.errors.append(f"{w.run.run_id}: the stored log was not readable after the cancel's 202")


async def _reader_done(rd: Reader) -> None:
    """Until ``rd``'s task ended, however it ended. Never ``await`` the task itself: a
    timeout around that await (a slot's :data:`RUN_WAIT`) cancels the reader too, and a
    later wait for it then raises ``CancelledError`` out of the heal."""
    if rd.task is None:
        return
    await asyncio.wait({rd.task})
    if not rd.task.cancelled():
        rd.task.exception()  # retrieved: a reader refused with a 4xx is checked by what it got


async def _terminal(c: NemesisCluster, run_id: str) -> bool:
    return (await c.view(run_id)).get("status") in TERMINAL


def _task_error(reader: Reader) -> str:
    t = reader.task
    if t is None or not t.done() or t.cancelled():
        return "still waiting"
    return repr(t.exception())


async def finish(wl: Workload, timeout: float = 300.0) -> None:  # noqa: ASYNC109 - a polling budget
    """After the schedule (every fault healed): until every live reader got its end and
    every run is terminal, or ``timeout``."""
    c = wl.c

    async def ended() -> None:
        for w in wl.runs:
            for rd in w.readers:
                if not (w.run.detached and rd is w.readers[0]):
                    await _reader_done(rd)
            await eventually(lambda: _terminal(c, w.run.run_id), timeout, interval=0.5)
            if w.ended is None:
                w.ended = wl.now()
    try:
        async with asyncio.timeout(timeout):
            await ended()
    except (TimeoutError, AssertionError):
        wl.errors.append(f"not every run ended within {timeout}s of the heal")


async def _collect_run(wl: Workload, dlog: DeliveryLog, w: WorkRun) -> RunHistory:
    """One run's :class:`RunHistory`: its stored log, a fresh read, its view."""
    c, r = wl.c, w.run
    try:
        async with asyncio.timeout(60):
            stored = await dlog.stored_headers(r.run_id)
    except Exception as exc:  # noqa: BLE001 - an unreadable log is a violation of its own
        wl.errors.append(f"{r.run_id}: stored log unreadable: {exc!r}")
        stored = []
    try:
        fresh_chunks = await c.fresh_read(r.run_id, timeout=30)
    except (AssertionError, TimeoutError, httpx.HTTPError) as exc:
        wl.errors.append(f"{r.run_id}: fresh read failed: {exc!r}")
        fresh_chunks = []
    fresh = [(o, fingerprint(ch)) for o, ch in fresh_chunks]
    readers = [ReaderHistory([(o, fingerprint(ch)) for o, ch, _ in rd.got.items if o is not None],
                             live=not (r.detached and i == 0), ended=rd.got.ended)
               for i, rd in enumerate(w.readers)]
    view = await c.view(r.run_id)
    run = RunHistory(
        r.run_id, r.thread_id, w.turn, [fingerprint(ch) for ch in r.reference], r.expected_status, r.transcript,
        [Record(x.offset, x.kind, x.epoch, x.origin, x.fingerprint, x.msg_id) for x in stored], readers, fresh,
        view.get("status"), w.cancel_acked, w.cancel_sent,
        None if w.first_chunk is None else round(w.first_chunk - w.started, 1), round(w.started, 1),
        round(w.ended if w.ended is not None else wl.now(), 1),
        None if w.cancel_acked_at is None else round(w.cancel_acked_at, 1), w.ack_journal, w.ack_log_ended)
    if w.decisions or asked(ch for _, ch in fresh_chunks):
        a = w.answers or Answers()
        run.answers, run.duplicate_answers = list(a.accepted), list(a.duplicates)
        run.unanswered, run.late_answers = list(a.unanswered), list(a.late)
        run.asked = asked(ch for _, ch in fresh_chunks)
        run.answer_deliveries = deliveries(ch for _, ch in fresh_chunks)
        run.awaiting_at_end = view.get("awaitingApproval") if view else None
    return run


async def collect(wl: Workload, leak_wait: float = 60.0) -> History:
    """Read back everything the checker needs (see :mod:`tests.nemesis.checker`)."""
    c = wl.c
    h = History()
    for w in wl.runs:
        for rd in w.readers:
            if not rd.got.ended:
                await rd.stop()
    # Runs are read side by side (the check of a 10-minute schedule reads ~250 runs; one by
    # one it took minutes), their order kept; one log connection for every stored log.
    gate = asyncio.Semaphore(COLLECT_CONCURRENCY)
    async with await DeliveryLog.connect(c.nats.url.split(","), LogConfig.from_env(c.env)) as dlog:
        async def one(w: WorkRun) -> RunHistory:
            async with gate:
                return await _collect_run(wl, dlog, w)
        h.runs = list(await asyncio.gather(*(one(w) for w in wl.runs)))
    for tid in sorted({w.run.thread_id for w in wl.runs}):
        try:
            resp = await c.http.get(f"{c.url}/api/threads/{tid}/messages", timeout=10)
            h.transcripts[tid] = resp.json()["messages"] if resp.status_code == 200 else None
        except httpx.HTTPError:
            h.transcripts[tid] = None
    ids = {w.run.run_id for w in wl.runs}
    read_at = time.monotonic()
    deadline = read_at + leak_wait
    while True:
        sandboxes = sorted(p.name for p in c.sandbox_dir.iterdir()) if c.sandbox_dir.exists() else []
        agents = [f"{pid} {rid}" for pid, rid in agent_processes(ids)]
        claims = await asyncio.to_thread(c.claims_left)
        if not (sandboxes or agents or claims) or time.monotonic() > deadline:
            break
        await asyncio.sleep(1.0)
    h.sandboxes_left, h.agents_left, h.claims_left = sandboxes, agents, claims
    wl.leak_wait = round(time.monotonic() - read_at, 1)
    for log in sorted((c.tmp / "logs").glob("*.log")):
        h.unhandled += unhandled_lines(log.name, log.read_text(errors="replace"))
    return h
