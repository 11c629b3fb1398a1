"""Where a reader's stall after a ``BATON_RUNS`` stream-leader SIGKILL goes.

A 3-node JetStream cluster, the delivery log at R3, ``WRITERS`` runs each appending one
chunk every ``EVERY`` seconds through :class:`baton.log.LogWriter` (the host's writer, its
publish retries as shipped) and one :class:`baton.log.LogReader` per run tailing it (the
gateway's reader, its ordered consumer as shipped). Then the stream leader is SIGKILLed
and every step after it is timed from the kill (one clock, this process):

- ``elected_s``: the stream's ``$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED`` advisory as
  received here (a connection to a survivor), and its own ``timestamp`` (the new leader's
  clock: same machine);
- ``first_append_s``: the first append after the kill acknowledged to its writer (min over
  writers), and the stream's stored time of that record;
- ``consumer_back_s``: when each reader's ordered consumer was recreated (its log line);
- ``first_read_s``: the first record after the kill delivered to each reader (min / max).

``ROUNDS`` kills (a fresh cluster each). Writes ``bench/results/stream_leader.json``.
NATS's own part is ``elected_s``: its raft election timeout is a random draw in [4, 9) s
in nats-server (not configurable); everything after it is the client's.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import pathlib
import platform
import statistics
import tempfile
import time
from typing import Any

from baton.log import DeliveryLog, LogConfig

REPO = pathlib.Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "stream_leader.json"
ROUNDS = int(os.environ.get("BENCH_STREAM_LEADER_ROUNDS", "3"))
WRITERS = 4
EVERY = 0.05


class _Recreated(logging.Handler):
    """Times of the ordered consumers' "recreated" log lines, and every consumer log line."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.times: list[float] = []
        self.lines: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.created, record.getMessage()))
        if "recreated" in record.getMessage():
            self.times.append(record.created)


def _meta_leader(cluster: Any) -> str | None:
    """The JetStream meta leader named last in the nodes' logs."""
    best: tuple[str, str] | None = None
    for n in cluster.nodes:
        for line in n.log_path.read_text(errors="replace").splitlines():
            if "new metadata leader:" in line or "Self is new JetStream cluster metadata leader" in line:
                stamp = " ".join(line.split()[1:3])
                who = n.node if "Self is new" in line else line.rsplit(":", 1)[1].strip()
                if best is None or stamp >= best[0]:
                    best = (stamp, who)
    return best[1] if best else None


async def one_round(tmp: pathlib.Path, rnd: int) -> dict[str, Any]:
    import nats

    from baton_tools.testing.replicated import NatsCluster

    cluster = NatsCluster(tmp / f"nats{rnd}")
    await asyncio.to_thread(cluster.start)
    handler = _Recreated()
    logging.getLogger("baton.log").addHandler(handler)
    logging.getLogger("baton.log").setLevel(logging.DEBUG)
    try:
        cfg = LogConfig(stream=f"RUNS_sl{rnd}", subject_prefix=f"sl{rnd}", bucket=f"threads-sl{rnd}", replicas=3)
        logs = [await DeliveryLog.connect(cluster.url, cfg) for _ in range(WRITERS)]
        await logs[0].provision()
        stop = asyncio.Event()
        acks: list[list[tuple[int, float]]] = [[] for _ in range(WRITERS)]
        reads: list[list[tuple[int, float]]] = [[] for _ in range(WRITERS)]

        async def write(i: int) -> None:
            w = logs[i].writer(f"run{i}", 1)
            await w.fence()
            n = 0
            while not stop.is_set():
                n += 1
                offs = await w.append([{"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": f"d{n}"}])
                acks[i].append((int(offs[0]), time.time()))
                await asyncio.sleep(EVERY)

        async def read(i: int) -> None:
            async with logs[(i + 1) % WRITERS].read(f"run{i}", after="-1", stop_at_close=False) as r:
                async for off, _chunk in r:
                    reads[i].append((int(off), time.time()))

        tasks = [asyncio.create_task(write(i)) for i in range(WRITERS)]
        tasks += [asyncio.create_task(read(i)) for i in range(WRITERS)]
        while min(len(r) for r in reads) < 40:  # noqa: ASYNC110 - a poll of plain lists
            await asyncio.sleep(0.1)
        info = await logs[0].js.stream_info(cfg.stream)
        assert info.cluster is not None
        leader = info.cluster.leader
        meta = _meta_leader(cluster)
        # Odd rounds: the stream led by the meta leader, so one kill costs both elections.
        for _ in range(10):
            if rnd % 2 == 0 or meta is None or leader == meta:
                break
            await logs[0].nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{cfg.stream}", b"", timeout=5)
            await asyncio.sleep(1.0)
            info = await logs[0].js.stream_info(cfg.stream)
            assert info.cluster is not None
            leader = info.cluster.leader
        others = [n.url for n in cluster.nodes if n.node != leader]
        adv = await nats.connect(others, max_reconnect_attempts=-1, reconnect_time_wait=0.05)
        elected: list[tuple[float, float]] = []  # (received here, advisory's own timestamp)

        async def on_elected(msg: Any) -> None:
            body = json.loads(msg.data)
            from datetime import datetime
            ts = datetime.fromisoformat(body["timestamp"].replace("Z", "+00:00")[:26] + "+00:00").timestamp()
            elected.append((time.time(), ts))
        await adv.subscribe(f"$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.{cfg.stream}", cb=on_elected)
        await adv.flush()
        t_kill = time.time()
        await asyncio.to_thread(cluster.node(leader).kill)  # type: ignore[arg-type]
        handler.times.clear()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(any(t > t_kill for _, t in r) for r in reads):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        first_acks = [min((t for _, t in a if t > t_kill), default=None) for a in acks]
        first_reads = [min((t for _, t in r if t > t_kill), default=None) for r in reads]
        await adv.close()
        for lg in logs:
            await lg.close()

        def rel(x: float | None) -> float | None:
            return None if x is None else round(x - t_kill, 3)
        fa = [x for x in first_acks if x is not None]
        fr = [x for x in first_reads if x is not None]
        return {
            "killed": leader,
            "killed_meta_leader": leader == meta,
            "consumer_log": [(round(t - t_kill, 3), m[:120]) for t, m in handler.lines if t > t_kill][:12],
            "elected_s": rel(elected[0][0]) if elected else None,
            "elected_advisory_ts_s": rel(elected[0][1]) if elected else None,
            "first_append_s": rel(min(fa)) if fa else None,
            "last_first_append_s": rel(max(fa)) if fa else None,
            "consumer_back_s": [rel(t) for t in handler.times],
            "first_read_min_s": rel(min(fr)) if fr else None,
            "first_read_max_s": rel(max(fr)) if fr else None,
            "read_after_append_s": [None if a is None or r is None else round(r - a, 3)
                                    for a, r in zip(first_acks, first_reads)],
        }
    finally:
        logging.getLogger("baton.log").removeHandler(handler)
        await asyncio.to_thread(cluster.kill)


async def main() -> dict[str, Any]:
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench-stream-leader-") as d:
        for rnd in range(ROUNDS):
            load = os.getloadavg()[0]
            row = await one_round(pathlib.Path(d), rnd)
            row["load"] = round(load, 1)
            print(json.dumps(row), flush=True)
            rounds.append(row)
    out = {"bench": "stream_leader", "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
           "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "writers": WRITERS, "every_s": EVERY,
           "rounds": rounds,
           "median": {k: statistics.median(r[k] for r in rounds if r[k] is not None)
                      for k in ("elected_s", "first_append_s", "first_read_max_s") if any(r[k] is not None for r in rounds)}}
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    asyncio.run(main())
