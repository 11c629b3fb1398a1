"""Approvals (human in the loop, docs/hitl.md) in the nemesis's workload.

A share of the runs replay a Claude journal into which asks were written: after a tool call
the journal holds the ``control_request`` (``can_use_tool``) the agent writes and waits on,
then the ``baton_input`` line the launch wrapper's relay writes when it passes the answer to
the agent, and, for a denial, the error ``tool_result`` the replay agent writes in place of
the recorded one (which is dropped). That file is at once what the replay agent plays (it
skips recorded ``baton_input`` lines and the results of a denied call) and the journal an
uninterrupted run with the same answers leaves, so its translation is the run's reference:
the stored chunks, the transcript and the status are checked against it as for any run.

The asks go through the product's whole path: the host stores each on the run record
before its chunks reach the log, the workload's answerer ``POST``s the answer (through the
faults, retried), the coordinator's compare-and-set keeps the first, the driving host (or
its successor) appends it to the sandbox's inbox, the relay passes it to the agent once.
Which host delivered it is not known; that it reached the agent is: every ``baton_input``
line of the journal becomes one chunk of the log, an ``approval:<id>:answer`` activity the
first time and a ``CUSTOM approval.redelivered`` for any repeat
(``sandbox_host/translate/_inputs.py``), so the stored log counts the deliveries.

Stand-in, said plainly: the agent is the replay agent, not the claude-code stand-in; its
recorded output is fixed, so the uninterrupted run is exact (the stand-in writes fresh ids
and times on every run). The ask, the record, the answer, the inbox and the relay are the
product's, the same for either agent.
"""
from __future__ import annotations

import asyncio
import json
import pathlib
from dataclasses import dataclass, field
from typing import Any, Iterable

import httpx

from baton.retry import Attempts, Deadline
from sandbox_host.translate._inputs import ANSWER_ACTIVITY, APPROVAL_REDELIVERED, APPROVAL_REQUESTED
from tests.faults.harness import eventually

#: A question's tool call per journal (of ``tests.faults.harness``'s): the ``tool_use`` ids
#: the agent asks about, in journal order.
ASKS = {
    "claude-stream-json/partial-messages-bash-exit-128.jsonl": ("toolu_01CVGVViZZixTADqwWFFGvkX",),
    "claude-stream-json/subagents-parallel-tools-v2.0.25.jsonl": ("toolu_01WNcRNzzV7GEDHrmzskyLyD",
                                                                  "toolu_01Aqa619ff78oNn5qDHuSYPE"),
}
#: The message a denial carries (the replay agent writes it as the call's error result).
DENIAL = "nemesis: not this one"

#: How long an answering user looks for a question (s): a slot's wait for its run.
ASK_WAIT = 180.0
#: Between two looks (s).
POLL_EVERY = 0.5


def request_id(i: int) -> str:
    """The request id (and so the approval id: it is a valid input id) of ask ``i``."""
    return f"nem-ask-{i + 1}"


def approval_journal(source: pathlib.Path, out_dir: pathlib.Path, journal: str, decisions: str) -> str:
    """Write (once) the journal of ``journal`` with its asks answered ``decisions``.

    Args:
        source: the corpus directory holding ``journal``.
        out_dir: a replay directory of the cluster (``BATON_REPLAY_DIRS``).
        journal: a key of :data:`ASKS` (``<format>/<name>.jsonl``).
        decisions: one letter per ask, ``a`` (allow) or ``d`` (deny with :data:`DENIAL`).

    Returns:
        The new journal's path relative to ``out_dir`` (same format directory).
    """
    tools = ASKS[journal]
    assert len(decisions) == len(tools) and set(decisions) <= {"a", "d"}, decisions
    rel = str(pathlib.PurePath(journal).with_name(f"{pathlib.PurePath(journal).stem}.ask-{decisions}.jsonl"))
    path = out_dir / rel
    if path.exists():
        return rel
    lines = (source / journal).read_text().splitlines()
    out: list[str] = []
    denied = {t for t, d in zip(tools, decisions) if d == "d"}
    for line in lines:
        obj = json.loads(line)
        if _results_of(obj) & denied:
            continue  # the replay agent writes the denial's result in its place
        out.append(line)
        for block in _tool_uses(obj):
            if block["id"] not in tools:
                continue
            i = tools.index(block["id"])
            rid = request_id(i)
            out.append(_compact({"type": "control_request", "request_id": rid, "request": {
                "subtype": "can_use_tool", "tool_name": block["name"], "input": block["input"],
                "tool_use_id": block["id"]}}))
            out.append(_compact({"type": "baton_input", "id": rid, "input": _answer(rid, decisions[i], block)}))
            if decisions[i] == "d":
                out.append(_compact({"type": "user", "message": {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": block["id"], "content": DENIAL, "is_error": True}]},
                    "parent_tool_use_id": None}))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(x + "\n" for x in out))
    tmp.replace(path)
    return rel


def _answer(rid: str, decision: str, block: dict[str, Any]) -> dict[str, Any]:
    """The ``control_response`` the relay passes on (``sandbox_host.run_inputs.answer_payload``;
    only ``behavior`` and ``message`` reach the chunks)."""
    inner: dict[str, Any] = ({"behavior": "allow", "updatedInput": block["input"]} if decision == "a"
                             else {"behavior": "deny", "message": DENIAL})
    return {"type": "control_response", "response": {"subtype": "success", "request_id": rid, "response": inner}}


def _tool_uses(obj: dict[str, Any]) -> list[dict[str, Any]]:
    content = (obj.get("message") or {}).get("content") if obj.get("type") == "assistant" else None
    return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"] if isinstance(content, list) \
        else []


def _results_of(obj: dict[str, Any]) -> set[str]:
    content = (obj.get("message") or {}).get("content") if obj.get("type") == "user" else None
    return {str(b.get("tool_use_id")) for b in content if isinstance(b, dict) and b.get("type") == "tool_result"} \
        if isinstance(content, list) else set()


def _compact(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"))


@dataclass(frozen=True)
class Plan:
    """How the workload's user answers one run's questions.

    ``decisions``: one letter per ask (see :func:`approval_journal`); ``delay``: seconds
    between seeing a question and answering it; ``mode``: where the answerer finds it
    (:data:`MODES`: the reading tab's chunks, a new tab's after a reload, or ``GET
    /api/runs/{id}``: another client than the one reading); ``twice``: every answer is sent a second time on purpose (it must
    be refused, ``409 APPROVAL_ALREADY_ANSWERED``, never delivered again); ``skip``: the
    asks left unanswered while the run's cancel goes (answered after all if the cancel was
    not acknowledged; else answered once the run ended, which must be refused).
    """

    decisions: str
    delay: float
    mode: str
    twice: bool
    skip: frozenset[int] = frozenset()


def asked(chunks: Iterable[dict[str, Any]]) -> list[str]:
    """The approval ids asked in ``chunks`` (``CUSTOM approval-requested``), in order."""
    return [c["value"]["approval"]["id"] for c in chunks
            if c.get("type") == "CUSTOM" and c.get("name") == APPROVAL_REQUESTED and isinstance(c.get("value"), dict)]


def deliveries(chunks: Iterable[dict[str, Any]]) -> list[str]:
    """The approval id of every answer that reached the agent, in log order: each
    ``approval:<id>:answer`` activity and each ``CUSTOM approval.redelivered`` (one chunk
    per ``baton_input`` line of the journal)."""
    out = []
    for c in chunks:
        if c.get("type") == "ACTIVITY_SNAPSHOT" and c.get("activityType") == ANSWER_ACTIVITY:
            out.append(str((c.get("content") or {}).get("approvalId")))
        elif c.get("type") == "CUSTOM" and c.get("name") == APPROVAL_REDELIVERED:
            out.append(str((c.get("value") or {}).get("approvalId")))
    return out


# --- the user who answers ------------------------------------------------------------------------

#: How long the answerer retries one answer through the faults (a coordinator quorum lost,
#: the gateway killed): an unanswered ask would wait for its expiry (600 s) and end the run
#: otherwise than its reference.
ANSWER_RETRY = 150.0
#: Where the answerer finds a question: the chunks of the tab that reads the run, a new tab
#: that joins it from the start (a reload), or ``GET /api/runs/{id}`` (another client).
MODES = ("reader", "reload", "view")


@dataclass
class Answers:
    """What one run's answerer did (the checker's :class:`~tests.nemesis.checker.RunHistory`
    fields of the same names)."""

    #: Approval ids whose answer the gateway accepted (a 200, or the ``409
    #: APPROVAL_ALREADY_ANSWERED`` of a retry carrying this same answer), in order.
    accepted: list[str] = field(default_factory=list)
    #: ``(approval id, status, reason)`` of every answer sent a second time on purpose.
    duplicates: list[tuple[str, int, str]] = field(default_factory=list)
    #: Questions left unanswered because the run's cancel was acknowledged first, and the
    #: ``(approval id, status, reason)`` of an answer to one sent after the run ended.
    unanswered: list[str] = field(default_factory=list)
    late: list[tuple[str, int, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Answerer:
    """One run's user answering its questions while the faults go on (see :class:`Plan`).

    Args:
        http: the workload's client; ``url``: the gateway.
        run_id: the run; ``chunks``: every chunk the tabs reading it got so far (a callable:
            read when looking for a question).
        terminal: whether the run has ended (polled).
        cancel_done: set once the workload's cancel of this run was acknowledged or given
            up (at once when none is drawn); ``cancel_acked``: which.
        join: opens a new tab on the run (mode ``reload``): returns what it got so far (a
            callable).
        opened: set when a question :attr:`Plan.skip` leaves open was asked (the workload
            cancels then).
    """

    def __init__(self, http: Any, url: str, run_id: str, plan: Plan, *, chunks: Any, terminal: Any,
                 cancel_done: Any, cancel_acked: Any, join: Any, opened: Any) -> None:
        self.http, self.url, self.run_id, self.plan = http, url, run_id, plan
        self.chunks, self.terminal, self.cancel_done, self.cancel_acked = chunks, terminal, cancel_done, cancel_acked
        self.join, self.opened = join, opened
        self.out = Answers()

    async def run(self) -> Answers:
        """Answer every question in order; returns once done or the run ended."""
        mode, reload_chunks = self.plan.mode, None
        for i, decision in enumerate(self.plan.decisions):
            aid = request_id(i)
            if mode == "reload" and reload_chunks is None:
                reload_chunks = self.join()  # a new tab joins from the start and answers
            if not await self._until_asked(aid, reload_chunks):
                return self.out  # the run ended first (a cancel, its end)
            if i in self.plan.skip:
                self.opened.set()  # the workload's cancel goes now
                await self.cancel_done.wait()
                if self.cancel_acked():
                    self.out.unanswered.append(aid)
                    await self._late(aid, decision)
                    return self.out
            await asyncio.sleep(self.plan.delay)
            await self._answer(aid, decision, duplicate=False)
            if self.plan.twice:
                await self._answer(aid, decision, duplicate=True)
        return self.out

    async def _until_asked(self, aid: str, reload_chunks: Any) -> bool:
        """Poll until ``aid`` was asked (seen where :attr:`Plan.mode` says); false if the
        run ended first or :data:`ASK_WAIT` passed (as long as a slot waits for its run)."""
        polls = 0
        deadline = Deadline.after(ASK_WAIT)
        while not deadline.expired:
            if self.plan.mode == "view" or (self.plan.mode == "reader" and polls % 4 == 3):
                if aid in await self._pending():
                    return True  # (a reader that left early sees no question: the view does)
            source = reload_chunks() if self.plan.mode == "reload" else self.chunks()
            if self.plan.mode != "view" and aid in asked(source):
                return True
            if polls % 4 == 3 and await self.terminal():
                return False
            polls += 1
            await asyncio.sleep(POLL_EVERY)
        return False

    async def _pending(self) -> list[str]:
        try:
            r = await self.http.get(f"{self.url}/api/runs/{self.run_id}", timeout=5)
        except httpx.TransportError:
            return []
        if r.status_code != 200:
            return []
        return [x.get("id") for x in r.json().get("inputs") or [] if x.get("kind") == "approval"]

    def _body(self, decision: str) -> dict[str, Any]:
        return {"approved": True} if decision == "a" else {"approved": False, "message": DENIAL}

    async def _post(self, aid: str, decision: str) -> tuple[int, dict[str, Any]] | None:
        """The answer ``POST``ed until a non-5xx reply; ``None`` if none came in time."""
        async for _ in Attempts(Deadline.after(ANSWER_RETRY), first_pause=0.5, max_pause=2.0):
            try:
                r = await self.http.post(f"{self.url}/api/runs/{self.run_id}/approvals/{aid}",
                                         json=self._body(decision), timeout=10)
            except httpx.TransportError:
                continue
            if r.status_code >= 500:
                continue
            try:
                body = r.json()
            except ValueError:
                body = {"text": r.text[:200]}
            return r.status_code, body if isinstance(body, dict) else {}
        self.out.errors.append(f"{self.run_id}: no answer to {aid} got through in {ANSWER_RETRY:.0f}s")
        return None

    async def _answer(self, aid: str, decision: str, *, duplicate: bool) -> None:
        got = await self._post(aid, decision)
        if got is None:
            return
        status, body = got
        reason = str(body.get("reason", ""))
        if duplicate:
            self.out.duplicates.append((aid, status, reason))
        elif status == 200 or (status == 409 and reason == "APPROVAL_ALREADY_ANSWERED"
                               and _same(body.get("approval"), decision)):
            self.out.accepted.append(aid)  # a 409 carrying ours: an earlier attempt landed
        elif status == 409 and reason == "RUN_ENDED":
            pass  # a cancel (or the reaper) ended it first
        else:
            self.out.errors.append(f"{self.run_id}: answer to {aid} refused {status} {body}")

    async def _late(self, aid: str, decision: str) -> None:
        """Once the run ended, answer the question the cancel left open: it must be refused."""
        try:
            await eventually(self.terminal, 300.0, interval=0.5)
        except AssertionError:
            self.out.errors.append(f"{self.run_id}: not ended within 300s of its acknowledged cancel")
            return
        got = await self._post(aid, decision)
        if got is not None:
            self.out.late.append((aid, got[0], str(got[1].get("reason", ""))))


def _same(approval: Any, decision: str) -> bool:
    """Whether a stored answer (``409``'s ``approval``) is this user's ``decision``."""
    return isinstance(approval, dict) and approval.get("answeredBy") == "user" \
        and approval.get("approved") is (decision == "a")
