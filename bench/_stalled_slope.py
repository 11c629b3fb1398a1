"""A stalled from-start reader's memory, as a slope: on a fresh gateway per run length, RSS
after 20, 40 and 60 readers that sent their join and read nothing (``python -m
bench._stalled_slope``). The slope (KB per added reader) is free of the heap the allocator
grows once on a gateway's first readers, which a single before/after difference is not.
Prints one row per length and writes ``bench/results/stalled_slope.json``."""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
import tempfile
from typing import Any

from bench.long_run import open_stalled, settled_rss, workload, write

LENGTHS = [int(x) for x in os.environ.get("BENCH_SLOPE_LENGTHS", "20000,100000,200000").split(",")]
STEPS = (20, 40, 60)
RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "stalled_slope.json"


async def slope(coord: Any, nats_url: str, cfg: Any, tmp: pathlib.Path, run_id: str) -> dict[str, Any]:
    """The stalled from-start readers of ``run_id`` on a gateway of their own.

    Returns:
        ``{"base_kb", "rss_kb": [at each of STEPS readers], "readers", "kb_per_reader_slope",
        "kb_per_reader_first20"}`` (KB of the gateway's RSS).
    """
    from baton_tools.testing.cluster import start_gateway

    gw = await start_gateway(coord.address, nats_url, log_dir=tmp / f"gw-slope-{run_id}", log_level="WARNING",
                             runs_stream=cfg.stream, subject_prefix=cfg.subject_prefix, threads_bucket=cfg.bucket)
    try:
        assert gw.pid is not None
        port = int(gw.url.rsplit(":", 1)[1])
        path = f"/api/chat?runId={run_id}&offset=-1"
        base = await settled_rss(gw.pid)
        conns: list[Any] = []
        rss = []
        for step in STEPS:
            conns += await open_stalled(port, path, step - len(conns))
            rss.append(await settled_rss(gw.pid))
        for _, w in conns:
            w.close()
    finally:
        await gw.stop()
    return {"base_kb": base, "rss_kb": rss, "readers": list(STEPS),
            "kb_per_reader_slope": round((rss[-1] - rss[0]) / (STEPS[-1] - STEPS[0]), 1),
            "kb_per_reader_first20": round((rss[0] - base) / STEPS[0], 1)}


async def main() -> dict[str, Any]:
    import nats as nats_py

    from baton.log import DeliveryLog, LogConfig
    from baton_tools.testing.cluster import start_coordinator
    from baton_tools.testing.servers import EtcdServer, NatsServer

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="baton-bench-slope-"))
    etcd, nats = EtcdServer(tmp / "etcd"), NatsServer(tmp / "nats")
    etcd.start()
    nats.start()
    cfg = LogConfig(stream="BENCH_SLOPE", subject_prefix="bench.slope", bucket="bench-slope-threads")
    rows: dict[str, Any] = {}
    coord = None
    try:
        coord = await start_coordinator(etcd.endpoint, "/bench-slope/", log_dir=tmp)
        async with DeliveryLog(await nats_py.connect(servers=[nats.url]), cfg, owns_connection=True) as log:
            await log.provision()
            for n in LENGTHS:
                await write(log, f"slope-{n}", workload(f"slope-{n}", n))
        for n in LENGTHS:
            row = rows[str(n)] = await slope(coord, nats.url, cfg, tmp, f"slope-{n}")
            print(f"{n:>8} chunks: base {row['base_kb']} KB, RSS at {STEPS} readers {row['rss_kb']} KB, "
                  f"slope {row['kb_per_reader_slope']} KB/reader, first 20 {row['kb_per_reader_first20']} KB/reader")
    finally:
        if coord is not None:
            await coord.stop()
        nats.stop()
        etcd.stop()
    out = {"bench": "stalled_slope", "results": rows}
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    asyncio.run(main())
