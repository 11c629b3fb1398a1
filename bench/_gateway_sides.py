"""Gateways of several source trees (or settings) side by side in one cluster, through this
tree's 1-run × 1,000-readers scenario (bench/gateway.py): one harness for every side, so
what differs is the gateway alone.

``python -m bench._gateway_sides NAME=TREE=GC_THRESHOLD ...`` starts one etcd, one
nats-server and one coordinator (this tree's), then one gateway per side: ``python -m
gateway`` from ``TREE`` (``PYTHONPATH`` = that tree, ``PYTHONSAFEPATH``; this venv) with
``BATON_GC_THRESHOLD`` set when given (empty: the tree's default). Each round runs the
scenario once per side, the order rotated every round; the readers wait ``--settle``
seconds after connecting (their presence registrations, begun in the background, are over)
before the burst. Besides the scenario's figures, each round gives ``registered_s`` (seconds
from the first connect until every reader's presence key is in etcd) and the coordinator's
and etcd's CPU seconds over the scenario and until its readers' keys are removed
(``coordinator_cpu_s``, ``etcd_cpu_s``; the bench's own poll of etcd, every 10 ms while the
readers register, is in the latter). Prints each round and the medians, and writes ``--out``
(JSON: each side's rounds).

Example (the base revision checked out with ``git worktree add /tmp/base 233e61b``)::

    python -m bench._gateway_sides head=.= base=/tmp/base= python700=.=700,10,10 --rounds 6

Used for bench/results/README.md, "The collector's pauses".
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import statistics
import time
from typing import Any

import aetcd

from bench import gateway as G
from bench._cpu import cpu_seconds

FIGURES = ("delivered_chunks_per_s", "burst_p99_ms", "latency_p50_ms", "latency_p99_ms", "registered_s",
           "coordinator_cpu_s", "etcd_cpu_s")


async def _gateway(tree: str, gc_threshold: str, coordinator: str, nats_url: str, cfg: Any, tmp: pathlib.Path) -> Any:
    from baton_tools.testing.cluster import GatewayProcess
    from baton_tools.testing.servers import env_without_proxy, free_port

    port = free_port()
    env = env_without_proxy()
    env.update({
        "BATON_COORDINATOR": coordinator, "BATON_NATS_URL": nats_url,
        "BATON_GATEWAY_LISTEN": f"127.0.0.1:{port}", "BATON_GATEWAY_GRPC_LISTEN": "127.0.0.1:0",
        "BATON_GATEWAY_METRICS_LISTEN": "127.0.0.1:0", "BATON_LOG_LEVEL": "WARNING",
        "BATON_RUNS_STREAM": cfg.stream, "BATON_SUBJECT_PREFIX": cfg.subject_prefix,
        "BATON_THREADS_BUCKET": cfg.bucket,
        "BATON_HTTP_CONNECTIONS_PER_CLIENT": "0",  # 1,000 readers from one address
        "PYTHONPATH": tree, "PYTHONSAFEPATH": "1", "PYTHONUNBUFFERED": "1",
    })
    if gc_threshold:
        env["BATON_GC_THRESHOLD"] = gc_threshold
    g = GatewayProcess(env, port, tmp / f"gateway-{port}.log")
    await g.start(120)
    return g


async def main(sides: list[tuple[str, str, str]], rounds: int, settle: float) -> dict[str, Any]:
    import httpx

    from baton.log import DeliveryLog, LogConfig
    from baton_tools.testing.cluster import start_coordinator
    from bench._servers import etcd_and_nats

    opened = G.open_readers
    registered: list[float] = []  # this scenario's: seconds from the connects until every reader's key is in etcd
    etcd_client: Any = None

    async def reader_keys() -> int:
        return len(list(await etcd_client.get_prefix(b"/bench-sides/readers/", keys_only=True)))

    async def all_registered(n: int, t0: float) -> None:
        while await reader_keys() < n:  # noqa: ASYNC110 - a poll of etcd, which has nothing to wait on here
            await asyncio.sleep(0.01)
        registered.append(time.monotonic() - t0)

    async def open_settled(n: int, *args: Any, **kwargs: Any) -> list[G.Reader]:
        t0 = time.monotonic()
        watch = asyncio.create_task(all_registered(n, t0))
        readers = await opened(n, *args, **kwargs)
        await asyncio.sleep(settle)
        await watch
        return readers

    G.open_readers = open_settled  # type: ignore[assignment]
    cfg = LogConfig(stream="BENCH_GW", subject_prefix="bench.gw", bucket="bench-gw-threads")
    coord = None
    gateways: dict[str, Any] = {}
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in sides}
    with etcd_and_nats("baton-bench-sides-") as (tmp, etcd, nats):
        try:
            coord = await start_coordinator(etcd.endpoint, "/bench-sides/", log_dir=tmp)
            for name, tree, threshold in sides:
                gateways[name] = await _gateway(tree, threshold, coord.address, nats.url, cfg, tmp)
            host, _, port = etcd.endpoint.rpartition("//")[2].rpartition(":")
            etcd_client = aetcd.Client(host=host, port=int(port))
            async with DeliveryLog(await G._nats(nats.url), cfg, owns_connection=True) as log, \
                    httpx.AsyncClient(trust_env=False, timeout=30) as http:
                names = list(gateways)
                for r in range(rounds):
                    for name in names[r % len(names):] + names[:r % len(names)]:
                        target = G.GatewayTarget(gateways[name], log, http, name)
                        registered.clear()
                        cpu0 = cpu_seconds(coord.proc.pid), cpu_seconds(etcd.proc.pid)
                        res = await G.scenario(target, [f"sides-{name}-{r}"], G.READERS_ONE_RUN, paced=True)
                        while await reader_keys():  # noqa: ASYNC110 - the readers' keys removed: their calls are over
                            await asyncio.sleep(0.05)
                        res["registered_s"] = registered[0]
                        res["coordinator_cpu_s"] = cpu_seconds(coord.proc.pid) - cpu0[0]
                        res["etcd_cpu_s"] = cpu_seconds(etcd.proc.pid) - cpu0[1]
                        results[name].append({f: res[f] for f in FIGURES})
                        print(name, r, results[name][-1], flush=True)
        finally:
            for g in gateways.values():
                await g.stop()
            if coord is not None:
                await coord.stop()
            if etcd_client is not None:
                await etcd_client.close()
    summary = {name: {f: statistics.median(x[f] for x in rs) for f in FIGURES} for name, rs in results.items()}
    for name, medians in summary.items():
        print(name, medians, flush=True)
    report = {"sides": {name: {"tree": tree, "gc_threshold": threshold or "(the tree's default)"}
                        for name, tree, threshold in sides},
              "rounds": rounds, "settle_s": settle, "medians": summary, "per_round": results}
    return report


def _side(raw: str) -> tuple[str, str, str]:
    parts = raw.split("=")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise argparse.ArgumentTypeError(f"a side is NAME=TREE=GC_THRESHOLD (the last may be empty), got {raw!r}")
    return parts[0], os.path.abspath(parts[1]), parts[2]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench._gateway_sides", description=__doc__.splitlines()[0])
    parser.add_argument("sides", nargs="+", type=_side, metavar="NAME=TREE=GC_THRESHOLD")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds between the readers' connect and the burst")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(os.devnull))
    a = parser.parse_args()
    report = asyncio.run(main(a.sides, a.rounds, a.settle))
    a.out.write_text(json.dumps(report, indent=1) + "\n")
