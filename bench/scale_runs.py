"""Many concurrent runs on one machine, on single-node and on replicated engines, side by
side in one run.

Each side is a whole cluster of real processes: etcd and nats-server (one of each, or a
3-member etcd and a 3-node JetStream cluster with the delivery log at R3), one coordinator,
``HOSTS`` sandbox hosts and one gateway. ``RUNS`` runs are started at once through
``POST /api/chat`` (the replay agent playing a recorded journal at a real agent's pace,
``SECONDS`` per run); each POST's SSE response is that run's reader, a raw asyncio socket in
this process so the client costs little.

Figures per side:
- ``chunks_per_s``: chunks every reader received / (last reader's end − first POST);
- ``append_to_reader_ms`` p50/p99/max: a chunk's arrival at its reader minus the time
  JetStream stored it (the stream's own timestamp, read back after the runs; one clock);
- ``start_max_s``: the slowest POST → first chunk;
- ``duplicates`` / ``out_of_order``: events a reader received with an id (log offset) it
  had already received / below one it had received (both 0 when delivery is exactly once
  and in order);
- ``completed``: runs whose reader got the end without a ``RUN_ERROR``; ``runs_ended_failed``
  the runs whose stream ended with one (``failed_runs`` names up to 20).

Scaled to this machine (2 cores shared): 200 runs × a 47-line journal over ~30 s, started
over 10 s (all 200 live together from then on). Each host may drive every run
(``BATON_HOST_CAPACITY`` = ``RUNS``): the bench measures throughput, not placement, and a
placement that lags behind the hosts' load must not refuse runs.

Robust under load: each side has one budget (:data:`SIDE_BUDGET` seconds) that every stage
(start-up, the runs, reading the stored times, shutdown) takes its deadline from; a stage
that overruns ends the side with an error naming the stage, and the side's row says so
(``error``) instead of the bench hanging or dying. A refused run is counted by the error
reason of its HTTP answer (``refused_by_reason``), a broken reader by its exception
(``reader_errors``).
Writes ``bench/results/scale_runs.json`` (also when a side failed).
``BENCH_SCALE_SIDES=1-node`` (or ``replicated``) runs one side only. ``BENCH_LOG_DIR`` keeps
the processes' logs there (``<dir>/s/logs``, ``<dir>/r/logs``), ``BENCH_LOG_LEVEL`` sets
their level (``INFO``: every start's steps, hand-overs, retried appends).
"""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
import platform
import re
import signal
import statistics
import tempfile
import time
import uuid
from typing import Any, Awaitable, TypeVar

from baton.retry import Deadline

T = TypeVar("T")
REPO = pathlib.Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "scale_runs.json"
CORPUS = REPO / "corpus"
JOURNAL = "claude-stream-json/subagents-parallel-tools-v2.0.25.jsonl"
#: Scale (env ``BENCH_SCALE_RUNS`` / ``BENCH_SCALE_SECONDS`` to run it smaller).
RUNS = int(os.environ.get("BENCH_SCALE_RUNS", "200"))
HOSTS = 4
SECONDS = float(os.environ.get("BENCH_SCALE_SECONDS", "30"))
#: Starts are spread over this many seconds (20 runs/s), so the POST burst does not time
#: out on a 2-core machine; with runs of ``SECONDS`` every run is live from then on.
START_SPREAD = float(os.environ.get("BENCH_SCALE_SPREAD", "10"))
#: A reader still going this long after the start is counted as not completed.
BUDGET = SECONDS * 6 + 60
#: One side's whole budget: cluster start-up, the runs, reading stored times, shutdown.
SIDE_BUDGET = BUDGET + 240
TTL = 5.0
_ID = re.compile(rb"\nid: ?([0-9]+)\n")


class Reader:
    """One run's ``POST /api/chat`` on a raw socket: arrival time of every offset."""

    def __init__(self, port: int, run_id: str, body: bytes, delay: float) -> None:
        self.port, self.run_id, self.body, self.delay = port, run_id, body, delay
        self.posted: float | None = None
        self.arrivals: dict[int, float] = {}
        self.duplicates = 0  # events whose id (log offset) this reader had already received
        self.out_of_order = 0  # events whose id is below one received before
        self._last = -1
        self.ended: float | None = None
        self.failed = False  # the run's stream carried RUN_ERROR (it ended, but not completed)
        self.status = 0
        self.reason = ""  # the error reason of a refused POST (its JSON body's "reason")
        self.run_exists: bool | None = None  # a refused POST's ``runExists`` (None: not said)

    async def run(self) -> None:
        await asyncio.sleep(self.delay)
        self.posted = time.time()
        r, w = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            w.write(b"POST /api/chat HTTP/1.1\r\nHost: bench\r\nAccept: text/event-stream\r\n"
                    b"Content-Type: application/json\r\nConnection: close\r\nX-Run-Id: " + self.run_id.encode() +
                    b"\r\nContent-Length: " + str(len(self.body)).encode() + b"\r\n\r\n" + self.body)
            await w.drain()
            buf = b""
            while True:
                data = await r.read(65536)
                now = time.time()
                if not data:
                    return
                if not self.status:
                    self.status = int(data.split(b" ", 2)[1])
                buf += data
                if self.status >= 400:
                    continue  # read the error body to its end
                # Keep a tail: an event may be split between reads.
                cut = buf.rfind(b"\n\n")
                if cut < 0:
                    continue
                done, buf = buf[:cut + 2], buf[cut + 2:]
                for m in _ID.finditer(b"\n" + done):
                    offset = int(m.group(1))
                    if offset in self.arrivals:
                        self.duplicates += 1
                    elif offset < self._last:
                        self.out_of_order += 1
                    self.arrivals.setdefault(offset, now)
                    self._last = max(self._last, offset)
                if b'"RUN_ERROR"' in done:
                    self.failed = True
                if b"\n: end" in done or b":end" in done:
                    self.ended = now
                    return
        finally:
            w.close()
            if self.status >= 400:
                self.reason, self.run_exists = _refusal(buf)


def _refusal(response: bytes) -> tuple[str, bool | None]:
    """An HTTP error answer's ``(reason, runExists)`` from its JSON body (its status line, and
    ``None``, when the body says neither)."""
    head, _, body = response.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].decode(errors="replace")
    try:
        doc = json.loads(body)
        exists = doc.get("runExists")
        return str(doc.get("reason") or "") or status_line, exists if isinstance(exists, bool) else None
    except (ValueError, AttributeError):
        return status_line, None


class StageOverrun(Exception):
    """A stage of a side did not end within what was left of the side's budget."""


async def _stage(deadline: Deadline, stage: str, aw: Awaitable[T]) -> T:
    """``aw`` within what is left of ``deadline``; :class:`StageOverrun` naming ``stage``."""
    left = deadline.left()
    try:
        async with asyncio.timeout(left):
            return await aw
    except TimeoutError:
        raise StageOverrun(f"{stage}: not done within the {left:.0f} s left of the side's "
                           f"{SIDE_BUDGET:.0f} s budget") from None


async def _stored_times(nats_url: str, stream: str, deadline: Deadline) -> dict[int, float]:
    """Stream sequence → the time JetStream stored it (s since the epoch), every record
    (as many as were read before ``deadline``)."""
    import nats
    import nats.js.errors
    from nats.js import api

    nc = await nats.connect(nats_url.split(","))
    try:
        js = nc.jetstream()
        # An ephemeral, headers-only pull consumer over the whole stream.
        cinfo = await js.add_consumer(stream, api.ConsumerConfig(
            ack_policy=api.AckPolicy.NONE, deliver_policy=api.DeliverPolicy.ALL, headers_only=True,
            mem_storage=True, num_replicas=1, inactive_threshold=60.0))
        psub = await js.pull_subscribe_bind(cinfo.name, stream)
        out: dict[int, float] = {}
        total = (await js.stream_info(stream)).state.messages
        while len(out) < total and not deadline.expired:
            try:
                msgs = await psub.fetch(500, timeout=deadline.cap(10))
            except (nats.errors.TimeoutError, asyncio.TimeoutError):
                break
            except nats.js.errors.ServiceUnavailableError:
                # A 503 for the pull: the R3 stream's consumer is between leaders (seen
                # right after a replicated side's runs). Ask again within the deadline.
                await asyncio.sleep(0.2)
                continue
            for m in msgs:
                md = m.metadata
                out[md.sequence.stream] = md.timestamp.timestamp()
        return out
    finally:
        await nc.close()


async def side(name: str, replicated: bool, tmp: pathlib.Path) -> dict[str, Any]:
    """Start one cluster, run ``RUNS`` runs through it, stop it; its figures."""
    from baton_tools.reference import speed_for
    from baton_tools.testing.cluster import start_coordinator, start_gateway, start_host
    from baton_tools.testing.replicated import EtcdCluster, NatsCluster
    from baton_tools.testing.servers import EtcdServer, NatsServer

    deadline = Deadline.after(SIDE_BUDGET)
    tag = f"s{uuid.uuid4().hex[:6]}"
    etcd: Any = EtcdCluster(tmp / "etcd") if replicated else EtcdServer(tmp / "etcd")
    nats_: Any = NatsCluster(tmp / "nats") if replicated else NatsServer(tmp / "nats")
    await _stage(deadline, "etcd start", asyncio.to_thread(etcd.start))
    await _stage(deadline, "nats start", asyncio.to_thread(nats_.start))
    endpoints = etcd.endpoints if replicated else etcd.endpoint
    env: dict[str, Any] = {"BATON_RUNS_STREAM": f"RUNS_{tag}", "BATON_SUBJECT_PREFIX": f"baton.{tag}",
           "BATON_THREADS_BUCKET": f"threads-{tag}", "BATON_REPLAY_DIRS": str(CORPUS),
           "BATON_JOURNAL_DIR": str(tmp / "journals"), "BATON_SANDBOX_DIR": str(tmp / "sandboxes"),
           "BATON_SESSION_TTL": str(TTL), "BATON_LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "WARNING"),
           "BATON_LOG_REPLICAS": "3" if replicated else "1", "BATON_HOST_CAPACITY": str(max(64, RUNS))}
    coordinator: Any = None
    hosts: list[Any] = []
    gateway: Any = None
    try:
        coordinator = await _stage(deadline, "coordinator start", start_coordinator(
            endpoints, f"/{tag}/", log_dir=tmp / "logs", session_ttl=TTL, detached_run_ttl=3600,
            BATON_LOG_LEVEL=env["BATON_LOG_LEVEL"]))
        for i in range(HOSTS):
            hosts.append(await _stage(deadline, f"host {i} start", start_host(
                coordinator.address, nats_.url, host_id=f"{name}-h{i}", log_dir=tmp / "logs", **env)))
        gateway = await _stage(deadline, "gateway start", start_gateway(coordinator.address, nats_.url,
                                                                        log_dir=tmp / "logs", **env))
        port = int(gateway.url.rsplit(":", 1)[1])
        speed = speed_for(CORPUS / JOURNAL, SECONDS)
        readers = []
        for i in range(RUNS):
            run_id = f"{tag}-r{i}"
            body = json.dumps({"threadId": f"{run_id}-t", "runId": run_id,
                               "messages": [{"id": f"{run_id}-u", "role": "user", "content": "bench"}],
                               "agent": {"kind": "replay", "journal": JOURNAL, "speed": speed}}).encode()
            readers.append(Reader(port, run_id, body, i * START_SPREAD / RUNS))
        t0 = time.time()
        tasks = [asyncio.create_task(r.run()) for r in readers]
        # The readers get what the side's budget leaves after reading the stored times and
        # shutting down (60 s), at most BUDGET.
        _, late = await asyncio.wait(tasks, timeout=max(1.0, min(BUDGET, deadline.left() - 60)))
        for t in late:
            t.cancel()
        # A refused or broken reader counts as not completed.
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        reader_errors: dict[str, int] = {}
        for o in outcomes:
            if isinstance(o, BaseException) and not isinstance(o, asyncio.CancelledError):
                reader_errors[type(o).__name__] = reader_errors.get(type(o).__name__, 0) + 1
        refused: dict[str, int] = {}
        for r in readers:
            if r.status >= 400:
                refused[r.reason or str(r.status)] = refused.get(r.reason or str(r.status), 0) + 1
        stored = await _stored_times(nats_.url, env["BATON_RUNS_STREAM"], Deadline.after(deadline.cap(30)))
        lat = sorted((at - stored[off]) * 1000 for r in readers for off, at in r.arrivals.items() if off in stored)
        received = sum(len(r.arrivals) for r in readers)
        ends = [r.ended for r in readers if r.ended is not None]
        ended_failed = [r.run_id for r in readers if r.ended is not None and r.failed]
        starts = sorted(min(r.arrivals.values()) - r.posted for r in readers if r.arrivals and r.posted)
        return {
            "engines": name,
            "runs": RUNS, "hosts": HOSTS,
            "completed": len(ends) - len(ended_failed),
            "runs_ended_failed": len(ended_failed),
            "failed_runs": ended_failed[:20],
            "unfinished_after_budget": len(late),
            "refused": sum(1 for r in readers if r.status >= 400),
            "refused_by_reason": refused,
            "reader_errors": reader_errors,
            "stored_times_read": len(stored),
            "duplicates": sum(r.duplicates for r in readers),
            "out_of_order": sum(r.out_of_order for r in readers),
            "chunks": received,
            "chunks_per_s": round(received / (max(ends) - t0), 1) if ends else None,
            "append_to_reader_ms": {
                "p50": round(statistics.median(lat), 1) if lat else None,
                "p99": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 1) if lat else None,
                "max": round(lat[-1], 1) if lat else None,
            },
            # POST → its first chunk at the reader, the slowest start.
            "start_max_s": round(starts[-1], 2) if starts else None,
            "wall_s": round((max(ends) if ends else time.time()) - t0, 1),
        }
    finally:
        # Shutdown is bounded by each stop's own timeout (SIGKILL after it), whatever is left.
        if gateway is not None:
            await gateway.stop(timeout=10)
        await asyncio.gather(*(h.stop(timeout=10) for h in hosts), return_exceptions=True)
        if coordinator is not None:
            await coordinator.stop(timeout=10)
        await asyncio.to_thread(nats_.kill)
        await asyncio.to_thread(etcd.kill)


async def main() -> dict[str, Any]:
    """Both sides, one after the other in this run; prints a table, writes the results."""
    # SIGTERM cancels the bench, so every process it started is stopped on the way out.
    me = asyncio.current_task()
    assert me is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, me.cancel)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-runs-") as d:
        if os.environ.get("BENCH_LOG_DIR"):  # keep the processes' logs (they go under the side's dir)
            d = os.environ["BENCH_LOG_DIR"]
        sides = (("1-node", False), ("replicated (3 etcd + 3 NATS, R3)", True))
        wanted = os.environ.get("BENCH_SCALE_SIDES", "1-node,replicated").split(",")
        for name, replicated in [sd for sd in sides if sd[0].split(" ")[0] in wanted]:
            try:
                rows.append(await side(name, replicated, pathlib.Path(d) / ("r" if replicated else "s")))
            except (StageOverrun, RuntimeError, TimeoutError, OSError) as exc:
                # The side's row says what failed; the other side still runs.
                rows.append({"engines": name, "runs": RUNS, "completed": 0, "error": f"{type(exc).__name__}: {exc}"[:2000],
                             "chunks_per_s": None, "append_to_reader_ms": {"p50": None, "p99": None, "max": None},
                             "start_max_s": None})
            print(json.dumps(rows[-1]), flush=True)
    print(f"{'engines':<34} {'runs':>4} {'done':>5} {'chunks/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
          f"{'start max':>9}")
    for r in rows:
        a = r["append_to_reader_ms"]
        print(f"{r['engines']:<34} {r['runs']:>4} {r['completed']:>5} {r['chunks_per_s']!s:>9} {a['p50']!s:>7} "
              f"{a['p99']!s:>7} {a['max']!s:>7} {r['start_max_s']!s:>8}s"
              + (f"  ERROR {r['error'][:200]}" if r.get("error") else "")
              + (f"  refused {r['refused_by_reason']}" if r.get("refused_by_reason") else "")
              + (f"  DUPLICATES {r['duplicates']}" if r.get("duplicates") else "")
              + (f"  OUT OF ORDER {r['out_of_order']}" if r.get("out_of_order") else ""))
    out = {"bench": "scale_runs", "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
           "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "scale": {"runs": RUNS, "hosts": HOSTS, "journal": JOURNAL, "seconds_per_run": SECONDS,
                     "starts_spread_s": START_SPREAD},
           "rows": rows}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    asyncio.run(main())
