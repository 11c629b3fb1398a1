"""Durable Streams: append throughput and read latency of baton's ``/ds`` against the
protocol's reference server (``@durable-streams/server``), run side by side.

Scenarios, the same HTTP client for every server (``tests/node/ds/bench_client.mjs``, node's
undici: a lighter client than Python's, so the servers are what is measured):
- ``append_1_stream``: one writer appending 256-byte messages to one stream, back to back;
- ``append_16_streams``: 16 writers, one stream each, concurrently;
- ``read_latency``: a long-poll reader at the tail; the time from sending an append to the
  reader holding its bytes (p50/p99).

Three servers, whose durability differs (what an answered append has survived):
- ``baton``: the real ``python -m gateway`` (subprocess) with a coordinator, etcd and a
  nats-server. Every append is a JetStream publish to a file-storage stream, answered once
  nats-server has acked it: written to its block file (the OS page cache), not synced.
  nats-server fsyncs file-store data every ``sync_interval``: 2 minutes by default
  (``defaultSyncInterval`` in nats-server's server/filestore.go; docs.nats.io, jetstream
  ``sync_interval``), which the bench's nats-server keeps (``sync_interval: always`` would
  sync every write).
  An append survives the gateway's or nats-server's crash, not the host's power loss
  within that window (with R3 a majority of replicas holds it instead).
- ``reference``: the reference server in memory (``new DurableStreamTestServer()``):
  nothing survives its process.
- ``reference_file``: the reference server file-backed (``{ dataDir }``, a directory
  beside nats-server's store, on the same filesystem): each append is written to the
  stream's append-only segment file and ``fdatasync``'d before it is answered (appends to
  one stream one at a time, each with its own sync), then its metadata put into LMDB
  (lmdb-js's default ``overlappingSync``: committed, synced in the background; recovery
  reconciles offsets from the segment files). The strongest guarantee of the three: it
  survives power loss.
- ``floor``: ``bench/_ds_floor.py``, the gateway's uvicorn setup publishing each append to
  JetStream (fenced, answered after the ack) with none of the protocol: the least a Python
  server on baton's stack does per append. baton near the floor says the protocol layer
  costs little; the floor below a reference says no protocol work can reach that side.
- ``floor_2w``: the same floor in two processes on one port (``SO_REUSEPORT``), as two
  gateway workers: the most two workers could reach; its appends only (each process
  remembers only its own appends, so its long-polls are not measured).
Target: baton's throughput ≥ the reference's; the results give ratios against both
references (``ratios``; the floors' in ``floor_ratios`` and ``floor_2_workers_ratios``). Writes ``bench/results/durable_streams.json``.

Each round measures every side once, the order rotated by one each round (no side always
first or last), and every figure is the median over rounds. Each round also reports the
servers' CPU milliseconds per HTTP request (``/proc``: the gateway and nats-server for
baton, the node process for a reference), a figure the machine's load distorts less than
requests/s. ``BENCH_DS_VARIANTS`` (see :func:`variants`) runs several gateways (settings, or
another checkout's code) in the same rounds for an A/B; such a run prints its table and
writes no results file. By default two gateways run: ``baton`` (one process) and
``baton_2w`` (``BATON_GATEWAY_WORKERS=2``: two worker processes on one port); the second's
target is the in-memory reference's throughput (``workers_2_vs_1`` gives it against one
process). A gateway's CPU is its process's and its workers'.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench._cpu import processes


RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "durable_streams.json"
NODE_DIR = pathlib.Path(__file__).resolve().parent.parent / "tests" / "node"
ONE_STREAM_APPENDS = 400
MANY_STREAMS = 16
MANY_STREAMS_APPENDS = 100  # per stream
LATENCY_SAMPLES = 100
ROUNDS = int(os.environ.get("BENCH_DS_ROUNDS", "3"))


def measure(base: str, pids: dict[str, int], *, reads: bool = True) -> dict[str, Any]:
    """Run the node load generator (``tests/node/ds/bench_client.mjs``) against ``base``.

    Args:
        base: the server's Durable Streams URL.
        pids: processes whose CPU time the round costs (name → pid); each is reported as
            ``cpu_ms_per_request.<name>``: CPU milliseconds per HTTP request sent.
        reads: measure the long-poll read latency too (``False``: appends only, and
            ``read_latency_ms`` is ``None``).
    """
    node = shutil.which("node")
    assert node is not None
    env = {**os.environ, "ONE_STREAM_APPENDS": str(ONE_STREAM_APPENDS),
           "MANY_STREAMS_APPENDS": str(MANY_STREAMS_APPENDS),
           "LATENCY_SAMPLES": str(LATENCY_SAMPLES if reads else 0)}
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    out = subprocess.run([node, "ds/bench_client.mjs", base], cwd=NODE_DIR, env=env, capture_output=True,
                         timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"bench client against {base} failed: {out.stderr.decode(errors='replace')[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.decode().strip().splitlines()[-1])
    if not reads:
        result["read_latency_ms"] = None
    result["cpu_ms_per_request"] = {
        name: 1000 * (cpu_seconds(pid) - before[name]) / result["requests"] for name, pid in pids.items()}
    return result


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process and its live children (a gateway's workers) have
    used so far (``/proc/<pid>/stat``)."""
    return sum(cpu for p, parent, cpu, _argv in processes() if pid in (p, parent))


def variants() -> dict[str, dict[str, str]]:
    """``BENCH_DS_VARIANTS`` = ``name:K=V,K=V;name2:K=V``: gateways to compare, each started
    with its own ``BATON_*`` settings (``SRC=<checkout>`` runs the gateway's code from another
    checkout) and measured in the same interleaved rounds. Default: one gateway, ``baton``.
    The gateways share ``BATON_DS``, so each also takes the others' records (as a cluster's
    gateways do): the same extra load for every variant."""
    raw = os.environ.get("BENCH_DS_VARIANTS", "").strip()
    if not raw:
        return dict(DEFAULT_VARIANTS)
    out: dict[str, dict[str, str]] = {}
    for spec in raw.split(";"):
        name, _, kv = spec.strip().partition(":")
        out[name] = dict(item.split("=", 1) for item in kv.split(",") if item)
    return out


REFERENCES = ("reference", "reference_file")
TWO_WORKERS = "baton_2w"
DEFAULT_VARIANTS = {"baton": {}, TWO_WORKERS: {"BATON_GATEWAY_WORKERS": "2"}}


def start_reference(log: pathlib.Path, data_dir: pathlib.Path | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """The reference server on a free port: (process, URL). In memory, or with ``data_dir``
    in its file-backed store. Its output goes to ``log`` (a pipe nobody reads could fill and
    stall it: the file-backed store logs every append slower than 50 ms)."""
    node = shutil.which("node")
    if node is None or not (NODE_DIR / "node_modules" / "@durable-streams" / "server").is_dir():
        raise SystemExit("node and @durable-streams/server are needed (make node-deps)")
    argv = [node, "ds_reference_server.mjs", "0", *([str(data_dir)] if data_dir is not None else [])]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=NODE_DIR, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("http://"):
                return proc, line.strip()
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"reference server did not start: {log.read_text(errors='replace')[-2000:]}")


FLOOR = "floor"
#: The floor in two worker processes on one port: what two gateway workers could reach at most.
#: Its appends only: its reads are not measured (see bench/_ds_floor.py), and its CPU per
#: request is per append (the other sides' requests include their long-polls).
FLOOR_2W = "floor_2w"
#: The floor sides → their worker processes.
FLOORS = {FLOOR: 1, FLOOR_2W: 2}


def start_floor(nats_url: str, log: pathlib.Path, workers: int = 1) -> tuple[subprocess.Popen[bytes], str]:
    """``bench/_ds_floor.py`` on a free port, in ``workers`` processes: (process, URL of its
    ``/ds``). Returns once every worker has started (each prints ``_ds_floor.READY`` to
    ``log``); the floor runs in a process group of its own, which :func:`stop_floor` ends.

    Raises:
        SystemExit: it did not start within 30 s (nothing of it is left running).
    """
    from baton_tools.testing.servers import free_port

    from bench._ds_floor import READY
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).resolve().parent.parent)}
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "bench._ds_floor", nats_url, str(port), str(workers)],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while log.read_text(errors="replace").count(READY) < workers:
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_floor(proc)
            raise SystemExit(f"the floor server ({workers} workers) did not start: "
                             f"{log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}/ds"


def stop_floor(proc: subprocess.Popen[bytes]) -> None:
    """End a floor and its workers: SIGTERM to its process group, then SIGKILL to whatever of
    the group is still there after 10 s."""
    import signal

    def group_alive() -> bool:
        proc.poll()  # reap the leader: a zombie would keep the group answering
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return False
        return True

    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while group_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _check_source(env: dict[str, str], src: str) -> None:
    """Fail unless a process started with ``env`` here imports the gateway from ``src``."""
    out = subprocess.run([sys.executable, "-c", "import gateway; print(gateway.__file__)"], env=env,
                         capture_output=True, check=True, text=True).stdout.strip()
    if not pathlib.Path(out).resolve().is_relative_to(pathlib.Path(src).resolve()):
        raise SystemExit(f"the variant with SRC={src} would run {out}")


def order(sides: list[str], round_no: int) -> list[str]:
    """The sides of round ``round_no`` (from 0), rotated by one each round: no side always
    runs first or last while the machine's load drifts."""
    k = round_no % len(sides)
    return sides[k:] + sides[:k]


async def main() -> dict[str, Any]:
    from baton_tools.testing.cluster import GatewayProcess, start_coordinator, start_gateway
    from baton_tools.testing.servers import EtcdServer, NatsServer

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="baton-bench-ds-"))
    etcd, nats = EtcdServer(tmp / "etcd"), NatsServer(tmp / "nats")
    etcd.start()
    nats.start()
    assert nats.proc is not None
    refs: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    floors: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    gws: dict[str, GatewayProcess] = {}
    try:
        refs["reference"] = start_reference(tmp / "reference.log")
        # Beside nats-server's JetStream store (tmp/nats/jetstream): the same filesystem.
        refs["reference_file"] = start_reference(tmp / "reference_file.log", tmp / "reference_file")
        for name, workers in FLOORS.items():
            floors[name] = start_floor(nats.url, tmp / f"{name}.log", workers)
        coord = await start_coordinator(etcd.endpoint, f"/bench-ds-{os.getpid()}", log_dir=tmp)
        try:
            for name, settings in variants().items():
                settings_: dict[str, Any] = dict(settings)
                src = settings_.pop("SRC", None)
                gw = gws[name] = await start_gateway(coord.address, nats.url, log_dir=tmp,
                                                     log_level="WARNING", **settings_)
                if src:
                    # Restart on the same port with the other checkout first on the path.
                    # PYTHONSAFEPATH: `python -m` would otherwise put its working directory
                    # (this checkout) before PYTHONPATH, and run this checkout's code.
                    await gw.stop()
                    gw.env["PYTHONPATH"] = os.pathsep.join((src, gw.env["PYTHONPATH"]))
                    gw.env["PYTHONSAFEPATH"] = "1"
                    _check_source(gw.env, src)
                    await gw.start()
            # Interleaved rounds, each figure the median of its rounds: the machine's load
            # drifts over a run and hits every server alike.
            sides = [*gws, *FLOORS, *REFERENCES]
            rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
            failures: dict[str, int] = {}
            for i in range(ROUNDS):
                for name in order(sides, i):
                    if name in gws:
                        pid = gws[name].pid
                        assert pid is not None
                        url, pids = f"{gws[name].url}/ds", {"gateway": pid, "nats": nats.proc.pid}
                    elif name in floors:
                        url, pids = floors[name][1], {"server": floors[name][0].pid, "nats": nats.proc.pid}
                    else:
                        url, pids = refs[name][1], {"server": refs[name][0].pid}
                    reads = name != FLOOR_2W
                    try:
                        rounds[name].append(await asyncio.to_thread(measure, url, pids, reads=reads))
                    except RuntimeError as exc:
                        if name in gws:
                            raise
                        # The reference's own failure (its file-backed store has answered a
                        # POST to a stream it had just created with 404 under load): noted,
                        # and the round run again for it.
                        print(f"{name}: {exc}".splitlines()[0], "...", str(exc).splitlines()[-6:])
                        failures[name] = failures.get(name, 0) + 1
                        rounds[name].append(await asyncio.to_thread(measure, url, pids, reads=reads))
        finally:
            for gw in gws.values():
                await gw.stop()
            await coord.stop()
    finally:
        for proc, _ in refs.values():
            proc.terminate()
            proc.wait(10)
        for proc, _ in floors.values():
            stop_floor(proc)
        nats.stop()
        etcd.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    medians = {name: _median(r) for name, r in rounds.items()}
    first = next(iter(gws))
    out: dict[str, Any] = {**medians, "rounds": ROUNDS, "reference_client_failures": failures}
    if first != "baton":
        out["baton"] = medians[first]
    ratios = {name: {ref: _ratios(medians[name], medians[ref]) for ref in REFERENCES} for name in [*gws, *FLOORS]}
    default = gws.keys() == DEFAULT_VARIANTS.keys()
    out["ratios"] = ratios["baton"] if list(gws) == ["baton"] or default else {name: ratios[name] for name in gws}
    out["floor_ratios"] = ratios[FLOOR]
    out["floor_2_workers_ratios"] = ratios[FLOOR_2W]
    out["targets_met"] = {
        f"throughput_ge_{ref}": min(r["append_1_stream"], r["append_16_streams"]) >= 1.0
        for ref, r in ratios[first].items()}
    if TWO_WORKERS in gws:
        out["ratios_2_workers"] = ratios[TWO_WORKERS]
        out["workers_2_vs_1"] = {k: medians[TWO_WORKERS][f"{k}_per_s"] / medians[first][f"{k}_per_s"]
                                 for k in ("append_1_stream", "append_16_streams")}
        r2 = ratios[TWO_WORKERS]["reference"]
        out["targets_met"]["workers_2_throughput_ge_reference"] = min(r2["append_1_stream"],
                                                                      r2["append_16_streams"]) >= 1.0
    if (len(gws) == 1 and first == "baton") or default:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    names = sides
    w = max(12, *(len(n) + 2 for n in names))
    print(f"{'scenario':<24}" + "".join(f"{n:>{w}}" for n in names)
          + f"  (median of {ROUNDS} interleaved rounds)")
    for key, label in (("append_1_stream_per_s", "append_1_stream /s"),
                       ("append_16_streams_per_s", "append_16_streams /s")):
        print(f"{label:<24}" + "".join(f"{medians[n][key]:>{w}.0f}" for n in names))
    for q in ("p50", "p99"):
        print(f"{'read latency ' + q + ' ms':<24}" + "".join(
            f"{'n/a':>{w}}" if medians[n]["read_latency_ms"] is None else f"{medians[n]['read_latency_ms'][q]:>{w}.2f}"
            for n in names))
    print(f"{'server CPU ms/request':<24}" + "".join(
        f"{medians[n]['cpu_ms_per_request'].get('gateway', medians[n]['cpu_ms_per_request'].get('server', 0)):>{w}.3f}"
        for n in names))
    print(f"{'nats CPU ms/request':<24}" + "".join(
        f"{medians[n]['cpu_ms_per_request'].get('nats', 0):>{w}.3f}" for n in names))
    if "workers_2_vs_1" in out:
        print("2 workers / 1: " + ", ".join(f"{k} {v:.2f}" for k, v in out["workers_2_vs_1"].items()))
    for name in [*gws, *FLOORS]:
        for ref, r in ratios[name].items():
            read = f", read p50 {r['read_latency_p50']:.2f}" if "read_latency_p50" in r else ""
            print(f"ratio {name}/{ref}: append 1 stream {r['append_1_stream']:.2f}, "
                  f"16 streams {r['append_16_streams']:.2f}{read}")
    if ROUNDS > 1 or os.environ.get("BENCH_DS_SHOW_ROUNDS"):
        for name, rs in rounds.items():
            print(f"rounds {name}: 1 stream " + " ".join(f"{r['append_1_stream_per_s']:.0f}" for r in rs)
                  + " | 16 streams " + " ".join(f"{r['append_16_streams_per_s']:.0f}" for r in rs))
    return out


def _ratios(b: dict[str, Any], ref: dict[str, Any]) -> dict[str, float]:
    """``b``'s figures over ``ref``'s; no read ratio when ``b``'s reads were not measured."""
    out = {
        "append_1_stream": b["append_1_stream_per_s"] / ref["append_1_stream_per_s"],
        "append_16_streams": b["append_16_streams_per_s"] / ref["append_16_streams_per_s"],
    }
    if b["read_latency_ms"] is not None:
        out["read_latency_p50"] = b["read_latency_ms"]["p50"] / ref["read_latency_ms"]["p50"]
    return out


def _median(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over rounds (``read_latency_ms`` field by field; ``None`` stays
    ``None``: not measured)."""
    out: dict[str, Any] = {}
    for key, value in results[0].items():
        if value is None:
            out[key] = None
        elif isinstance(value, dict):
            out[key] = {k: statistics.median(r[key][k] for r in results) for k in value}
        else:
            out[key] = statistics.median(r[key] for r in results)
    return out


if __name__ == "__main__":
    asyncio.run(main())
