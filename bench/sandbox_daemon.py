"""Journal reads through the sandbox daemon, side by side with a local file read.

A real daemon (``python -m sandbox_host.daemon``, a subprocess on loopback, with an internal
token as in every deployment) serves a temp directory. Measured in this process, the two ways
alternated round by round so that load drifts hit both alike:

**Throughput**: a journal of ``MIB`` MiB (NDJSON lines) read from byte 0 to its end, as a
takeover's catch-up does: (local) ``open`` + ``read`` in 1 MiB pieces in a worker thread
(the local provider's read before the daemon); (daemon) the client's follow
(:meth:`sandbox_host.providers._daemon_client.DaemonClient.follow`) until the last byte.
MB/s, median of ``ROUNDS``. Target: daemon ≥ 0.5 × local. A third side, the **floor**
(:mod:`bench._grpc_floor`), is the same number of 1 MiB messages through a bare Python gRPC
stream between two processes (no protobuf, no file): what any gRPC daemon in Python can reach.
The three sides run in an order rotated round by round. The daemon's chunks are 1 MiB, read
ahead in a worker thread while the previous one is sent, and written and read without a
protobuf message (:mod:`sandbox_host.daemon._wire`: one copy each way instead of two; the
same bytes on the wire), uncompressed.

**Follow latency**: a writer appends one line (``write`` + ``flush``) every 2–6 ms; a follower
waits on it: (local) the inotify follow the local provider used in-process
(:func:`sandbox_host.daemon._files.follow_file`, the same code the daemon runs); (daemon) the
client's follow through the daemon. From the append to the line's arrival, p50 / p99 over
``LINES`` lines. Target: daemon p50 ≤ 5 ms.

Writes ``bench/results/sandbox_daemon.json``. ``python -m bench.sandbox_daemon [MiB] [rounds]``.
"""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, AsyncIterator

import grpc

from baton.malloc_tuning import retain_freed_memory
from bench import _grpc_floor
from sandbox_host.daemon import sandbox_token
from sandbox_host.daemon._files import follow_file
from sandbox_host.providers._daemon_client import DaemonClient
from sandbox_host.providers._inotify import FileWatcher

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "sandbox_daemon.json"
MIB = 64
ROUNDS = 5
LINES = 300
TARGET_THROUGHPUT_RATIO = 0.5
TARGET_FOLLOW_P50 = 0.005


def _journal(path: pathlib.Path, mib: int) -> int:
    line = b'{"type":"stream_event","event":{"delta":{"text":"' + b"x" * 180 + b'"}}}\n'
    with path.open("wb") as f:
        block = line * ((1 << 20) // len(line) + 1)
        for _ in range(mib):
            f.write(block)
    return path.stat().st_size


def _read_local(path: pathlib.Path) -> int:
    n = 0
    with path.open("rb") as f:
        while data := f.read(1 << 20):
            n += len(data)
    return n


async def _read_daemon(client: DaemonClient, path: pathlib.Path, size: int) -> int:
    n = 0
    stream = client.follow(str(path), 0)
    try:
        async for data in stream:
            n += len(data)
            if n >= size:
                break
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    return n


async def _latencies(follow: AsyncIterator[bytes], path: pathlib.Path, lines: int) -> list[float]:
    sent: list[float] = []
    got: list[float] = []
    buf = b""

    async def reader() -> None:
        nonlocal buf
        async for data in follow:
            now = time.perf_counter()
            buf += data
            while b"\n" in buf:
                _, buf = buf.split(b"\n", 1)
                got.append(now)
            if len(got) >= lines:
                return

    task = asyncio.create_task(reader())
    await asyncio.sleep(0.2)  # the follow is open (not a measurement: both ways alike)
    with path.open("ab") as f:
        for i in range(lines):
            f.write(b'{"i":%d}\n' % i)
            f.flush()
            sent.append(time.perf_counter())
            await asyncio.sleep(random.uniform(0.002, 0.006))
    async with asyncio.timeout(30):
        await task
    await follow.aclose()  # type: ignore[attr-defined]
    return [g - s for s, g in zip(sent, got)]


def _stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"p50": statistics.median(xs), "p99": xs[min(len(xs) - 1, int(len(xs) * 0.99))], "max": xs[-1],
            "n": len(xs)}


async def main(mib: int = MIB, rounds: int = ROUNDS) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="baton-bench-daemon-") as tmp:
        root = pathlib.Path(tmp)
        addr_file = root / "addr"
        token = sandbox_token("bench-cluster-token", "bench")
        env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
        env["BATON_INTERNAL_TOKEN"] = token
        argv = [sys.executable, "-m", "sandbox_host.daemon", "--listen", "127.0.0.1:0", "--root", str(root),
                "--addr-file", str(addr_file)]
        # Started once, before any measurement.
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: ASYNC220
        floor_proc = subprocess.Popen([sys.executable, "-m", "bench._grpc_floor"], env=env,  # noqa: ASYNC220
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            assert floor_proc.stdout is not None
            floor_port = int(await asyncio.to_thread(floor_proc.stdout.readline))
            floor = grpc.aio.insecure_channel(f"127.0.0.1:{floor_port}", options=_grpc_floor.CLIENT_OPTIONS)
            deadline = time.monotonic() + 30
            while not addr_file.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the sandbox daemon did not start")
                await asyncio.sleep(0.02)
            address = addr_file.read_text().split()[0]

            async def resolve() -> str:
                return address

            client = DaemonClient(resolve, token=token)
            try:
                journal = root / "journal.ndjson"
                size = await asyncio.to_thread(_journal, journal, mib)
                floor_mib = -(-size // (1 << 20))
                mbs: dict[str, list[float]] = {"local": [], "daemon": [], "floor": []}
                await _read_daemon(client, journal, size)  # warm: the channel, the page cache
                await _grpc_floor.read(floor, floor_mib)
                ways = ["local", "daemon", "floor"]
                for r in range(rounds):
                    for way in ways[r % 3:] + ways[:r % 3]:  # the order rotated round by round
                        t0 = time.perf_counter()
                        if way == "local":
                            n = await asyncio.to_thread(_read_local, journal)
                        elif way == "daemon":
                            n = await _read_daemon(client, journal, size)
                        else:
                            n = await _grpc_floor.read(floor, floor_mib)
                        dt = time.perf_counter() - t0
                        assert n == (size if way != "floor" else floor_mib << 20), (way, n, size)
                        mbs[way].append(n / dt / 1e6)
                watcher = FileWatcher()
                lat_local: list[float] = []
                lat_daemon: list[float] = []
                for r in range(2):
                    for way in (("local", "daemon") if r % 2 == 0 else ("daemon", "local")):
                        path = root / f"follow-{way}-{r}.ndjson"
                        path.write_bytes(b"")
                        follow = (follow_file(str(path), 0, watcher, 0.25) if way == "local"
                                  else client.follow(str(path), 0))
                        (lat_local if way == "local" else lat_daemon).extend(
                            await _latencies(follow, path, LINES // 2))
            finally:
                await client.close()
                await floor.close(None)
        finally:
            for p in (proc, floor_proc):
                p.terminate()
                p.wait(10)
    local, daemon, floor_mbs = (statistics.median(mbs[w]) for w in ("local", "daemon", "floor"))
    fl, fd = _stats(lat_local), _stats(lat_daemon)
    out: dict[str, Any] = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}",
        "journal_mib": mib, "rounds": rounds,
        "throughput_mb_s": {"local": local, "daemon": daemon, "ratio": daemon / local, "floor": floor_mbs,
                            "floor_ratio": floor_mbs / local, "daemon_over_floor": daemon / floor_mbs,
                            "target_ratio": TARGET_THROUGHPUT_RATIO, "local_all": mbs["local"],
                            "daemon_all": mbs["daemon"], "floor_all": mbs["floor"]},
        "follow_latency_s": {"local": fl, "daemon": fd, "target_p50": TARGET_FOLLOW_P50},
    }
    out["met"] = out["throughput_mb_s"]["ratio"] >= TARGET_THROUGHPUT_RATIO and fd["p50"] <= TARGET_FOLLOW_P50
    _print(out)
    RESULTS.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    return out


def _print(r: dict[str, Any]) -> None:
    t, f = r["throughput_mb_s"], r["follow_latency_s"]
    print(f"{'figure':34} {'local':>10} {'daemon':>10} {'daemon/local':>13} {'target':>10}")
    print(f"{'journal read, MB/s (median)':34} {t['local']:10.0f} {t['daemon']:10.0f} {t['ratio']:13.2f} {'>= 0.5x':>10}")
    print(f"{'  floor: bare gRPC stream, MB/s':34} {'':10} {t['floor']:10.0f} {t['floor_ratio']:13.2f} "
          f"{'':10}  (daemon/floor {t['daemon_over_floor']:.2f})")
    for q in ("p50", "p99"):
        print(f"{'follow latency ' + q + ', ms':34} {f['local'][q] * 1000:10.2f} {f['daemon'][q] * 1000:10.2f} "
              f"{f['daemon'][q] / max(f['local'][q], 1e-9):13.2f} {('<= 5 ms' if q == 'p50' else ''):>10}")
    print(f"targets met: {r['met']}")


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:3]]
    retain_freed_memory()  # as the sandbox host's process does (sandbox_host/__main__.py)
    asyncio.run(main(*args))
