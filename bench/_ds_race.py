"""``python -m bench._ds_race [rounds] [--busy]``: two gateways' stores writing one Durable
Stream at full speed, on a real nats-server (docs/design.md §6.4 "Consistency").

Two :class:`~gateway.durable_streams._store.StreamStore` on their own connections (two
gateways, or two workers of one), :data:`WRITERS` writers each, every writer appending
:data:`APPENDS` times as fast as it is answered. Every write is fenced on its store's view,
so the stores race for each sequence. Two variants, alternated round by round so the
machine's load falls on both alike:

- ``before``: 6 tries, then the refusal (answered 503): the tree before;
- ``budget``: at least 6 tries, and more for ``CONFLICT_BUDGET`` seconds (this tree).

Figures per variant (medians over rounds): ``refused`` (appends answered 503, both stores),
``refused_one_store_max`` (the store with more of them), per-store latency p50 / p99 / max
in ms (the worse store's), ``wall_s``. ``--busy`` runs a busy loop beside (a loaded
machine, where the race was first seen uneven). Writes ``bench/results/ds_race.json``.
"""
from __future__ import annotations

import asyncio
import collections
import json
import pathlib
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from typing import Any

import nats

from baton_tools.testing.servers import NatsServer
from bench._readers import pct
from gateway.durable_streams import _store
from gateway.durable_streams._store import Conflict, StoreConfig, StreamStore

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "ds_race.json"
WRITERS = 8  # per store
APPENDS = 300  # per writer
VARIANTS = {"before": 0.0, "budget": _store.CONFLICT_BUDGET}


async def one_round(url: str, variant: str, n: int) -> dict[str, Any]:
    budget = VARIANTS[variant]
    cfg = StoreConfig(stream=f"DSRACE{n}", subject_prefix=f"dsrace{n}")
    _store.CONFLICT_BUDGET = budget
    async with AsyncExitStack() as stack:
        stores = []
        for _ in range(2):
            nc = await nats.connect(url, no_echo=True)
            stack.push_async_callback(nc.close)
            s = StreamStore(nc, cfg)
            await s.start()
            stack.push_async_callback(s.stop)
            stores.append(s)
        path = "/race"
        await stores[0].create(path, {"contentType": "text/plain"}, b"")
        await stores[1].get(path)
        refused: collections.Counter[int] = collections.Counter()
        latency: dict[int, list[float]] = {0: [], 1: []}

        async def writer(i: int, k: int) -> None:
            for j in range(APPENDS):
                t0 = time.perf_counter()
                try:
                    await stores[i].append(path, f"{i}.{k}:{j}".encode(), content_type="text/plain", seq=None,
                                           producer=None, close=False)
                    latency[i].append(time.perf_counter() - t0)
                except Conflict:
                    refused[i] += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(writer(i, k) for i in (0, 1) for k in range(WRITERS)))
        wall = time.perf_counter() - t0
    per = {i: (pct(v, 50) * 1000, pct(v, 99) * 1000, max(v) * 1000) for i, v in latency.items() if v}
    return {"refused": refused[0] + refused[1], "refused_one_store_max": max(refused[0], refused[1]),
            "p50_ms": max(p[0] for p in per.values()), "p99_ms": max(p[1] for p in per.values()),
            "max_ms": max(p[2] for p in per.values()), "wall_s": wall,
            "p99_ms_per_store": [round(per[i][1], 1) for i in sorted(per)]}


async def main(rounds: int = 4, busy: bool = False) -> dict[str, Any]:
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-ds-race-"))
    server = NatsServer(tmp / "nats")
    await asyncio.to_thread(server.start)
    burner = await asyncio.create_subprocess_exec(sys.executable, "-c", "while True: pass") if busy else None
    saved = _store.CONFLICT_BUDGET
    got: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    try:
        n = 0
        for r in range(rounds):
            order = list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]
            for variant in order:
                n += 1
                got[variant].append(await one_round(server.url, variant, n))
                print(variant, json.dumps(got[variant][-1]), flush=True)
    finally:
        _store.CONFLICT_BUDGET = saved
        if burner is not None:
            burner.kill()
            await burner.wait()
        server.stop()
    keys = ("refused", "refused_one_store_max", "p50_ms", "p99_ms", "max_ms", "wall_s")
    summary = {v: {k: round(statistics.median(x[k] for x in rs), 2) for k in keys} for v, rs in got.items()}
    out = {"bench": "ds_race", "rounds": rounds, "busy_loop_beside": busy, "writers_per_store": WRITERS,
           "appends_per_writer": APPENDS, "medians": summary, "runs": got}
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"{'variant':<8} {'refused':>7} {'one store':>9} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'wall s':>6}")
    for v, f in summary.items():
        print(f"{v:<8} {f['refused']:>7} {f['refused_one_store_max']:>9} {f['p50_ms']:>7} {f['p99_ms']:>7} "
              f"{f['max_ms']:>7} {f['wall_s']:>6}")
    return out


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    asyncio.run(main(int(args[0]) if args else 4, "--busy" in sys.argv))
