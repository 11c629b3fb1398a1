"""A peer side by side: LangGraph's Agent Server (``langgraph dev``, the in-memory runtime)
and a real baton cluster stream the same events to the same readers, in one run.

The peer: PyPI ``langgraph-api`` 0.16 with ``langgraph-runtime-inmem``, started by
``langgraph dev`` (``langgraph-cli``) from a venv of its own (:data:`PEER_VENV`, made on first
use from the package index with :data:`PEER_PACKAGES`, so baton's dependencies are not
touched). Nothing of it reaches the network: no browser (``--no-browser``), no reload, no
version check (``LANGGRAPH_NO_VERSION_CHECK``), no CLI analytics
(``LANGGRAPH_CLI_NO_ANALYTICS``), no LangSmith tracing, no license key (so no metadata
loop). Its graph has no model: one node sleeps :data:`PAUSE` s, then writes
:data:`EVENTS` events with the stream writer (``stream_mode="custom"``), each
``{"delta": <SIZE characters>}``: its index and send time, then a coding agent's prose
(:func:`event_text`). Readers ask both servers for gzip as httpx does by default (``Accept-Encoding:
gzip, deflate``, as a browser's fetch does); bytes are counted as they came over the wire.

baton: etcd, nats-server, a coordinator, a host and a gateway (``baton_tools.testing``),
the replay agent playing a journal made here: a Claude stream-json turn whose one text block
has :data:`EVENTS` text deltas of :data:`SIZE` characters after a :data:`PAUSE` s gap, so
each run's log holds the same number of text chunks of the same text sizes. Every chunk is
stored in JetStream before a reader gets it; LangGraph's in-memory runtime keeps its
events in process memory and stores nothing.

Per round and side (the sides' order rotated each round, figures the medians of
:data:`ROUNDS` rounds):
- **live**: the run's starting request streams (baton ``POST /api/chat``; LangGraph
  ``POST /threads/{id}/runs/stream``, what ``client.runs.stream`` sends) and
  :data:`READERS` − 1 more readers join during the pause (baton
  ``GET /api/chat?offset=-1``; LangGraph ``GET /threads/{id}/runs/{id}/stream`` with
  ``Last-Event-ID: -1``, what ``client.runs.join_stream`` sends). ``events_per_s``:
  events every reader received / (last arrival − first arrival); ``p99_ms``: an event's
  arrival minus its send time (LangGraph: the stream writer's call, written into the
  event; baton: the time JetStream stored the chunk, read back from the stream, which
  leaves out the agent → host hop before the store);
- **late**: once the run ended, a new reader joins from the start; ``join_ms`` (request →
  the last event) and ``join_bytes``;
- **resume**: a paced run (:data:`RESUME_EVENTS` events, :data:`RESUME_GAP` s apart); its
  reader leaves after half of them and reconnects with ``Last-Event-ID`` (baton
  ``GET /api/chat`` with the header; LangGraph the join route with it):
  ``resume_first_ms`` (reconnect → first event after the cut), ``resume_head_bytes``
  (bytes on the new connection up to that event), ``resume_missing`` / ``duplicates``.

Target (issue: a peer side by side): baton ahead on every figure. Writes
``bench/results/peer_langgraph.json``. Not part of ``make test``. Scale with
``BENCH_PEER_EVENTS``, ``BENCH_PEER_READERS``, ``BENCH_PEER_ROUNDS``; ``BENCH_PEER_VENV``
names another peer venv.
"""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
import platform
import signal
import statistics
import subprocess
import sys

import httpx
import tempfile
import time
import uuid
from datetime import datetime, timezone
from typing import Any

from bench._peer_sse import SseReader, baton_counts, langgraph_counts, pct

REPO = pathlib.Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "peer_langgraph.json"
PEER_VENV = pathlib.Path(os.environ.get("BENCH_PEER_VENV", str(REPO / "bench" / ".peer-venv")))
PEER_PACKAGES = ["langgraph-api==0.16.7", "langgraph-runtime-inmem==0.36.7", "langgraph-cli==0.4.40",
                 "langgraph-sdk==0.4.14"]
EVENTS = int(os.environ.get("BENCH_PEER_EVENTS", "2000"))
SIZE = 64  # characters of text per event
#: The words of a coding agent's answer, drawn at random (seeded, so both sides and every run
#: get the same text) into :data:`PROSE`.
WORDS = (
    "I read the failing test first: it expects the parser to keep a trailing comma inside a "
    "quoted field, and the tokenizer splits on every comma before it looks at the quotes. "
    "The fix belongs in the tokenizer, not in the test. I changed split_fields to walk the "
    "line once, tracking whether it is inside quotes, and to treat a doubled quote as an "
    "escaped one. Then I ran the whole suite: 214 passed, 2 skipped (the network tests). "
    "The reader opens the file without an encoding, so on a machine whose locale is not "
    "UTF-8 it reads accented names wrongly; I passed encoding='utf-8' explicitly. The error "
    "for a short row named the column by its index; it now names the header. Summary of the "
    "diff: tokenizer.py (+31, -12), reader.py (+4, -2), and test_quoted_commas.py.").split()


def _prose(chars: int) -> str:
    """``chars`` characters of :data:`WORDS` in a seeded random order: text that compresses
    as prose does (zlib leaves 0.28 of it; English prose about a third), where one passage repeated would
    fit a compressor's window whole."""
    import random

    pick = random.Random(33).choice
    out: list[str] = []
    n = 0
    while n < chars:
        word = pick(WORDS)
        out.append(word)
        n += len(word) + 1
    return " ".join(out)[:chars]


#: What pads an event's text to :data:`SIZE` on both sides: each event takes the next
#: :data:`SIZE` characters of it (64 KiB, so a run of 2,000 events wraps once).
PROSE = _prose(1 << 16)


def event_text(i: int, stamp: str = "") -> str:
    """The text of event ``i``: its 8-digit index (and ``stamp``), then prose, :data:`SIZE`
    characters in all (the graph in :data:`GRAPH` writes the same)."""
    start = SIZE * i % len(PROSE)
    return (f"{i:08d} {stamp}" + (PROSE + PROSE)[start:start + SIZE])[:SIZE]

READERS = int(os.environ.get("BENCH_PEER_READERS", "10"))
ROUNDS = int(os.environ.get("BENCH_PEER_ROUNDS", "3"))
PAUSE = 1.0  # s between the run's start and its first event (the live readers join then)
RESUME_EVENTS = 1000
RESUME_GAP = 0.002  # s between two events of the resume scenario's paced run
TIMEOUT = 120.0

GRAPH = '''
import asyncio
import time
from typing import TypedDict

from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph


class State(TypedDict, total=False):
    events: int
    size: int
    pause: float
    gap: float
    prose: str


async def emit(state: State) -> dict:
    write = get_stream_writer()
    await asyncio.sleep(state.get("pause", 0.0))
    size, gap, prose = state["size"], state.get("gap", 0.0), state["prose"]
    for i in range(state["events"]):
        # The text: the index, the send time, prose to ``size`` characters (event_text).
        start = size * i % len(prose)
        write({"delta": (f"{i:08d} {time.time():.6f} " + (prose + prose)[start:start + size])[:size]})
        if gap:
            await asyncio.sleep(gap)
    return {}


builder = StateGraph(State)
builder.add_node("emit", emit)
builder.add_edge(START, "emit")
builder.add_edge("emit", END)
graph = builder.compile()
'''


# --- the peer ----------------------------------------------------------------------------


def ensure_peer_venv() -> pathlib.Path:
    """The peer venv's ``langgraph`` CLI, the venv made first when it is missing.

    Raises:
        subprocess.CalledProcessError: the venv or the install failed.
    """
    cli = PEER_VENV / "bin" / "langgraph"
    if not cli.exists():
        print(f"  making the peer venv {PEER_VENV} ({', '.join(PEER_PACKAGES)})", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
        subprocess.run([str(PEER_VENV / "bin" / "python"), "-m", "pip", "install", "-q",
                        "--disable-pip-version-check", *PEER_PACKAGES], check=True)
    return cli


def peer_env() -> dict[str, str]:
    """The peer's environment: nothing that reaches the network."""
    from baton_tools.testing.servers import env_without_proxy

    env = {k: v for k, v in env_without_proxy().items()
           if not k.startswith(("LANGSMITH_", "LANGCHAIN_", "LANGGRAPH_", "BATON_"))}
    env.update({"LANGGRAPH_NO_VERSION_CHECK": "true", "LANGGRAPH_CLI_NO_ANALYTICS": "1",
                "LANGSMITH_TRACING": "false", "LANGCHAIN_TRACING_V2": "false",
                "LANGSMITH_TRACING_V2": "false", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1"})
    return env


def launch_peer(tmp: pathlib.Path) -> tuple[subprocess.Popen[bytes], str]:
    """``langgraph dev`` on a free loopback port, serving :data:`GRAPH` (not waited for).

    Returns:
        The process and its URL; its output goes to ``tmp/peer.log``.
    """
    from baton_tools.testing.servers import free_port

    cli = ensure_peer_venv()
    proj = tmp / "peer"
    proj.mkdir(parents=True, exist_ok=True)
    (proj / "graph.py").write_text(GRAPH)
    (proj / "langgraph.json").write_text(json.dumps({"dependencies": ["."], "graphs": {"bench": "./graph.py:graph"}}))
    port = free_port()
    with (tmp / "peer.log").open("wb") as log:
        proc = subprocess.Popen([str(cli), "dev", "--no-browser", "--no-reload", "--host", "127.0.0.1",
                                 "--port", str(port), "--config", str(proj / "langgraph.json"),
                                 "--server-log-level", "WARNING"],
                                cwd=proj, env=peer_env(), stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


async def start_peer(tmp: pathlib.Path, http: Any) -> tuple[subprocess.Popen[bytes], str]:
    """:func:`launch_peer`, then wait until it answers ``/ok``; (process, URL).

    Raises:
        RuntimeError: it exited; TimeoutError: it did not answer within :data:`TIMEOUT` s.
    """
    proc, url = await asyncio.to_thread(launch_peer, tmp)
    deadline = time.monotonic() + TIMEOUT
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"langgraph dev exited {proc.returncode}: see {tmp / 'peer.log'}")
        try:
            if (await http.get(f"{url}/ok")).status_code == 200:
                return proc, url
        except httpx.TransportError:  # not listening yet
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError("langgraph dev did not answer /ok")
        await asyncio.sleep(0.2)


class PeerSide:
    """LangGraph's Agent Server: one thread per run, ``stream_resumable`` runs."""

    name = "langgraph"
    counts = staticmethod(langgraph_counts)

    def __init__(self, http: Any, url: str) -> None:
        self.http, self.url = http, url

    async def start(self, events: int, gap: float, *, stop_after: int | None = None) -> tuple[SseReader, dict[str, str]]:
        """A new run whose starting request is a reader; its ids once the head came."""
        thread = (await self.http.post(f"{self.url}/threads", json={})).json()["thread_id"]
        body = {"assistant_id": "bench", "input": {"events": events, "size": SIZE, "pause": PAUSE, "gap": gap,
                                                        "prose": PROSE},
                "stream_mode": ["custom"], "stream_resumable": True, "on_disconnect": "continue"}
        r = SseReader(self.http, "POST", f"{self.url}/threads/{thread}/runs/stream", self.counts, want=events,
                      json_body=body, stop_after=stop_after)
        return r, {"thread": thread}

    def ids_from(self, reader: SseReader, ids: dict[str, str]) -> dict[str, str]:
        loc = (reader.head or {}).get("content-location", "")
        return {**ids, "run": loc.rstrip("/").rsplit("/", 1)[-1]}

    def join(self, ids: dict[str, str], want: int, last_event_id: str = "-1") -> SseReader:
        return SseReader(self.http, "GET", f"{self.url}/threads/{ids['thread']}/runs/{ids['run']}/stream"
                         f"?stream_mode=custom", self.counts, want=want, headers={"Last-Event-ID": last_event_id})

    async def sent_times(self, readers: list[SseReader]) -> dict[str, float]:
        return {}  # the send time travels in the event


class BatonSide:
    """baton's gateway: ``POST /api/chat`` starts a replay run and streams its log."""

    name = "baton"
    counts = staticmethod(baton_counts)

    def __init__(self, http: Any, url: str, journals: dict[float, str], nats_url: str, stream: str) -> None:
        self.http, self.url, self.journals = http, url, journals
        self.nats_url, self.stream = nats_url, stream

    async def start(self, events: int, gap: float, *, stop_after: int | None = None) -> tuple[SseReader, dict[str, str]]:
        run = f"peer-{uuid.uuid4().hex}"
        body = {"threadId": f"{run}-t", "runId": run,
                "messages": [{"id": f"{run}-u", "role": "user", "content": "bench"}],
                "agent": {"kind": "replay", "journal": self.journals[gap], "speed": 1}}
        r = SseReader(self.http, "POST", f"{self.url}/api/chat", self.counts, want=events, json_body=body,
                      headers={"X-Run-Id": run}, stop_after=stop_after)
        return r, {"run": run}

    def ids_from(self, reader: SseReader, ids: dict[str, str]) -> dict[str, str]:
        return ids

    def join(self, ids: dict[str, str], want: int, last_event_id: str = "-1") -> SseReader:
        if last_event_id == "-1":
            return SseReader(self.http, "GET", f"{self.url}/api/chat?runId={ids['run']}&offset=-1", self.counts,
                             want=want)
        return SseReader(self.http, "GET", f"{self.url}/api/chat?runId={ids['run']}", self.counts, want=want,
                         headers={"Last-Event-ID": last_event_id})

    async def sent_times(self, readers: list[SseReader]) -> dict[str, float]:
        """SSE id (stream sequence) → when JetStream stored that chunk."""
        from baton.retry import Deadline
        from bench.scale_runs import _stored_times

        stored = await _stored_times(self.nats_url, self.stream, Deadline.after(60))
        return {str(k): v for k, v in stored.items()}


# --- the journal the replay agent plays ---------------------------------------------------


def write_journal(path: pathlib.Path, events: int, gap: float) -> None:
    """A Claude stream-json turn: one text block of ``events`` deltas of :data:`SIZE`
    characters, the first :data:`PAUSE` s after the init line, then ``gap`` s apart (the
    replay agent paces by the lines' ``timestamp``)."""
    sid = "00000000-0000-4000-8000-00000000be4c"
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()

    def at(t: float) -> str:
        return datetime.fromtimestamp(t0 + t, tz=timezone.utc).isoformat().replace("+00:00", "Z")

    def ev(e: dict[str, Any], t: float) -> dict[str, Any]:
        return {"type": "stream_event", "event": e, "session_id": sid, "parent_tool_use_id": None,
                "timestamp": at(t)}

    lines: list[dict[str, Any]] = [
        {"type": "system", "subtype": "init", "session_id": sid, "cwd": "/tmp", "tools": [], "model": "bench",
         "timestamp": at(0)},
        ev({"type": "message_start", "message": {"id": "msg_bench", "type": "message", "role": "assistant",
                                                 "content": [], "model": "bench"}}, PAUSE),
        ev({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}, PAUSE)]
    for i in range(events):
        text = event_text(i)
        lines.append(ev({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
                        PAUSE + i * gap))
    end = PAUSE + events * gap
    lines += [ev({"type": "content_block_stop", "index": 0}, end), ev({"type": "message_stop"}, end),
              {"type": "result", "subtype": "success", "is_error": False, "result": "", "session_id": sid,
               "num_turns": 1, "timestamp": at(end)}]
    path.write_text("".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines))


# --- scenarios ---------------------------------------------------------------------------


async def _gather(readers: list[SseReader], tasks: list[asyncio.Task[None]]) -> None:
    async with asyncio.timeout(TIMEOUT):
        await asyncio.gather(*tasks)


async def live_and_late(side: Any) -> dict[str, Any]:
    """The live readers of one burst run, then a reader joined after its end."""
    first, ids = await side.start(EVENTS, 0.0)
    tasks = [asyncio.create_task(first.run())]
    async with asyncio.timeout(TIMEOUT):
        await first.got_head.wait()
    ids = side.ids_from(first, ids)
    readers = [first] + [side.join(ids, EVENTS) for _ in range(READERS - 1)]
    tasks += [asyncio.create_task(r.run()) for r in readers[1:]]
    await _gather(readers, tasks)
    sent = await side.sent_times(readers)
    arrivals = [a for r in readers for a in r.arrivals]
    span = max(a[2] for a in arrivals) - min(a[2] for a in arrivals)
    lat = [(a[2] - (a[3] if a[3] is not None else sent[a[1]])) * 1000 for a in arrivals
           if a[3] is not None or a[1] in sent]
    late = side.join(ids, EVENTS)
    t0 = time.time()
    async with asyncio.timeout(TIMEOUT):
        await late.run()
    return {
        "events_per_s": round(len(arrivals) / max(span, 1e-9)),
        "p50_ms": round(pct(lat, 50) or 0, 1), "p99_ms": round(pct(lat, 99) or 0, 1),
        "latencies": len(lat),
        "missing": sum(EVENTS - len(r.seen) for r in readers),
        "duplicates": sum(r.duplicates for r in readers),
        "join_ms": round((late.arrivals[-1][2] - t0) * 1000, 1),
        "join_bytes": late.nbytes, "join_events": len(late.seen),
    }


async def resume(side: Any) -> dict[str, Any]:
    """A paced run; its reader leaves after half its events and reconnects with Last-Event-ID."""
    half = RESUME_EVENTS // 2
    first, ids = await side.start(RESUME_EVENTS, RESUME_GAP, stop_after=half)
    async with asyncio.timeout(TIMEOUT):
        await first.run()
    ids = side.ids_from(first, ids)
    again = side.join(ids, RESUME_EVENTS - len(first.seen), last_event_id=first.last_id)
    async with asyncio.timeout(TIMEOUT):
        await again.run()
    if not again.arrivals:
        raise RuntimeError(f"{side.name}: the resumed reader got nothing")
    seen = first.seen | again.seen
    sent = await side.sent_times([first, again])
    lat = [(a[2] - (a[3] if a[3] is not None else sent[a[1]])) * 1000 for r in (first, again) for a in r.arrivals
           if a[3] is not None or a[1] in sent]
    return {
        "paced_p50_ms": round(pct(lat, 50) or 0, 1), "paced_p99_ms": round(pct(lat, 99) or 0, 1),
        "resume_head_ms": round((again.head_at - again.opened) * 1000, 1),
        "resume_first_ms": round((again.arrivals[0][2] - again.opened) * 1000, 1),
        "resume_head_bytes": again.arrivals[0][4],
        "resume_bytes": again.nbytes,
        "resume_missing": RESUME_EVENTS - len(seen),
        "resume_duplicates": len(first.seen & again.seen) + first.duplicates + again.duplicates,
        "left_at": first.last_id,
    }


async def round_of(side: Any) -> dict[str, Any]:
    t = time.monotonic()
    out = {**await live_and_late(side), **await resume(side)}
    print(f"  {side.name}: round in {time.monotonic() - t:.1f}s: {out}", flush=True)
    return out


# --- the run -----------------------------------------------------------------------------

#: Figures and whether a higher value is better (the rest: lower is better).
#: Events a reader missed or got twice (live readers; the resumed reader).
COUNTS = ("missing", "duplicates", "resume_missing", "resume_duplicates")
FIGURES = {"events_per_s": True, "p99_ms": False, "paced_p99_ms": False, "join_ms": False, "join_bytes": False,
           "resume_first_ms": False, "resume_head_bytes": False}


def summarise(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians per side, baton / LangGraph ratios and the targets (baton ahead on each)."""
    med = {side: {k: statistics.median(r[k] for r in rs) for k in rs[0] if isinstance(rs[0][k], (int, float))}
           for side, rs in rounds.items()}
    b, p = med["baton"], med["langgraph"]
    ratios = {k: round(b[k] / p[k], 2) if p[k] else None for k in FIGURES}
    targets = {f"baton_ahead_{k}": (b[k] > p[k]) if up else (b[k] < p[k]) for k, up in FIGURES.items()}
    # Gaps and duplicates: every round's, added up (a median would hide one bad round).
    totals = {side: {k: sum(r[k] for r in rs) for k in COUNTS} for side, rs in rounds.items()}
    targets["baton_no_gap_no_duplicate"] = not any(totals["baton"].values())
    return {"medians": med, "totals": totals, "baton_over_langgraph": ratios, "targets": targets}


def baton_env(tmp: pathlib.Path, journals: pathlib.Path) -> dict[str, str]:
    """The baton side's settings: its own stream, subjects and bucket; replay journals from
    ``journals``; sandboxes under ``tmp``."""
    return {"BATON_RUNS_STREAM": "RUNS_PEER", "BATON_SUBJECT_PREFIX": "baton.peer", "BATON_THREADS_BUCKET": "threads-peer",
            "BATON_REPLAY_DIRS": str(journals), "BATON_JOURNAL_DIR": str(tmp / "sandbox-journals"),
            "BATON_SANDBOX_DIR": str(tmp / "sandboxes"), "BATON_LOG_LEVEL": "WARNING"}


async def main() -> dict[str, Any]:
    import httpx

    from baton_tools.testing.cluster import start_coordinator, start_gateway, start_host
    from baton_tools.testing.servers import EtcdServer, NatsServer

    # SIGTERM cancels the bench, so every process it started is stopped on the way out.
    me = asyncio.current_task()
    assert me is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, me.cancel)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-peer-lg-"))
    journals = tmp / "journals"
    journals.mkdir()
    write_journal(journals / "burst.jsonl", EVENTS, 0.0)
    write_journal(journals / "paced.jsonl", RESUME_EVENTS, RESUME_GAP)
    etcd, nats = EtcdServer(tmp / "etcd"), NatsServer(tmp / "nats")
    await asyncio.to_thread(etcd.start)
    await asyncio.to_thread(nats.start)
    env = baton_env(tmp, journals)
    coord = host = gw = peer = None
    rounds: dict[str, list[dict[str, Any]]] = {"baton": [], "langgraph": []}
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(TIMEOUT, connect=30),
                                     limits=httpx.Limits(max_connections=200)) as http:
            peer, peer_url = await start_peer(tmp, http)
            coord = await start_coordinator(etcd.endpoint, "/peer/", log_dir=tmp / "logs", detached_run_ttl=3600)
            host = await start_host(coord.address, nats.url, log_dir=tmp / "logs", **env)
            gw = await start_gateway(coord.address, nats.url, log_dir=tmp / "logs", http_connections_per_client=0,
                                     start_timeout=120, **env)
            sides = [BatonSide(http, gw.url, {0.0: "burst.jsonl", RESUME_GAP: "paced.jsonl"}, nats.url,
                               env["BATON_RUNS_STREAM"]), PeerSide(http, peer_url)]
            for s in sides:  # a warm-up run each (imports, first sandbox), not counted
                await live_and_late(s)
            for r in range(ROUNDS):
                for s in (sides if r % 2 == 0 else sides[::-1]):
                    rounds[s.name].append(await round_of(s))
    finally:
        if gw is not None:
            await gw.stop(timeout=10)
        if host is not None:
            await host.stop(timeout=10)
        if coord is not None:
            await coord.stop(timeout=10)
        if peer is not None:
            peer.terminate()
            try:
                peer.wait(10)
            except subprocess.TimeoutExpired:
                peer.kill()
                peer.wait(10)
        await asyncio.to_thread(nats.stop)
        await asyncio.to_thread(etcd.stop)
    out = {"bench": "peer_langgraph", "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
           "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "peer": {"packages": PEER_PACKAGES, "runtime": "langgraph-runtime-inmem (langgraph dev): every event in "
                    "process memory, nothing stored"},
           "baton": "etcd + nats-server + coordinator + 1 host + gateway; every chunk stored in JetStream before "
                    "a reader gets it",
           "scale": {"events": EVENTS, "event_text_chars": SIZE, "readers": READERS, "rounds": ROUNDS,
                     "pause_s": PAUSE, "resume_events": RESUME_EVENTS, "resume_gap_s": RESUME_GAP},
           "latency_from": {"langgraph": "the stream writer's call", "baton": "JetStream's stored time of the chunk"},
           "rounds": rounds, **summarise(rounds)}
    print_table(out)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    return out


def print_table(out: dict[str, Any]) -> None:
    """One row per figure: baton, LangGraph, the ratio, whether baton is ahead."""
    med, ratio, tg = out["medians"], out["baton_over_langgraph"], out["targets"]
    rows = [("figure", "baton", "langgraph", "baton/langgraph", "baton ahead")]
    for k in FIGURES:
        rows.append((k, str(med["baton"][k]), str(med["langgraph"][k]), str(ratio[k]),
                     "yes" if tg[f"baton_ahead_{k}"] else "NO"))
    for k in COUNTS:
        rows.append((f"{k} (all rounds)", str(out["totals"]["baton"][k]), str(out["totals"]["langgraph"][k]), "", ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    print("LangGraph's in-memory runtime keeps every event in process memory; baton stores every chunk in "
          "JetStream before a reader gets it.")


if __name__ == "__main__":
    asyncio.run(main())
