"""Answer latency of a tool approval as a user sees it (docs/hitl.md), side by side with its floor.

One etcd, one nats-server, a coordinator, one sandbox host (the stand-in ``claude`` on its
``PATH``) and one gateway, each a real subprocess. A ``claude-code`` run with ``approvals:
true`` gets a prompt of ``ASKS`` lines ``run echo <n>``; each line is a Bash call that asks. A
reader follows the run on the gateway's SSE stream (the ``POST /api/chat`` response). For
every ask the bench answers as a browser does, ``POST /api/runs/{run}/approvals/{id}
{"approved": true}``, and measures from the moment that POST is sent:

(a) answer → the ``approval_answer`` chunk at the SSE reader: the gateway's CAS of the run
    record (coordinator ``PutRunInput``, one etcd txn), the host's ``WatchRun`` event, the
    inbox append, the wrapper's relay (``tail -f`` on the inbox), the ``baton_input`` journal
    line, the host's journal follower, the translator, the JetStream append, the gateway's
    log reader, SSE;
(b) answer → the command's ``TOOL_CALL_RESULT`` at the same reader (the agent got the answer,
    ran the command, its result went the same way back).

**The floor** (what the path cannot beat without dropping a hop), measured in this process
between the samples so that load drifts hit both alike: one raw etcd put seen by a raw etcd
watch (the answer must become durable and reach the host that drives the run: a consensus
write plus a watch event is the least that does both; our path adds the coordinator's gRPC
hop on each side) **plus** one raw NATS request/reply round trip (the result must travel
host → NATS → gateway: a NATS message each way is the least for a host-side event to reach a
gateway-side reader, as the log append is a JetStream publish acknowledged by the server and
the delivery a second NATS message). It leaves out the two HTTP hops (POST, SSE), the
sandbox relay and the agent, which any design has too, so the ratio (a) / floor says what
baton's own machinery costs on top of the bare store and bus. The coordinator's own
``PutRunInput`` → ``WatchRun`` is measured too (a figure of the path, not of the floor).

**The relay's poll.** The launch wrapper's relay is ``tail -n +1 -s 0.05 -f --pid=<agent>`` (``-s 0.2`` when these variants were
first measured).
GNU ``tail -f`` follows a file with inotify where it can: the append wakes it at once and
``-s`` only paces the ``--pid`` check. Where it cannot (a file system it does not trust for
inotify: overlayfs, i.e. the docker provider, whose inbox lives in the container's root file
system, ``/baton``; NFS; a ``tail`` without inotify such as busybox's) it polls every ``-s``
seconds, which adds ~``s``/2 on average. The bench runs the same run four ways, through a
``tail`` shim first on the host's ``PATH`` that rewrites the relay's arguments only (the
wrapper is unchanged): ``stock`` (as shipped), ``s0.05`` (``-s 0.05``), ``poll`` (GNU tail's
``---disable-inotify``: what the relay does on overlayfs) and ``poll s0.05``. One run of each
per round, the order rotated round by round. Each answer is sent a random 0.05–0.3 s after its
ask arrived (a user's moment, not the bench's pace, which would otherwise phase-lock the answers
to a polling relay's period and show a full period instead of half of one on average).

Writes ``bench/results/approvals.json``. ``python -m bench.approvals [asks per run] [rounds]``.
"""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "approvals.json"
REPO = pathlib.Path(__file__).resolve().parent.parent
ASKS = 10
ROUNDS = 3
#: Relay variants: name → (extra tail arguments, the -s value or "" for the wrapper's own).
VARIANTS: dict[str, tuple[str, str]] = {
    "stock": ("", ""),
    "s0.05": ("", "0.05"),
    "poll": ("---disable-inotify", ""),
    "poll s0.05": ("---disable-inotify", "0.05"),
}
#: The lead's target for (a): p50 within this many times the floor's p50.
TARGET_RATIO = 3.0

_SHIM = r"""#!/bin/sh
# bench/approvals.py: rewrite the launch wrapper's relay (the only tail with --pid=).
case " $* " in *" --pid="*) ;; *) exec {real} "$@" ;; esac
extra= s=
[ -r {mode} ] && {{ read -r extra s <{mode} || :; }}
[ "$extra" = - ] && extra=
prev=
for a in "$@"; do
  b=$a
  [ "$prev" = -s ] && [ -n "$s" ] && b=$s
  prev=$a
  set -- "$@" "$b"
done
shift $(( $# / 2 ))
exec {real} $extra "$@"
"""


def _pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def _stats(xs: list[float]) -> dict[str, float]:
    return {"p50": statistics.median(xs), "p99": _pct(xs, 99), "max": max(xs), "n": len(xs)}


class Floor:
    """The floor's parts, each one sample at a time: raw etcd put → watch, raw NATS
    request/reply, and (a path figure) the coordinator's PutRunInput → WatchRun."""

    def __init__(self, etcd: Any, nc: Any, cc: Any, tag: str, floor_run: str) -> None:
        self.etcd, self.nc, self.cc, self.tag, self.floor_run = etcd, nc, cc, tag, floor_run
        self.etcd_watch: list[float] = []
        self.nats_rr: list[float] = []
        self.coord_watch: list[float] = []
        self._n = 0

    async def start(self) -> None:
        async def echo(msg: Any) -> None:
            await msg.respond(msg.data)
        self._sub = await self.nc.subscribe(f"bench.{self.tag}.echo", cb=echo)
        await self.nc.flush()

    async def sample(self) -> None:
        self._n += 1
        self.etcd_watch.append(await self._etcd_put_watch())
        t = time.monotonic()
        await self.nc.request(f"bench.{self.tag}.echo", b'{"type":"CUSTOM"}', timeout=10)
        self.nats_rr.append(time.monotonic() - t)
        self.coord_watch.append(await self._coordinator_put_watch())

    async def _etcd_put_watch(self) -> float:
        from coordinator import _etcd as E

        key = f"/{self.tag}/bench-floor".encode()
        seen = asyncio.Event()
        opened = asyncio.Event()
        value = str(self._n).encode()

        async def watch() -> None:
            agen = self.etcd.watch([(key, b"")])
            opened.set()
            async for _rev, events in agen:
                if any(ev.kv.value == value for ev in events):
                    seen.set()
                    return

        w = asyncio.create_task(watch())
        await opened.wait()
        await asyncio.sleep(0.05)  # the watch is registered with etcd
        t = time.monotonic()
        await self.etcd.txn([], [E.put(key, value)], timeout=10)
        async with asyncio.timeout(10):
            await seen.wait()
        took = time.monotonic() - t
        w.cancel()
        await asyncio.gather(w, return_exceptions=True)
        return took

    async def _coordinator_put_watch(self) -> float:
        from baton.v1.coordinator_pb2 import PutRunInputRequest
        from baton.v1.runs_pb2 import RunInput

        iid = f"f{self._n}"
        seen = asyncio.Event()

        async def watch() -> None:
            async for ev in self.cc.watch_run(self.floor_run):
                if ev.record is not None and any(i.id == iid for i in ev.record.inputs):
                    seen.set()
                    return

        w = asyncio.create_task(watch())
        await asyncio.sleep(0.05)  # the watch is open (its first event is the record as it is)
        t = time.monotonic()
        await self.cc.put_run_input(self.floor_run, PutRunInputRequest.STEER, RunInput(id=iid, message="floor"))
        async with asyncio.timeout(10):
            await seen.wait()
        took = time.monotonic() - t
        w.cancel()
        await asyncio.gather(w, return_exceptions=True)
        return took


async def one_run(http: Any, gw_url: str, asks: int, floor: Floor, rng: random.Random) -> dict[str, list[float]]:
    """A run of ``asks`` approvals through the gateway → per-approval latencies (seconds)."""
    from baton.sse import Comment, aiter_sse

    run_id, thread = f"run-{uuid.uuid4().hex[:10]}", f"thr-{uuid.uuid4().hex[:8]}"
    prompt = "\n".join(f"run echo {n}" for n in range(asks))
    body = {"threadId": thread, "agent": {"kind": "claude-code", "approvals": True},
            "messages": [{"id": "u1", "role": "user", "content": prompt}]}
    sent: dict[str, float] = {}
    tool_of: dict[str, str] = {}  # toolCallId → approval id
    asks_seen: asyncio.Queue[str] = asyncio.Queue()
    out: dict[str, list[float]] = {"answer_chunk": [], "tool_result": [], "post_rtt": []}
    ended: list[str] = []

    async def read() -> None:
        async with http.stream("POST", f"{gw_url}/api/chat?runId={run_id}", json=body) as resp:
            if resp.status_code != 200:
                raise RuntimeError(f"POST /api/chat: {resp.status_code} {(await resp.aread())[:300]!r}")
            async for item in aiter_sse(resp.aiter_bytes()):
                now = time.monotonic()
                if isinstance(item, Comment):
                    if item.text == "end":
                        return
                    continue
                c = json.loads(item.data)
                kind = c.get("type")
                if kind == "CUSTOM" and c.get("name") == "approval-requested":
                    tool_of[c["value"]["toolCallId"]] = c["value"]["approval"]["id"]
                    await asks_seen.put(c["value"]["approval"]["id"])
                elif kind == "ACTIVITY_SNAPSHOT" and c.get("activityType") == "approval_answer":
                    aid = c["content"]["approvalId"]
                    if aid in sent:
                        out["answer_chunk"].append(now - sent[aid])
                elif kind == "TOOL_CALL_RESULT":
                    aid = tool_of.get(c.get("toolCallId", ""), "")
                    if aid in sent:
                        out["tool_result"].append(now - sent[aid])
                elif kind in ("RUN_FINISHED", "RUN_ERROR"):
                    ended.append(kind)

    reader = asyncio.create_task(read())
    try:
        for _ in range(asks):
            getter = asyncio.ensure_future(asks_seen.get())
            done, _p = await asyncio.wait({getter, reader}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                if reader in done:
                    reader.result()
                raise RuntimeError(f"run {run_id}: no ask within 60 s")
            aid = getter.result()
            await floor.sample()
            # A user answers at a random moment: without the jitter the answer lands at the same
            # phase of a polling relay's period every time (the bench's own pace is regular).
            await asyncio.sleep(rng.uniform(0.05, 0.3))
            sent[aid] = time.monotonic()
            r = await http.post(f"{gw_url}/api/runs/{run_id}/approvals/{aid}", json={"approved": True})
            out["post_rtt"].append(time.monotonic() - sent[aid])
            r.raise_for_status()
        async with asyncio.timeout(60):
            await reader
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    if ended != ["RUN_FINISHED"] or len(out["answer_chunk"]) != asks or len(out["tool_result"]) != asks:
        raise RuntimeError(f"run {run_id}: ended {ended}, {len(out['answer_chunk'])} answers, "
                           f"{len(out['tool_result'])} results of {asks}")
    return out


async def measure(asks: int = ASKS, rounds: int = ROUNDS) -> dict[str, Any]:
    import httpx

    from baton.coordinator_client import CoordinatorClient
    from baton.v1.runs_pb2 import RunRecord
    from baton_tools.standins import STANDINS_DIR
    from baton_tools.testing.cluster import start_coordinator, start_gateway, start_host
    from baton_tools.testing.servers import EtcdServer, NatsServer
    from coordinator._etcd import Etcd
    import nats as nats_py

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-approvals-"))
    real_tail = shutil.which("tail")
    if real_tail is None:
        raise SystemExit("no tail on PATH")
    shim_dir, mode = tmp / "shim", tmp / "tail-mode"
    shim_dir.mkdir()
    (shim_dir / "tail").write_text(_SHIM.format(real=real_tail, mode=mode))
    (shim_dir / "tail").chmod(0o755)
    etcd, nats = EtcdServer(tmp / "etcd"), NatsServer(tmp / "nats")
    etcd.start()
    nats.start()
    tag = f"b{uuid.uuid4().hex[:8]}"
    log_env: dict[str, Any] = {"BATON_RUNS_STREAM": f"RUNS_{tag}", "BATON_SUBJECT_PREFIX": f"baton.{tag}",
               "BATON_THREADS_BUCKET": f"threads-{tag}"}
    host_env = {**log_env, "BATON_JOURNAL_DIR": str(tmp / "journals"), "BATON_SANDBOX_DIR": str(tmp / "sandboxes"),
                "BATON_SESSION_TTL": "5", "BATON_LOG_LEVEL": "WARNING",
                "BATON_WORKSPACE_OBJECTS": f"ws-objects-{tag}", "BATON_WORKSPACE_HEADS": f"ws-heads-{tag}"}
    old_path = os.environ["PATH"]
    os.environ["PATH"] = f"{shim_dir}:{STANDINS_DIR}:{old_path}"
    os.environ.setdefault("ANTHROPIC_API_KEY", "bench-key")
    coord = host = gw = None
    per: dict[str, dict[str, list[float]]] = {v: {"answer_chunk": [], "tool_result": [], "post_rtt": []}
                                              for v in VARIANTS}
    order: list[list[str]] = []
    try:
        coord = await start_coordinator(etcd.endpoint, f"/{tag}/", log_dir=tmp / "logs", BATON_REAPER_INTERVAL="0")
        host = await start_host(coord.address, nats.url, host_id="bench-host", log_dir=tmp / "logs", **host_env)
        os.environ["PATH"] = old_path
        gw = await start_gateway(coord.address, nats.url, log_dir=tmp / "logs", log_level="WARNING",
                                 sse_keepalive="5", **log_env)
        raw_etcd = Etcd([etcd.endpoint])
        nc = await nats_py.connect(servers=[nats.url])
        try:
            async with CoordinatorClient(coord.address) as cc, \
                    httpx.AsyncClient(trust_env=False, timeout=60) as http:
                floor_run = f"floor-{uuid.uuid4().hex[:8]}"
                await cc.create_or_resume_run(RunRecord(run_id=floor_run, thread_id=f"t-{floor_run}"))
                floor = Floor(raw_etcd, nc, cc, tag, floor_run)
                await floor.start()
                names = list(VARIANTS)
                rng = random.Random(7)
                mode.write_text("- \n")
                await one_run(http, gw.url, 2, floor, rng)  # warm-up (imports, first sandbox), not counted
                for xs in (floor.etcd_watch, floor.nats_rr, floor.coord_watch):
                    xs.clear()
                for r in range(rounds):
                    rot = names[r % len(names):] + names[:r % len(names)]
                    order.append(rot)
                    for v in rot:
                        extra, s = VARIANTS[v]
                        mode.write_text(f"{extra or '-'} {s}\n")
                        got = await one_run(http, gw.url, asks, floor, rng)
                        for k, xs in got.items():
                            per[v][k].extend(xs)
        finally:
            await nc.close()
            await raw_etcd.close()
    finally:
        os.environ["PATH"] = old_path
        for h in (gw, host, coord):
            if h is not None:
                await h.stop()
        nats.kill()
        etcd.kill()

    f_parts = {"etcd_put_watch": floor.etcd_watch, "nats_request_reply": floor.nats_rr}
    floors = [a + b for a, b in zip(floor.etcd_watch, floor.nats_rr)]
    fl = _stats(floors)
    variants: dict[str, Any] = {}
    for v, d in per.items():
        a, b = _stats(d["answer_chunk"]), _stats(d["tool_result"])
        variants[v] = {"a_answer_to_answer_chunk_s": a, "b_answer_to_tool_result_s": b,
                       "answer_post_rtt_s": _stats(d["post_rtt"]),
                       "ratio_a_p50_to_floor_p50": a["p50"] / fl["p50"],
                       "ratio_b_p50_to_floor_p50": b["p50"] / fl["p50"]}
    stock = variants["stock"]
    return {
        "bench": "approvals",
        "asks_per_run": asks, "rounds": rounds, "order": order,
        "variants": variants,
        "floor_etcd_put_watch_plus_nats_request_reply_s": fl,
        "floor_parts_s": {k: _stats(xs) for k, xs in f_parts.items()},
        "coordinator_put_run_input_to_watch_run_s": _stats(floor.coord_watch),
        "target_ratio": TARGET_RATIO,
        "target_met": stock["ratio_a_p50_to_floor_p50"] <= TARGET_RATIO,
        "machine_load_1m_after": os.getloadavg()[0],
    }


def _print(r: dict[str, Any]) -> None:
    def row(name: str, s: dict[str, float], ratio: str = "") -> None:
        print(f"{name:44} {s['p50'] * 1000:8.1f} {s['p99'] * 1000:8.1f} {s['max'] * 1000:8.1f} {s['n']:4d} {ratio:>7}")

    print(f"{'figure':44} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'n':>4} {'p50/fl':>7}")
    for v, d in r["variants"].items():
        row(f"[{v}] (a) answer → approval_answer at SSE", d["a_answer_to_answer_chunk_s"],
            f"{d['ratio_a_p50_to_floor_p50']:.1f}x")
        row(f"[{v}] (b) answer → TOOL_CALL_RESULT at SSE", d["b_answer_to_tool_result_s"],
            f"{d['ratio_b_p50_to_floor_p50']:.1f}x")
        row(f"[{v}]     answer POST round trip", d["answer_post_rtt_s"])
    row("floor: etcd put→watch + NATS req/reply", r["floor_etcd_put_watch_plus_nats_request_reply_s"], "1.0x")
    for k, s in r["floor_parts_s"].items():
        row(f"  floor part: {k}", s)
    row("path part: coordinator PutRunInput→WatchRun", r["coordinator_put_run_input_to_watch_run_s"])
    st = r["variants"]["stock"]["ratio_a_p50_to_floor_p50"]
    print(f"stock (a) p50 / floor p50: {st:.1f}x (target <= {r['target_ratio']:g}x: "
          f"{'met' if r['target_met'] else 'NOT met'}); p99 over n <= 100 samples is the max")


async def main(asks: int = ASKS, rounds: int = ROUNDS) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        os.environ.pop(k, None)
    r = await measure(asks, rounds)
    _print(r)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(r, indent=2, sort_keys=True) + "\n")
    return r


if __name__ == "__main__":
    argv = [int(a) for a in sys.argv[1:3]]
    asyncio.run(main(*argv))
