"""The nemesis's checker: every property over a whole recorded history (pure).

A :class:`History` is what a nemesis run recorded: for each run its uninterrupted replay
(fingerprints), what each of its readers got, a fresh full read at the end, the raw stored
log's headers, its final status and whether a cancel was acknowledged; for each thread its
turns in order and the transcript saved at the end; what was left behind. Chunks are
compared by fingerprint (docs/design.md §5.4: the identity alignment uses), so a history
stays small enough to save.

:func:`check` returns every :class:`Violation`; each property has its own function and
name (:data:`PROPERTIES`) so a figure per property can be kept.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

TERMINAL = frozenset({"completed", "failed", "cancelled", "interrupted", "aborted"})
#: The reaper ends a run still starting after this many seconds (``coordinator/reaper.py``
#: ``START_GRACE``): ``aborted``, no agent launched, even while its client retries.
START_GRACE = 60.0
CANCELLED = frozenset({"cancelled", "aborted"})

PROPERTIES = (
    "reader_once_in_order",   # every reader got every chunk exactly once, in order
    "log_fence",              # no record of a lower epoch after a higher fence
    "log_unique_ids",         # no duplicate message id
    "log_one_close",          # exactly one close, and it is last
    "answer_once",            # every approval answer is delivered to the agent exactly once; one answer wins
    "replay_equal",           # the stored journal chunks equal the uninterrupted replay's
    "fresh_read",             # a fresh read gets exactly the stored chunks
    "run_ends",               # every run ends, with the status its replay says
    "transcript",             # a thread's saved transcript equals its last turn's
    "thread_order",           # never an earlier turn's transcript over a later one's
    "cancel_honoured",        # an acknowledged cancel ends the run cancelled (unless its end was stored first)
    "no_leak",                # no sandbox, agent process or claim left
    "no_unhandled_error",     # no service let an exception escape (UNHANDLED in its log)
)

#: Log lines of a service that mean an exception escaped its handling: an HTTP response
#: ended by an exception, a background task that failed, a task's error never retrieved.
UNHANDLED = ("Exception in ASGI application", "background task", "Task exception was never retrieved")


@dataclass
class Record:
    """One stored record's headers (see :class:`baton.log.StoredRecord`)."""

    offset: int
    kind: str                 # chunk | fence | close
    epoch: int
    origin: str | None = None
    fingerprint: str | None = None
    msg_id: str | None = None


@dataclass
class ReaderHistory:
    """What one reader got across its reconnects: ``(offset, fingerprint)`` in arrival order.

    ``live``: it stayed to the end (a detached reader left early and is only checked for
    what it got)."""

    items: list[tuple[str, str]] = field(default_factory=list)
    live: bool = True
    ended: bool = False


@dataclass
class RunHistory:
    """One run of the workload."""

    run_id: str
    thread_id: str
    turn: int
    reference: list[str]                       # fingerprints of the uninterrupted replay
    expected_status: str
    expected_transcript: list[dict[str, Any]]
    stored: list[Record] = field(default_factory=list)
    readers: list[ReaderHistory] = field(default_factory=list)
    fresh: list[tuple[str, str]] = field(default_factory=list)
    status: str | None = None
    #: A cancel the gateway acknowledged (202) while the run had not ended.
    cancel_acked: bool = False
    #: A cancel was sent (maybe never answered: the run may end cancelled or not).
    cancel_sent: bool = False
    #: Seconds from the start POST to the first chunk (``None``: none came).
    start_wait: float | None = None
    #: Seconds from the schedule's start: the start POST, and the end (or the check).
    started: float = 0.0
    ended: float = 0.0
    #: Seconds from the schedule's start when the cancel's 202 arrived (``None``: no 202).
    cancel_acked_at: float | None = None
    #: The stored log as read right after the 202 (so after the cancel flag landed): how
    #: many journal chunks it held, and whether it held the run's end (the agent's terminal
    #: chunk or the close). ``None``: not read (no 202, or the read failed).
    ack_journal: int | None = None
    ack_log_ended: bool | None = None
    #: Approval ids whose answer the gateway accepted (a 200, or the 409 of a retry that
    #: carries this same answer), in the order sent.
    answers: list[str] = field(default_factory=list)
    #: The approval id of every answer that reached the agent, in log order: each
    #: ``approval:<id>:answer`` activity and each ``CUSTOM approval.redelivered`` of the
    #: stored log (one chunk per ``baton_input`` line the relay wrote into the journal as
    #: it passed an answer to the agent: docs/hitl.md).
    answer_deliveries: list[str] = field(default_factory=list)
    #: Approval ids the stored log asked (``CUSTOM approval-requested``), in order.
    asked: list[str] = field(default_factory=list)
    #: ``(approval id, status, reason)`` of each answer sent a second time on purpose.
    duplicate_answers: list[tuple[str, int, str]] = field(default_factory=list)
    #: Questions left unanswered because the run's cancel was acknowledged first, and the
    #: ``(approval id, status, reason)`` of an answer to one sent after the run ended.
    unanswered: list[str] = field(default_factory=list)
    late_answers: list[tuple[str, int, str]] = field(default_factory=list)
    #: ``GET /api/runs/{id}``'s ``awaitingApproval`` at the check (``None``: not read).
    awaiting_at_end: bool | None = None


@dataclass
class History:
    """A whole nemesis run's record."""

    runs: list[RunHistory] = field(default_factory=list)
    #: thread id → the transcript saved at the end (``None``: the read failed).
    transcripts: dict[str, list[dict[str, Any]] | None] = field(default_factory=dict)
    sandboxes_left: list[str] = field(default_factory=list)
    agents_left: list[str] = field(default_factory=list)
    claims_left: list[str] = field(default_factory=list)
    #: ``<log file>: <line>`` of every :data:`UNHANDLED` line in the services' logs.
    unhandled: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "History":
        runs = []
        for r in data["runs"]:
            r = dict(r)
            r["stored"] = [Record(**x) for x in r["stored"]]
            r["readers"] = [ReaderHistory([tuple(i) for i in x["items"]], x["live"], x["ended"]) for x in r["readers"]]
            r["fresh"] = [tuple(i) for i in r["fresh"]]
            for name in ("duplicate_answers", "late_answers"):
                r[name] = [tuple(i) for i in r.get(name, [])]
            runs.append(RunHistory(**r))
        return cls(runs, data["transcripts"], data["sandboxes_left"], data["agents_left"], data["claims_left"],
                   data.get("unhandled", []))


@dataclass(frozen=True)
class Violation:
    prop: str
    run_id: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.prop}] {self.run_id}: {self.detail}"


def check(history: History) -> list[Violation]:
    """Every violation of :data:`PROPERTIES` in ``history`` (empty: it holds)."""
    out: list[Violation] = []
    for run in history.runs:
        out += check_log(run)
        out += check_readers(run)
        out += check_replay(run)
        out += check_end(run)
        out += check_answers(run)
    out += check_threads(history)
    out += check_leaks(history)
    return out


def _chunks(run: RunHistory) -> list[Record]:
    return [r for r in run.stored if r.kind == "chunk"]


def check_log(run: RunHistory) -> list[Violation]:
    """The stored log's invariants: the fence, unique message ids, one close and last."""
    out = []
    fence = 0
    for r in run.stored:
        if r.epoch < fence:
            out.append(Violation("log_fence", run.run_id, f"record {r.offset} ({r.kind}) of epoch {r.epoch} "
                                                          f"after the fence of {fence}"))
        if r.kind == "fence":
            fence = max(fence, r.epoch)
    ids = [r.msg_id for r in run.stored if r.msg_id]
    dups = sorted({i for i in ids if ids.count(i) > 1})
    if dups:
        out.append(Violation("log_unique_ids", run.run_id, f"duplicate message ids {dups[:5]}"))
    closes = [i for i, r in enumerate(run.stored) if r.kind == "close"]
    if len(closes) != 1 or closes[0] != len(run.stored) - 1:
        out.append(Violation("log_one_close", run.run_id,
                             f"closes at {closes} of {len(run.stored)} records (want one, last)"))
    return out


def check_readers(run: RunHistory) -> list[Violation]:
    """Each reader: every chunk it got once, in order, as stored; a live one got them all."""
    out = []
    stored = {str(r.offset): r.fingerprint for r in _chunks(run)}
    order = [str(r.offset) for r in _chunks(run)]
    for i, rd in enumerate(run.readers):
        offs = [o for o, _ in rd.items]
        what = f"reader {i} ({'live' if rd.live else 'detached'})"
        if len(offs) != len(set(offs)):
            out.append(Violation("reader_once_in_order", run.run_id, f"{what} got duplicates"))
        if offs != sorted(offs, key=int):
            out.append(Violation("reader_once_in_order", run.run_id, f"{what} got chunks out of order"))
        wrong = [o for o, fp in rd.items if stored.get(o) != fp]
        if wrong:
            out.append(Violation("reader_once_in_order", run.run_id, f"{what} got chunks unlike the stored ones "
                                                                     f"at {wrong[:5]}"))
        if rd.live:
            if not rd.ended:
                out.append(Violation("reader_once_in_order", run.run_id, f"{what} never got the end"))
            elif offs != order:
                missed = sorted(set(order) - set(offs), key=int)
                out.append(Violation("reader_once_in_order", run.run_id, f"{what} missed {missed[:5]}"))
    return out


def check_replay(run: RunHistory) -> list[Violation]:
    """The stored journal chunks equal the uninterrupted replay (a prefix of it when
    cancelled); a fresh read gets exactly the stored chunks."""
    out = []
    journal = [r.fingerprint for r in _chunks(run) if r.origin == "journal"]
    if run.status in CANCELLED and (run.cancel_acked or run.cancel_sent or _abandoned(run)):
        if journal != run.reference[:len(journal)]:
            out.append(Violation("replay_equal", run.run_id, "the stored journal chunks of a cancelled run are not "
                                                             "a prefix of the uninterrupted replay"))
    elif journal != run.reference:
        first = next((i for i, (a, b) in enumerate(zip(journal, run.reference)) if a != b),
                     min(len(journal), len(run.reference)))
        out.append(Violation("replay_equal", run.run_id, f"stored journal chunks differ from the replay at "
                                                         f"{first} ({len(journal)} stored, {len(run.reference)} expected)"))
    want = [(str(r.offset), r.fingerprint or "") for r in _chunks(run)]
    if run.fresh != want:
        out.append(Violation("fresh_read", run.run_id, f"a fresh read got {len(run.fresh)} chunks, "
                                                       f"{len(want)} stored, or others"))
    return out


def check_end(run: RunHistory) -> list[Violation]:
    """The run ended with its replay's status; an acknowledged cancel ended it cancelled."""
    if run.status not in TERMINAL:
        return [Violation("run_ends", run.run_id, f"status {run.status} at the end")]
    if run.cancel_acked:
        return check_cancel(run)
    if run.status in CANCELLED and (run.cancel_sent or _abandoned(run)):
        return []  # a cancel with no answer, or a start the reaper ended as abandoned
    if run.status != run.expected_status:
        return [Violation("run_ends", run.run_id, f"status {run.status}, want {run.expected_status}")]
    return []


def check_answers(run: RunHistory) -> list[Violation]:
    """Every answer is delivered to the agent exactly once: never twice, never one nobody
    gave (nor one to a question left open at a cancel), and (for a run that ended
    ``completed``, so its agent read on) every question asked was answered and delivered; a
    second answer is refused (``409``), never taken; an ended run waits for no answer, and
    an answer to a question its cancel left open is refused ``409 RUN_ENDED``."""
    out = []
    for approval_id in sorted(set(run.answer_deliveries)):
        n = run.answer_deliveries.count(approval_id)
        if n > 1:
            out.append(Violation("answer_once", run.run_id, f"answer to {approval_id} delivered {n} times"))
        if approval_id not in run.answers:
            out.append(Violation("answer_once", run.run_id, f"answer to {approval_id} delivered, none accepted"))
    if run.status == "completed":
        out += [Violation("answer_once", run.run_id, f"accepted answer to {a} never delivered")
                for a in run.answers if a not in run.answer_deliveries]
        out += [Violation("answer_once", run.run_id, f"question {a} asked, the run completed without its answer")
                for a in run.asked if a not in run.answer_deliveries]
    out += [Violation("answer_once", run.run_id, f"a second answer to {a} got {status} {reason}: want 409")
            for a, status, reason in run.duplicate_answers if status != 409]
    out += [Violation("answer_once", run.run_id, f"an answer to {a} after the run ended got {status} {reason}: "
                                                 f"want 409 RUN_ENDED")
            for a, status, reason in run.late_answers if (status, reason) != (409, "RUN_ENDED")]
    if run.status in TERMINAL and run.awaiting_at_end:
        out.append(Violation("answer_once", run.run_id, f"ended {run.status} and still awaiting an approval"))
    return out


def check_cancel(run: RunHistory) -> list[Violation]:
    """An acknowledged cancel ends the run cancelled, unless the run's end was stored first
    (docs/api.md, cancel): the 202 comes after the cancel flag landed, so a log read after
    the 202 that does not yet hold the agent's terminal chunk nor the close proves the end
    was stored after the flag, and the run must end cancelled. A log that already held its
    end when read may have stored it before the flag (a cancel that lost a fair race with
    the run's end), and the run keeps that outcome. Not read: cancelled is required."""
    if run.status in CANCELLED:
        return []
    if run.ack_log_ended:
        return []  # the end was stored before the read after the 202: the race is fair
    if run.ack_log_ended is None:
        return [Violation("cancel_honoured", run.run_id,
                          f"cancel acknowledged, status {run.status} (the log at the 202 was not read)")]
    at = "" if run.cancel_acked_at is None else f" at t={run.cancel_acked_at}s"
    return [Violation("cancel_honoured", run.run_id,
                      f"cancel acknowledged{at} while the log was open with {run.ack_journal} of "
                      f"{len(run.reference)} agent chunks stored; the run went on to end {run.status}")]


def _abandoned(run: RunHistory) -> bool:
    """Its start took longer than :data:`START_GRACE` (or never got a chunk), so the
    reaper may have ended it ``aborted`` as an abandoned start (docs/design.md)."""
    return run.status == "aborted" and (run.start_wait is None or run.start_wait >= START_GRACE)


def check_threads(history: History) -> list[Violation]:
    """Each thread's saved transcript is its last turn's, never an earlier turn's."""
    out = []
    by_thread: dict[str, list[RunHistory]] = {}
    for r in history.runs:
        by_thread.setdefault(r.thread_id, []).append(r)
    for tid, runs in by_thread.items():
        runs.sort(key=lambda r: r.turn)
        last = runs[-1]
        if last.cancel_acked or (last.status in CANCELLED and (last.cancel_sent or _abandoned(last))):
            continue  # a cancelled turn saves what it had: not the replay's transcript
        saved = history.transcripts.get(tid)
        if saved == last.expected_transcript:
            continue
        earlier = [r.turn for r in runs[:-1] if saved == r.expected_transcript]
        if earlier:
            out.append(Violation("thread_order", last.run_id, f"thread {tid} saved turn {earlier[-1]}'s transcript "
                                                              f"over turn {last.turn}'s"))
        else:
            n = "none" if saved is None else f"{len(saved)} messages"
            out.append(Violation("transcript", last.run_id, f"thread {tid}: saved transcript ({n}) differs from turn "
                                                            f"{last.turn}'s ({len(last.expected_transcript)} messages)"))
    return out


def check_leaks(history: History) -> list[Violation]:
    """Nothing left behind (sandboxes, agent processes, claims), no exception escaped."""
    out = []
    for what, left in (("sandbox", history.sandboxes_left), ("agent process", history.agents_left),
                       ("claim", history.claims_left)):
        out += [Violation("no_leak", x, f"{what} left behind") for x in left]
    out += [Violation("no_unhandled_error", "-", line[:300]) for line in history.unhandled]
    return out


def unhandled_lines(name: str, text: str) -> list[str]:
    """The :data:`UNHANDLED` lines of one service log, each prefixed with ``name``."""
    return [f"{name}: {line}" for line in text.splitlines()
            if " ERROR " in line and any(u in line for u in UNHANDLED)]


def tally(violations: Iterable[Violation]) -> dict[str, int]:
    """Violations per property (every property named, 0 when it held)."""
    out = dict.fromkeys(PROPERTIES, 0)
    for v in violations:
        out[v.prop] = out.get(v.prop, 0) + 1
    return out
