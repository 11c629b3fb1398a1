"""``baton demo``: live runs survive a host SIGKILL, a reader disconnect and a page reload.

The scenario:

1. start a local cluster (2 sandbox hosts);
2. start one replay run per shipped Claude Code journal plus one Codex journal, all at
   once, each through ``POST /api/chat`` whose SSE response is the run's connected reader;
3. mid-run: disconnect one reader, SIGKILL the host driving most runs, "reload" another
   run's page (drop its reader, join fresh with ``offset=-1``), then rejoin the first reader
   with ``Last-Event-ID``;
4. let the surviving host take every run over (the coordinator hands them on);
5. check each run against an **uninterrupted replay** of its journal: the same journal fed
   through the same deterministic translator in this process, with the same run and thread
   ids, gives the exact chunk sequence and transcript a run without any failure produces.

Per run: chunks delivered to its reader(s), duplicates, gaps (both against the
uninterrupted replay, and against the offsets stored in the delivery log), takeover latency
(SIGKILL → the survivor holds the claim, polled every 50 ms through ``GET /api/runs``),
saved transcript (``GET /api/threads/{id}/messages``) equal to the uninterrupted one, final
status. The demo passes only when every row has 0 duplicates, 0 gaps, an equal transcript
and the status the uninterrupted replay ends with: ``completed``, except for a journal that
records the agent's own failure (``result-error-max-turns-…``: ``error_max_turns``), which
ends ``failed`` with or without a takeover.
"""
from __future__ import annotations

import asyncio
import contextlib
import difflib
import json
import pathlib
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

import httpx
from rich import box
from rich.console import Console
from rich.table import Table

from baton.sse import Comment, aiter_sse
from baton_tools.cluster import ClusterInfo, LocalCluster
# The uninterrupted replay (also used by tests/faults); re-exported for the demo's callers.
from baton_tools.reference import expected_status, reference_chunks, speed_for  # noqa: F401

_REPO = pathlib.Path(__file__).resolve().parent.parent
CORPUS = _REPO / "corpus"
#: The Codex journal the full demo adds (a complete run: messages, commands, a file change).
CODEX_JOURNAL = "codex-exec-json/zsh-commands-and-file-change.jsonl"
#: The one journal of ``--quick``: Claude with partial messages, 122 lines.
QUICK_JOURNAL = "claude-stream-json/partial-messages-bash-exit-128.jsonl"
STATUS_POLL = 0.05


@dataclass(frozen=True)
class Pacing:
    """Timings of one demo flavour, in seconds from the moment every run was started.

    Attributes:
        run_seconds: how long each journal's replay should take (speed is derived per journal).
        disconnect_at: one reader disconnects.
        kill_at: the busiest host is SIGKILLed.
        reload_at: another run's page "reloads" (fresh join from the start).
        rejoin_after: the disconnected reader rejoins this long after the kill.
        deadline: give up waiting for the runs to end.
    """

    run_seconds: float
    disconnect_at: float
    kill_at: float
    reload_at: float
    rejoin_after: float
    deadline: float


FULL = Pacing(run_seconds=40.0, disconnect_at=10.0, kill_at=12.0, reload_at=14.0, rejoin_after=5.0, deadline=150.0)
QUICK = Pacing(run_seconds=12.0, disconnect_at=3.0, kill_at=4.0, reload_at=5.0, rejoin_after=3.0, deadline=90.0)


@dataclass
class Received:
    """What one reader got: ``(offset, chunk)`` in arrival order, across its reconnects."""

    items: list[tuple[str | None, dict[str, Any]]] = field(default_factory=list)
    ended: bool = False          # saw the end of the log
    reconnects: int = 0

    @property
    def last_offset(self) -> str | None:
        for off, _ in self.items[::-1]:
            if off is not None:
                return off
        return None


@dataclass
class DemoRun:
    journal: str
    run_id: str
    thread_id: str
    speed: float
    messages: list[dict[str, Any]]
    primary: Received = field(default_factory=Received)
    reload_before: Received | None = None
    reload_after: Received | None = None
    rejoined_at: str | None = None
    role: str = "live"
    host_at_kill: str | None = None
    takeover_latency: float | None = None
    final: dict[str, Any] = field(default_factory=dict)


@dataclass
class Row:
    journal: str
    host: str
    reader: str
    delivered: int
    duplicates: int
    gaps: int
    takeover: str
    transcript_equal: bool
    status: str
    expected_status: str

    @property
    def ok(self) -> bool:
        return self.duplicates == 0 and self.gaps == 0 and self.transcript_equal and self.status == self.expected_status


# --- the uninterrupted replay ------------------------------------------------------------------


def _format_of(journal: str) -> str:
    return pathlib.PurePath(journal).parts[0]


def compare(delivered: Sequence[str], expected: Sequence[str]) -> tuple[int, int]:
    """``(duplicates, gaps)`` of a delivered fingerprint sequence against the expected one:
    extra chunks (delivered but not expected at that place) and missing chunks."""
    extra = missing = 0
    sm = difflib.SequenceMatcher(a=list(expected), b=list(delivered), autojunk=False)
    for op, a0, a1, b0, b1 in sm.get_opcodes():
        if op in ("insert", "replace"):
            extra += b1 - b0
        if op in ("delete", "replace"):
            missing += a1 - a0
    return extra, missing


# --- readers ------------------------------------------------------------------------------------


async def _read_sse(resp: httpx.Response, into: Received) -> None:
    """Consume an SSE response: ``id:``/``data:`` events; ``: end`` marks the log's close."""
    async for item in aiter_sse(resp.aiter_bytes()):
        if isinstance(item, Comment):
            into.ended = into.ended or item.text.strip() == "end"
        else:
            into.items.append((item.id, json.loads(item.data)))


class Reader:
    """One browser tab: a POST (start) or GET (join) SSE stream, reconnecting with
    ``Last-Event-ID`` when the stream drops before the log ended, as the TanStack client does."""

    def __init__(self, http: httpx.AsyncClient, base: str, run: DemoRun, into: Received) -> None:
        self.http, self.base, self.run, self.into = http, base, run, into
        self.task: asyncio.Task[None] | None = None

    def start(self, *, post: bool, after: str | None = None) -> None:
        self.task = asyncio.create_task(self._loop(post, after), name=f"reader:{self.run.run_id}")

    async def stop(self) -> None:
        """Drop the connection (a closed laptop): the run goes on."""
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def wait(self) -> None:
        if self.task is not None:
            await self.task

    async def _loop(self, post: bool, after: str | None) -> None:
        first = True
        while not self.into.ended:
            resume = self.into.last_offset or after
            headers = {"Accept": "text/event-stream"}
            if resume is not None and not (first and after == "-1"):
                headers["Last-Event-ID"] = resume
            try:
                if post and first:
                    body = {"threadId": self.run.thread_id, "runId": self.run.run_id, "messages": self.run.messages,
                            "agent": {"kind": "replay", "journal": self.run.journal, "speed": self.run.speed}}
                    req = self.http.build_request("POST", f"{self.base}/api/chat", json=body,
                                                  headers={**headers, "X-Run-Id": self.run.run_id})
                else:
                    params = {"runId": self.run.run_id}
                    if "Last-Event-ID" not in headers:
                        params["offset"] = after or "-1"
                    req = self.http.build_request("GET", f"{self.base}/api/chat", params=params, headers=headers)
                resp = await self.http.send(req, stream=True)
                try:
                    if resp.status_code >= 400:
                        await resp.aread()
                        raise RuntimeError(f"{req.method} /api/chat for {self.run.run_id}: {resp.status_code} {resp.text}")
                    await _read_sse(resp, self.into)
                finally:
                    await resp.aclose()
            except httpx.TransportError:
                pass  # dropped: reconnect below, like a browser would
            first = False
            if not self.into.ended:
                self.into.reconnects += 1
                await asyncio.sleep(0.2)


# --- the scenario -------------------------------------------------------------------------------


def _journals(quick: bool) -> list[str]:
    if quick:
        return [QUICK_JOURNAL]
    claude = sorted(str(p.relative_to(CORPUS)) for p in (CORPUS / "claude-stream-json").glob("*.jsonl"))
    return claude + [CODEX_JOURNAL]


async def _get_run(http: httpx.AsyncClient, base: str, run_id: str) -> dict[str, Any]:
    """``GET /api/runs/{runId}``; ``{}`` while the run does not exist yet."""
    r = await http.get(f"{base}/api/runs/{run_id}")
    if r.status_code == 404:
        return {}
    r.raise_for_status()
    return r.json()  # type: ignore[no-any-return]


async def _stored(nats_url: str, run_id: str) -> dict[str, str]:
    """Offset → origin (``journal`` | ``host``) of every chunk stored in the run's log."""
    from baton.log import DeliveryLog, LogConfig

    log = await DeliveryLog.connect(nats_url, LogConfig.from_env())
    try:
        recs = await log.stored_headers(run_id)
    finally:
        await log.close()
    return {str(r.offset): r.origin or "" for r in recs if r.kind == "chunk"}


def _fp(chunk: dict[str, Any]) -> str:
    from baton.fingerprint import fingerprint

    return fingerprint(chunk)


def _check_reader(got: Received, stored: dict[str, str], ref_fps: list[str]) -> tuple[int, int]:
    """``(duplicates, gaps)`` for one reader's view (which may start mid-log, after a rejoin)."""
    offs = [o for o, _ in got.items if o is not None]
    dup = len(offs) - len(set(offs))
    host_offsets = {o for o, origin in stored.items() if origin == "host"}
    journal_fps = [_fp(c) for o, c in got.items if o is None or o not in host_offsets]
    extra, missing = compare(journal_fps, ref_fps)
    # Offsets the log holds but the reader never got (host chunks included).
    missed = len(set(stored) - set(offs))
    return dup + extra, max(missing, missed)


async def _scenario(console: Console, info: ClusterInfo, cluster: LocalCluster, quick: bool) -> list[Row]:
    pacing = QUICK if quick else FULL
    base = info.url
    tag = uuid.uuid4().hex[:6]
    runs: list[DemoRun] = []
    for i, journal in enumerate(_journals(quick)):
        slug = pathlib.PurePath(journal).stem[:24]
        runs.append(DemoRun(
            journal=journal, run_id=f"demo-{tag}-{i}-{slug}", thread_id=f"demo-{tag}-thread-{i}",
            speed=speed_for(CORPUS / journal, pacing.run_seconds),
            messages=[{"id": f"demo-{tag}-{i}-user", "role": "user", "content": f"Replay {journal}"}],
        ))
    refs = {r.run_id: reference_chunks(CORPUS / r.journal, _format_of(r.journal), r.run_id, r.thread_id) for r in runs}

    async with httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(10.0, read=60.0)) as http:
        readers: list[Reader] = []
        for r in runs:
            rd = Reader(http, base, r, r.primary)
            rd.start(post=True)
            readers.append(rd)
        t0 = time.monotonic()
        console.print(f"started {len(runs)} run(s); each has a connected SSE reader")

        # Wait until every run is claimed by a host (StartRun returns once claim + fence +
        # run.accepted landed), then pick the host driving most of them.
        async def all_claimed() -> dict[str, str]:
            while True:
                views = {r.run_id: await _get_run(http, base, r.run_id) for r in runs}
                if all(v.get("driverHost") for v in views.values()):
                    return {k: v["driverHost"] for k, v in views.items()}
                await asyncio.sleep(STATUS_POLL)

        async with asyncio.timeout(30):
            owners = await all_claimed()
        for r in runs:
            r.host_at_kill = owners[r.run_id]
        counts: dict[str, int] = {}
        for h in owners.values():
            counts[h] = counts.get(h, 0) + 1
        victim = max(sorted(counts), key=lambda h: counts[h])
        victims = [r for r in runs if owners[r.run_id] == victim]
        longest = sorted(victims, key=lambda r: -len(refs[r.run_id]))
        disconnect_run = longest[0]
        reload_run = longest[1] if len(longest) > 1 else None
        if reload_run is not None:
            reload_tab = readers[runs.index(reload_run)]
            reload_run.reload_before = reload_run.primary
        else:
            # One run only (--quick): a second tab on the same run is the one that reloads.
            disconnect_run.reload_before = Received()
            reload_tab = Reader(http, base, disconnect_run, disconnect_run.reload_before)
            reload_tab.start(post=False, after="-1")

        async def at(t: float) -> None:
            await asyncio.sleep(max(0.0, t0 + t - time.monotonic()))

        # A reader disconnects (closed laptop).
        await at(pacing.disconnect_at)
        disconnect_run.role = "rejoin"
        await readers[runs.index(disconnect_run)].stop()
        console.print(f"reader of {disconnect_run.run_id} disconnected at offset {disconnect_run.primary.last_offset}")

        # The host driving most runs dies.
        await at(pacing.kill_at)
        t_kill = time.monotonic()
        cluster.kill_host(victim)
        console.print(f"[bold red]SIGKILL[/bold red] {victim} (driving {counts[victim]} of {len(runs)} runs)")

        async def watch_takeover(r: DemoRun) -> None:
            while time.monotonic() - t_kill < pacing.deadline:
                v = await _get_run(http, base, r.run_id)
                if v["status"] != "running":
                    return  # ended before anyone had to take it over
                if v.get("claimed") and v.get("driverHost") not in (None, victim):
                    r.takeover_latency = time.monotonic() - t_kill
                    return
                await asyncio.sleep(STATUS_POLL)

        watchers = [asyncio.create_task(watch_takeover(r)) for r in victims]

        # Another page reloads: its reader goes away and a fresh one joins from the start.
        await at(pacing.reload_at)
        target = reload_run if reload_run is not None else disconnect_run
        await reload_tab.stop()
        target.reload_after = Received()
        fresh = Reader(http, base, target, target.reload_after)
        fresh.start(post=False, after="-1")
        if reload_run is not None:
            reload_run.role = "reload"
        else:
            disconnect_run.role = "both"
        console.print(f"page of {target.run_id} reloaded: joined fresh from offset -1")

        # The disconnected reader comes back with Last-Event-ID.
        await asyncio.sleep(max(0.0, t_kill + pacing.rejoin_after - time.monotonic()))
        disconnect_run.rejoined_at = disconnect_run.primary.last_offset
        back = Reader(http, base, disconnect_run, disconnect_run.primary)
        back.start(post=False, after=disconnect_run.rejoined_at)
        console.print(f"reader of {disconnect_run.run_id} rejoined with Last-Event-ID {disconnect_run.rejoined_at}")

        live = [rd for i, rd in enumerate(readers) if runs[i] is not disconnect_run and runs[i] is not reload_run]
        with console.status("runs finishing on the surviving host…"):
            async with asyncio.timeout(pacing.deadline):
                await asyncio.gather(*(rd.wait() for rd in live + [fresh, back]), *watchers)
        console.print(f"all logs closed {time.monotonic() - t0:.1f}s after the start")

        rows: list[Row] = []
        for r in runs:
            ref = refs[r.run_id]
            ref_fps = [_fp(c) for c in ref]
            stored = await _stored(info.nats_url, r.run_id)
            # The reader(s) that stayed to the end: a reloaded page's first reader was dropped
            # on purpose, so only its fresh join counts.
            views = [r.reload_after] if r.reload_after is not None else []
            if r is not reload_run:
                views.append(r.primary)
            dup = gaps = 0
            for got in views:
                d, g = _check_reader(got, stored, ref_fps)
                dup, gaps = dup + d, gaps + g
            # The log itself, read from the start, must hold the uninterrupted sequence exactly.
            journal_stored = [o for o, origin in stored.items() if origin == "journal"]
            if len(journal_stored) != len(ref):
                gaps += max(0, len(ref) - len(journal_stored))
                dup += max(0, len(journal_stored) - len(ref))
            final = await _get_run(http, base, r.run_id)
            tr = await http.get(f"{base}/api/threads/{r.thread_id}/messages")
            saved = tr.json().get("messages") if tr.is_success else None
            from baton.transcript import build_transcript

            equal = saved == build_transcript(ref, input_messages=r.messages)
            rows.append(Row(
                journal=_short(r.journal), host=f"{r.host_at_kill}" + (f"→{final.get('driverHost')}" if r.takeover_latency is not None else ""),
                reader=r.role,
                delivered=len(views[-1].items), duplicates=dup, gaps=gaps,
                takeover=f"{r.takeover_latency:.2f}s" if r.takeover_latency is not None else "-",
                transcript_equal=equal, status=final["status"], expected_status=expected_status(ref),
            ))
    return rows


def _short(journal: str) -> str:
    """``claude-stream-json/x.jsonl`` → ``claude/x`` (the table must fit a terminal)."""
    fmt, _, name = journal.partition("/")
    return f"{fmt.split('-')[0]}/{pathlib.PurePath(name).stem}"


def _status_cell(r: Row) -> str:
    if r.status != r.expected_status:
        return f"[red]{r.status}[/red] (expected {r.expected_status})"
    # A journal that records the agent's own failure ends failed without any takeover too.
    return r.status if r.status == "completed" else f"{r.status}*"


READER_LEGEND = {
    "live": "connected from the start to the end",
    "rejoin": "disconnected before the kill, rejoined with Last-Event-ID after it",
    "reload": "page reloaded after the kill: a fresh join from offset -1",
    "both": "rejoin, plus a second tab of the same run that reloaded",
}


def _table(rows: list[Row]) -> Table:
    # Verdict and numbers first, the long journal name last (it folds): a narrow terminal
    # then loses nothing that decides the result.
    t = Table(title="baton demo: every run after a host SIGKILL, a disconnect and a reload", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), collapse_padding=True)
    for col, just in (("", "center"), ("chunks", "right"), ("dups", "right"), ("gaps", "right"),
                      ("takeover", "right"), ("transcript", "center"), ("status", "left"), ("host", "left"),
                      ("reader", "left")):
        t.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
    t.add_column("journal", overflow="fold", min_width=12)
    for r in rows:
        t.add_row("[green]PASS[/green]" if r.ok else "[red]FAIL[/red]", str(r.delivered), str(r.duplicates),
                  str(r.gaps), r.takeover, "equal" if r.transcript_equal else "[red]DIFFERS[/red]",
                  _status_cell(r), r.host, r.reader, r.journal)
    return t


def _legend(rows: list[Row]) -> list[str]:
    lines = [f"  {k}: {v}" for k, v in READER_LEGEND.items() if any(r.reader == k for r in rows)]
    if any(r.status == r.expected_status != "completed" for r in rows):
        lines.append("  *: the uninterrupted replay of this journal ends the same way (the agent's own failure)")
    return lines


def run_demo(console: Console, *, quick: bool, hosts: int = 2, data_dir: pathlib.Path | None = None) -> bool:
    """Run the demo; print progress and the table.

    Returns:
        True when every row passes (0 duplicates, 0 gaps, equal transcript, the recorded status).
    """
    tmp = None
    if data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="baton-demo-")
        data_dir = pathlib.Path(tmp.name)
    cluster = LocalCluster(data_dir, hosts=hosts, port=0)
    try:
        with console.status("starting a local cluster…") as status:
            cluster.on_step = lambda step: status.update(f"starting {step}…")
            info = cluster.start()
        console.print(f"cluster up: {info.url} ({hosts} sandbox hosts, data in {data_dir})")
        rows = asyncio.run(_scenario(console, info, cluster, quick))
    except Exception as exc:  # noqa: BLE001 - the demo reports any failure as a failed demo
        console.print(f"[bold red]demo failed[/bold red]: {type(exc).__name__}: {exc}")
        for log in sorted((data_dir / "logs").glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-8:]
            console.print(f"--- {log.name}", *tail, sep="\n", markup=False, highlight=False)
        return False
    finally:
        with console.status("stopping the cluster…"):
            cluster.stop()
        if tmp is not None:
            tmp.cleanup()
    console.print(_table(rows))
    for line in _legend(rows):
        console.print(line, highlight=False)
    ok = all(r.ok for r in rows)
    console.print("[bold green]PASS[/bold green]: every chunk exactly once, in order; every run ended as recorded" if ok
                  else "[bold red]FAIL[/bold red]: see the rows marked FAIL")
    return ok
