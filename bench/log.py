"""Delivery-log throughput and latency against raw nats-py doing the same work, in one run.

Side by side on one nats-server (file storage), with identical chunk payloads:

- append throughput, one run: ``LogWriter.append`` (compare-and-set + msg id + fingerprint
  headers, sequential by design: every append compares on the previous one) vs raw
  ``js.publish`` of the same chunks, sequential, each waiting for its ack;
- append throughput, 50 concurrent runs (aggregate) vs raw ``js.publish`` from 50 tasks;
- append -> reader latency p50/p99 at 1 and 10 concurrent runs: a ``DeliveryLog.read``
  tail per run vs a raw nats-py ordered push consumer per subject, fed by raw appends with
  the same headers and compare as the append baseline (``raw_bare``: bare publishes, the
  older baseline, kept for reference).

The raw side does what a plain nats-py user appending the same chunks with the same fence
does: it JSON-encodes each chunk inside the timed loop (baton's writer gets dicts too) and
publishes with headers of the same names and sizes as baton's records (``Nats-Msg-Id``,
``Nats-Expected-Last-Subject-Sequence`` on the sequence its previous ack returned, and the
four ``Baton-*`` headers with a fixed 64-character fingerprint), so both sides send the same
bytes and JetStream checks the same compare. ``raw_bare`` is the older, looser baseline
(appends: payloads encoded before the clock starts, no headers; latency: no headers, no
compare), kept in the results for reference.

The machine is shared, so every figure is the median of :data:`ROUNDS` rounds, and the side
that goes first alternates from round to round.

Targets: one run >= 0.9 x raw; 50 runs >= 0.9 x raw; append->reader p99 <= 1.3 x raw at
10 runs. Writes ``bench/results/log.json``.
"""
from __future__ import annotations

import asyncio
import json
import pathlib
import statistics
import tempfile
import time
from typing import Any

import nats
from nats.aio.client import Client as NATS

from baton.log import DeliveryLog, LogConfig
from baton_tools.testing.servers import NatsServer

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "log.json"
ONE_RUN_CHUNKS = 3000
MANY_RUNS = 50
MANY_RUN_CHUNKS = 100
LATENCY_CHUNKS = 150
ROUNDS = 5
LATENCY_GAP_S = 0.004  # pacing of latency probes (an agent streams tokens, not a firehose)


def payload(i: int, t: float = 0.0) -> dict[str, Any]:
    return {"type": "TEXT_MESSAGE_CONTENT", "messageId": "msg-1", "delta": f"token {i} " + "x" * 40, "t": t}


def encode(chunk: dict[str, Any]) -> bytes:
    return json.dumps(chunk, separators=(",", ":"), ensure_ascii=False).encode()


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


async def baton_append(log: DeliveryLog, runs: int, chunks: int, tag: str) -> float:
    writers = [log.writer(f"{tag}-{r}", 1) for r in range(runs)]
    for w in writers:
        await w.fence()
    batches = [[payload(i) for i in range(chunks)] for _ in range(runs)]

    async def one(w: Any, batch: list[dict[str, Any]]) -> None:
        for i in range(0, len(batch), 50):  # the driver appends what one journal read gave
            await w.append(batch[i : i + 50])

    t0 = time.perf_counter()
    await asyncio.gather(*(one(w, b) for w, b in zip(writers, batches)))
    return runs * chunks / (time.perf_counter() - t0)


async def raw_publish(nc: NATS, prefix: str, runs: int, chunks: int, tag: str) -> float:
    """Raw nats-py appends with baton's header set and compare (see the module docstring)."""
    js = nc.jetstream()
    batches = [[payload(i) for i in range(chunks)] for _ in range(runs)]

    async def one(r: int) -> None:
        subject = f"{prefix}.{tag}-{r}"
        last = 0
        for n, chunk in enumerate(batches[r], 1):
            headers = {"Baton-Kind": "chunk", "Baton-Epoch": "1", "Baton-Origin": "journal", "Baton-Fp": "f" * 64,
                       "Nats-Msg-Id": f"{tag}-{r}/1/{n}", "Nats-Expected-Last-Subject-Sequence": str(last)}
            last = (await js.publish(subject, encode(chunk), headers=headers)).seq

    t0 = time.perf_counter()
    await asyncio.gather(*(one(r) for r in range(runs)))
    return runs * chunks / (time.perf_counter() - t0)


async def raw_bare_publish(nc: NATS, prefix: str, runs: int, chunks: int, tag: str) -> float:
    """The older baseline: payloads encoded before the clock starts, no headers."""
    js = nc.jetstream()
    bodies = [encode(payload(i)) for i in range(chunks)]

    async def one(r: int) -> None:
        subject = f"{prefix}.{tag}-{r}"
        for body in bodies:
            await js.publish(subject, body)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(r) for r in range(runs)))
    return runs * chunks / (time.perf_counter() - t0)


async def baton_latency(log: DeliveryLog, runs: int, tag: str) -> list[float]:
    lat: list[float] = []

    async def one(r: int) -> None:
        run_id = f"{tag}-{r}"
        w = log.writer(run_id, 1)
        await w.fence()
        reader = log.read(run_id, "-1")
        await reader.open()

        async def consume() -> None:
            async with reader:
                async for _, chunk in reader:
                    lat.append(time.perf_counter() - chunk["t"])

        task = asyncio.create_task(consume())
        try:
            for i in range(LATENCY_CHUNKS):
                await w.append([payload(i, time.perf_counter())])
                await asyncio.sleep(LATENCY_GAP_S)
            await w.close("completed")
            async with asyncio.timeout(30):
                await task
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    await asyncio.gather(*(one(r) for r in range(runs)))
    return lat


async def raw_latency(nc: NATS, prefix: str, runs: int, tag: str, *, fenced: bool = True) -> list[float]:
    """Raw nats-py appends read back by an ordered push consumer per subject.

    ``fenced``: each append carries baton's header set and compare, as :func:`raw_publish`
    does (the baseline the target is measured against); without it, bare publishes (the
    older, looser baseline, kept as ``raw_bare``).
    """
    js = nc.jetstream()
    lat: list[float] = []

    async def one(r: int) -> None:
        subject = f"{prefix}.{tag}-{r}"
        done = asyncio.Event()

        async def cb(msg: Any) -> None:
            chunk = json.loads(msg.data)
            lat.append(time.perf_counter() - chunk["t"])
            if chunk["delta"].startswith(f"token {LATENCY_CHUNKS - 1} "):
                done.set()

        sub = await js.subscribe(subject, cb=cb, ordered_consumer=True)
        try:
            last = 0
            for i in range(LATENCY_CHUNKS):
                body = encode(payload(i, time.perf_counter()))
                if fenced:
                    headers = {"Baton-Kind": "chunk", "Baton-Epoch": "1", "Baton-Origin": "journal",
                               "Baton-Fp": "f" * 64, "Nats-Msg-Id": f"{tag}-{r}/1/{i + 1}",
                               "Nats-Expected-Last-Subject-Sequence": str(last)}
                    last = (await js.publish(subject, body, headers=headers)).seq
                else:
                    await js.publish(subject, body)
                await asyncio.sleep(LATENCY_GAP_S)
            async with asyncio.timeout(30):
                await done.wait()
        finally:
            await sub.unsubscribe()

    await asyncio.gather(*(one(r) for r in range(runs)))
    return lat


async def main() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(pathlib.Path(tmp))
        server.start()
        try:
            nc = await nats.connect(server.url)
            cfg = LogConfig(stream="BENCH_RUNS", subject_prefix="bench.runs", bucket="bench-threads")
            log = DeliveryLog(nc, cfg)
            await log.provision()
            raw_prefix = "bench.raw"
            await nc.jetstream().add_stream(name="BENCH_RAW", subjects=[f"{raw_prefix}.>"], allow_direct=True)
            # warm-up (connections, stream files)
            await baton_append(log, 1, 200, "warm")
            await raw_publish(nc, raw_prefix, 1, 200, "warm")

            results: dict[str, Any] = {}
            for key, runs, chunks in (("append_1_run", 1, ONE_RUN_CHUNKS), ("append_50_runs", MANY_RUNS, MANY_RUN_CHUNKS)):
                got: dict[str, list[float]] = {"baton": [], "raw": [], "raw_bare": []}
                for rnd in range(ROUNDS):
                    names = ["baton", "raw", "raw_bare"]
                    for name in names[rnd % 3:] + names[: rnd % 3]:  # rotate who goes first
                        tag = f"{key}-{rnd}"
                        if name == "baton":
                            got[name].append(await baton_append(log, runs, chunks, tag))
                        elif name == "raw":
                            got[name].append(await raw_publish(nc, raw_prefix, runs, chunks, tag))
                        else:
                            got[name].append(await raw_bare_publish(nc, raw_prefix, runs, chunks, tag + "b"))
                results[key] = {f"{name}_chunks_per_s": statistics.median(v) for name, v in got.items()}
                results[key]["rounds"] = got
                r = results[key]
                r["ratio"] = r["baton_chunks_per_s"] / r["raw_chunks_per_s"]
                r["ratio_vs_raw_bare"] = r["baton_chunks_per_s"] / r["raw_bare_chunks_per_s"]
            for runs in (1, 10):
                per: dict[str, list[list[float]]] = {"baton": [], "raw": [], "raw_bare": []}
                for rnd in range(ROUNDS):
                    names = ["baton", "raw", "raw_bare"]
                    for name in names[rnd % 3:] + names[: rnd % 3]:  # rotate who goes first
                        tag = f"lat{runs}-{rnd}"
                        if name == "baton":
                            per[name].append(await baton_latency(log, runs, tag))
                        else:
                            per[name].append(await raw_latency(nc, raw_prefix, runs, f"{tag}{name}",
                                                               fenced=name == "raw"))
                lat_r: dict[str, Any] = {"samples": sum(len(v) for v in per["baton"])}
                for name, rounds_ in per.items():
                    lat_r[f"{name}_p50"] = statistics.median(1000 * statistics.median(v) for v in rounds_)
                    lat_r[f"{name}_p99"] = statistics.median(1000 * pct(v, 99) for v in rounds_)
                    lat_r[f"{name}_p99_rounds"] = [1000 * pct(v, 99) for v in rounds_]
                results[f"latency_{runs}_runs_ms"] = lat_r
                r = results[f"latency_{runs}_runs_ms"]
                r["p99_ratio"] = r["baton_p99"] / r["raw_p99"]
                r["p99_ratio_vs_raw_bare"] = r["baton_p99"] / r["raw_bare_p99"]
            # Alignment read: headers of every record of a long run, once.
            w = log.writer("align", 1)
            await w.fence()
            for i in range(0, 20000, 500):
                await w.append([payload(j) for j in range(i, i + 500)])
            t0 = time.perf_counter()
            recs = await log.stored_headers("align")
            dt = time.perf_counter() - t0
            results["stored_headers"] = {"records": len(recs), "seconds": dt, "records_per_s": len(recs) / dt}
            await nc.close()
        finally:
            server.kill()

    targets = {
        "one_run_ge_0_9_raw": results["append_1_run"]["ratio"] >= 0.9,
        "fifty_runs_ge_0_9_raw": results["append_50_runs"]["ratio"] >= 0.9,
        "p99_le_1_3_raw_at_10_runs": results["latency_10_runs_ms"]["p99_ratio"] <= 1.3,
    }
    results["targets_met"] = targets
    print(f"median of {ROUNDS} rounds, sides rotated")
    print(f"{'measure':34} {'baton':>12} {'raw nats-py':>12} {'ratio':>7} {'raw bare':>10} {'ratio':>7}")
    for k in ("append_1_run", "append_50_runs"):
        r = results[k]
        print(f"{k + ' (chunks/s)':34} {r['baton_chunks_per_s']:12.0f} {r['raw_chunks_per_s']:12.0f} {r['ratio']:7.2f}"
              f" {r['raw_bare_chunks_per_s']:10.0f} {r['ratio_vs_raw_bare']:7.2f}")
    for runs in (1, 10):
        r = results[f"latency_{runs}_runs_ms"]
        print(f"{f'append->reader p50 @{runs} runs (ms)':34} {r['baton_p50']:12.2f} {r['raw_p50']:12.2f}"
              f" {'':7} {r['raw_bare_p50']:10.2f}")
        print(f"{f'append->reader p99 @{runs} runs (ms)':34} {r['baton_p99']:12.2f} {r['raw_p99']:12.2f}"
              f" {r['p99_ratio']:7.2f} {r['raw_bare_p99']:10.2f} {r['p99_ratio_vs_raw_bare']:7.2f}")
    s = results["stored_headers"]
    print(f"{'stored_headers (records/s)':34} {s['records_per_s']:12.0f}   ({s['records']} in {s['seconds']:.2f} s)")
    print("targets:", ", ".join(f"{k}={'yes' if v else 'NO'}" for k, v in targets.items()))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    asyncio.run(main())
