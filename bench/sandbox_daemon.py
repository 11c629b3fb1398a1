"""Journal reads through the sandbox daemon, side by side with a local file read and with
the floors any network path in Python has here.

A real daemon (``python -m sandbox_host.daemon``, a subprocess on loopback, with an internal
token as in every deployment) serves a temp directory. Measured in this process, the ways
alternated round by round so that load drifts hit all alike:

**Throughput**: a journal of ``MIB`` MiB (NDJSON lines) read from byte 0 to its end, as a
takeover's catch-up does: (local) ``open`` + ``read`` in 1 MiB pieces in a worker thread
(the local provider's read before the daemon: a ``memcpy`` out of the page cache); (daemon)
the client's follow (:meth:`sandbox_host.providers._daemon_client.DaemonClient.follow`) until
the last byte. MB/s, median of ``ROUNDS``. Target: daemon ≥ 0.5 × local. Two floors beside
them, each a second process on loopback: the **socket floor** (:mod:`bench._socket_floor`),
the same bytes by ``socket.sendfile`` received with ``recv_into`` one reused buffer and copied
out per piece (what any network path in Python reaches at best: no framing, no HTTP/2, no
event loop); the **gRPC floor** (:mod:`bench._grpc_floor`), the same number of 1 MiB messages
through a bare Python gRPC stream (no protobuf, no file: what any gRPC daemon in Python can
reach). The four sides run in an order rotated round by round. The daemon's chunks are
1 MiB, read ahead in a worker thread while the previous one is sent, and written and read
without a protobuf message (:mod:`sandbox_host.daemon._wire`: one copy each way instead of
two; the same bytes on the wire), uncompressed.

**Catch-up as the host consumes it** (:mod:`bench._catchup`): a real Claude Code journal
(the corpus's, repeated to ``CATCHUP_MIB`` MiB) read from byte 0 through what a successor host
runs on it: :func:`sandbox_host.journal.follow_journal` into a
:class:`sandbox_host.pipeline.Replay` (the ``claude-stream-json`` translator, aligned against a
stored prefix of every chunk). (local) the in-process follow
(:func:`sandbox_host.daemon._files.follow_file`); (daemon) the client's follow. MB/s and
journal lines/s, median of ``CATCHUP_ROUNDS``, alternated: whether the daemon is ever what a
catch-up waits on.

**Follow latency**: a writer appends one line (``write`` + ``flush``) every 2–6 ms; a follower
waits on it: (local) the inotify follow the local provider used in-process
(:func:`sandbox_host.daemon._files.follow_file`, the same code the daemon runs); (daemon) the
client's follow through the daemon. From the append to the line's arrival, p50 / p99 over
``LINES`` lines. Target: daemon p50 ≤ 5 ms.

Writes ``bench/results/sandbox_daemon.json``.
``python -m bench.sandbox_daemon [MiB] [rounds] [catch-up MiB] [catch-up rounds]``.
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
from bench import _catchup as _catchup_mod
from bench import _grpc_floor, _socket_floor
from sandbox_host.daemon import sandbox_token
from sandbox_host.daemon._files import follow_file
from sandbox_host.daemon._wire import Chunk
from sandbox_host.providers._daemon_client import DaemonClient
from sandbox_host.providers._inotify import FileWatcher

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "sandbox_daemon.json"
MIB = 64
ROUNDS = 12
LINES = 300
CATCHUP_MIB = 32
CATCHUP_ROUNDS = 6
SIDES = ["local", "daemon", "grpc_floor", "socket_floor"]
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
        async for chunk in stream:
            n += len(chunk.data)
            if n >= size:
                break
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    return n


async def _data_of(chunks: AsyncIterator[Chunk]) -> AsyncIterator[bytes]:
    """The bytes of a daemon follow's chunks (as the local follow yields them)."""
    try:
        async for chunk in chunks:
            yield chunk.data
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]


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


async def _spawn(module: str, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], int]:
    """A floor's server process and the loopback port it printed."""
    proc = subprocess.Popen([sys.executable, "-m", module], env=env, stdout=subprocess.PIPE,  # noqa: ASYNC220
                            stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    line = await asyncio.to_thread(proc.stdout.readline)
    if not line.strip():
        proc.kill()
        raise SystemExit(f"{module} did not start")
    return proc, int(line)


async def _throughput(client: DaemonClient, floor: grpc.aio.Channel, socket_port: int, journal: pathlib.Path,
                      size: int, rounds: int) -> dict[str, list[float]]:
    """MB/s of each side, one figure a round, the order rotated round by round."""
    floor_mib = -(-size // (1 << 20))
    mbs: dict[str, list[float]] = {way: [] for way in SIDES}
    await _read_daemon(client, journal, size)  # warm: the channel, the page cache
    await _grpc_floor.read(floor, floor_mib)
    await asyncio.to_thread(_socket_floor.read, socket_port, str(journal), size)
    for r in range(rounds):
        for way in SIDES[r % len(SIDES):] + SIDES[:r % len(SIDES)]:
            t0 = time.perf_counter()
            if way == "local":
                n = await asyncio.to_thread(_read_local, journal)
            elif way == "daemon":
                n = await _read_daemon(client, journal, size)
            elif way == "grpc_floor":
                n = await _grpc_floor.read(floor, floor_mib)
            else:
                n = await asyncio.to_thread(_socket_floor.read, socket_port, str(journal), size)
            dt = time.perf_counter() - t0
            assert n == (size if way != "grpc_floor" else floor_mib << 20), (way, n, size)
            mbs[way].append(n / dt / 1e6)
    return mbs


async def _catchup(client: DaemonClient, root: pathlib.Path, mib: int, rounds: int) -> dict[str, Any]:
    """The catch-up as the host consumes it (:mod:`bench._catchup`), local and through the
    daemon, alternated round by round."""
    path = root / "catchup.ndjson"
    size, lines, nonce = await asyncio.to_thread(_catchup_mod.write_journal, path, mib)
    watcher = FileWatcher()

    def local(offset: int) -> AsyncIterator[bytes]:
        return follow_file(str(path), offset, watcher, 0.25)

    def daemon(offset: int) -> AsyncIterator[bytes]:
        return _data_of(client.follow(str(path), offset))

    first = await _catchup_mod.replay(local, nonce, [])  # what the predecessor appended
    stored = _catchup_mod.stored_prefix(first)
    await _catchup_mod.replay(daemon, nonce, stored)  # warm
    secs: dict[str, list[float]] = {"local": [], "daemon": []}
    for r in range(rounds):
        for way in (("local", "daemon") if r % 2 == 0 else ("daemon", "local")):
            t0 = time.perf_counter()
            chunks = await _catchup_mod.replay(local if way == "local" else daemon, nonce, stored)
            secs[way].append(time.perf_counter() - t0)
            assert len(chunks) == len(first) and chunks[-1] == first[-1], way
    med = {way: statistics.median(v) for way, v in secs.items()}
    return {"journal_bytes": size, "journal_lines": lines, "chunks": len(first), "rounds": rounds,
            "source": [f"corpus/claude-stream-json/{n}" for n in _catchup_mod.SOURCES],
            "mb_s": {way: size / s / 1e6 for way, s in med.items()},
            "lines_s": {way: lines / s for way, s in med.items()},
            "ratio": med["local"] / med["daemon"],
            "seconds_all": secs}


async def main(mib: int = MIB, rounds: int = ROUNDS, catchup_mib: int = CATCHUP_MIB,
               catchup_rounds: int = CATCHUP_ROUNDS) -> dict[str, Any]:
    # This process stands for the sandbox host, which does the same at its start
    # (sandbox_host/__main__.py); here, whichever way the bench is started.
    retain_freed_memory()
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
        procs = [proc]
        try:
            floor_proc, floor_port = await _spawn("bench._grpc_floor", env)
            procs.append(floor_proc)
            socket_proc, socket_port = await _spawn("bench._socket_floor", env)
            procs.append(socket_proc)
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
                mbs = await _throughput(client, floor, socket_port, journal, size, rounds)
                journal.unlink()
                catchup = await _catchup(client, root, catchup_mib, catchup_rounds)
                watcher = FileWatcher()
                lat_local: list[float] = []
                lat_daemon: list[float] = []
                for r in range(2):
                    for way in (("local", "daemon") if r % 2 == 0 else ("daemon", "local")):
                        path = root / f"follow-{way}-{r}.ndjson"
                        path.write_bytes(b"")
                        follow = (follow_file(str(path), 0, watcher, 0.25) if way == "local"
                                  else _data_of(client.follow(str(path), 0)))
                        (lat_local if way == "local" else lat_daemon).extend(
                            await _latencies(follow, path, LINES // 2))
            finally:
                await client.close()
                await floor.close(None)
        finally:
            for p in procs:
                p.terminate()
                p.wait(10)
    med = {way: statistics.median(v) for way, v in mbs.items()}
    local, daemon = med["local"], med["daemon"]
    fl, fd = _stats(lat_local), _stats(lat_daemon)
    out: dict[str, Any] = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}",
        "load_avg_1m": os.getloadavg()[0],
        "journal_mib": mib, "rounds": rounds,
        "throughput_mb_s": {**med, "ratio": daemon / local, "target_ratio": TARGET_THROUGHPUT_RATIO,
                            "grpc_floor_ratio": med["grpc_floor"] / local,
                            "socket_floor_ratio": med["socket_floor"] / local,
                            "daemon_over_grpc_floor": daemon / med["grpc_floor"],
                            "daemon_over_socket_floor": daemon / med["socket_floor"],
                            **{f"{way}_all": v for way, v in mbs.items()}},
        # Each round's sides ran one after the other (a fraction of a second apart): the
        # median of the per-round quotients is less exposed to load swings than the
        # quotient of the medians.
        "per_round_ratio_median": {f"{a}/{b}": statistics.median(x / y for x, y in zip(mbs[a], mbs[b]))
                                   for a, b in (("daemon", "local"), ("socket_floor", "local"),
                                                ("grpc_floor", "local"), ("daemon", "socket_floor"),
                                                ("daemon", "grpc_floor"), ("grpc_floor", "socket_floor"))},
        "catchup": catchup,
        "follow_latency_s": {"local": fl, "daemon": fd, "target_p50": TARGET_FOLLOW_P50},
    }
    out["met"] = out["throughput_mb_s"]["ratio"] >= TARGET_THROUGHPUT_RATIO and fd["p50"] <= TARGET_FOLLOW_P50
    _print(out)
    RESULTS.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    return out


def _print(r: dict[str, Any]) -> None:
    t, c, f = r["throughput_mb_s"], r["catchup"], r["follow_latency_s"]
    print(f"{'figure':40} {'local':>10} {'daemon':>10} {'daemon/local':>13} {'target':>10}")
    print(f"{'journal read, MB/s (median)':40} {t['local']:10.0f} {t['daemon']:10.0f} {t['ratio']:13.2f} "
          f"{'>= 0.5x':>10}")
    for way, what in (("socket_floor", "socket floor: sendfile + recv_into"), ("grpc_floor", "gRPC floor: bare stream")):
        print(f"{'  ' + what + ', MB/s':40} {'':10} {t[way]:10.0f} {t[way + '_ratio']:13.2f} "
              f"{'':10}  (daemon/it {t['daemon_over_' + way]:.2f})")
    print("per-round quotients, median: " + ", ".join(f"{k} {v:.2f}" for k, v in r["per_round_ratio_median"].items()))
    print(f"{'catch-up as the host consumes it, MB/s':40} {c['mb_s']['local']:10.1f} {c['mb_s']['daemon']:10.1f} "
          f"{c['ratio']:13.2f}")
    print(f"{'  the same, journal lines/s':40} {c['lines_s']['local']:10.0f} {c['lines_s']['daemon']:10.0f} "
          f"{c['ratio']:13.2f}")
    for q in ("p50", "p99"):
        print(f"{'follow latency ' + q + ', ms':40} {f['local'][q] * 1000:10.2f} {f['daemon'][q] * 1000:10.2f} "
              f"{f['daemon'][q] / max(f['local'][q], 1e-9):13.2f} {('<= 5 ms' if q == 'p50' else ''):>10}")
    print(f"targets met: {r['met']}")


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:5]]
    asyncio.run(main(*args))
