"""``python -m bench._resume_linger [resumes]``: the peer bench's resume (``bench/peer_langgraph.py``),
baton alone, through two gateways on one cluster: one whose runs' shared tails linger after
their last reader left (``BATON_TAIL_LINGER=10``, the default) and one whose tails go with it
(``0``), alternated resume by resume, so the machine's load falls on both alike.

A resume: a paced run's reader leaves after half its events and reconnects at once with
``Last-Event-ID``. Figures per side (medians, ms): ``head`` (reconnect → response head),
``first`` (reconnect → first event after the cut), ``first_after_head``. Every resume is
checked for a missing or repeated event. Writes ``bench/results/resume_linger.json``.
"""
from __future__ import annotations

import asyncio
import json
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

import httpx

from bench import peer_langgraph as peer
from baton_tools.testing.cluster import start_coordinator, start_gateway, start_host
from baton_tools.testing.servers import EtcdServer, NatsServer

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "resume_linger.json"
SIDES = (("linger", "10"), ("no-linger", "0"))


async def main(resumes: int = 16) -> dict[str, Any]:
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-resume-linger-"))
    journals = tmp / "journals"
    journals.mkdir()
    peer.write_journal(journals / "burst.jsonl", 200, 0.0)
    peer.write_journal(journals / "paced.jsonl", peer.RESUME_EVENTS, peer.RESUME_GAP)
    etcd, nats = EtcdServer(tmp / "etcd"), NatsServer(tmp / "nats")
    await asyncio.to_thread(etcd.start)
    await asyncio.to_thread(nats.start)
    env = peer.baton_env(tmp, journals)
    coord = await start_coordinator(etcd.endpoint, "/peer/", log_dir=tmp / "logs", detached_run_ttl=3600)
    host = await start_host(coord.address, nats.url, log_dir=tmp / "logs", **env)
    gateways = {name: await start_gateway(coord.address, nats.url, log_dir=tmp / "logs", http_connections_per_client=0,
                                          start_timeout=120, **{**env, "BATON_TAIL_LINGER": linger})
                for name, linger in SIDES}
    got: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in SIDES}
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(peer.TIMEOUT, connect=30),
                                     limits=httpx.Limits(max_connections=200)) as http:
            sides = {name: peer.BatonSide(http, gw.url, {0.0: "burst.jsonl", peer.RESUME_GAP: "paced.jsonl"}, nats.url,
                                          env["BATON_RUNS_STREAM"]) for name, gw in gateways.items()}
            for side in sides.values():  # a warm-up resume each, not counted
                await peer.resume(side)
            for i in range(resumes):
                for name in (list(sides) if i % 2 == 0 else list(sides)[::-1]):
                    r = await peer.resume(sides[name])
                    if r["resume_missing"] or r["resume_duplicates"]:
                        raise RuntimeError(f"{name}: a resume missed or repeated events: {r}")
                    got[name].append(r)
    finally:
        for gw in gateways.values():
            await gw.stop(timeout=10)
        await host.stop(timeout=10)
        await coord.stop(timeout=10)
        await asyncio.to_thread(nats.stop)
        await asyncio.to_thread(etcd.stop)
    out: dict[str, Any] = {"bench": "resume_linger", "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "resumes_per_side": resumes, "sides": {}}
    for name, rs in got.items():
        out["sides"][name] = {
            "head_ms_p50": statistics.median(r["resume_head_ms"] for r in rs),
            "first_ms_p50": statistics.median(r["resume_first_ms"] for r in rs),
            "first_after_head_ms_p50": round(statistics.median(r["resume_first_ms"] - r["resume_head_ms"] for r in rs), 2),
            "first_ms": [r["resume_first_ms"] for r in rs]}
        s = out["sides"][name]
        print(f"{name:10} head p50 {s['head_ms_p50']:.1f} ms, first p50 {s['first_ms_p50']:.1f} ms, "
              f"first after head p50 {s['first_after_head_ms_p50']:.2f} ms", flush=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 16))
