"""Benchmark: journal translation throughput and journal-line → chunk latency.

1. Lines/s through each translator over the shipped corpus (target ≥ 20,000 lines/s on one
   core), against a bare loop over the same bytes (split + ``json.loads``) in the same run.
2. Latency from "journal line written" (the writer's ``time.time()`` inside the line) to
   "chunk yielded" by ``follow_journal`` + the Codex translator on the local provider
   (target p99 ≤ 5 ms), against a bare loop that polls the same kind of file with
   ``os.read`` every 0.5 ms in the same run.

Writes ``bench/results/translate.json``. Run: ``python -m bench translate`` or
``python bench/translate.py``.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sandbox_host.journal import JournalExit, JournalLine, follow_journal, new_nonce  # noqa: E402
from sandbox_host.providers import SandboxSpec  # noqa: E402
from sandbox_host.providers.local import LocalProvider  # noqa: E402
from sandbox_host.translate import translator_for  # noqa: E402

RESULTS = REPO / "bench" / "results" / "translate.json"
LATENCY_LINES = 400
LATENCY_GAP = 0.005  # seconds between written lines

# The writer: one Codex agent_message line every LATENCY_GAP seconds, stamped when written.
_WRITER = f"""
import json, os, sys, time
for i in range({LATENCY_LINES}):
    line = json.dumps({{"type": "item.completed", "item": {{"id": "item_%d" % i, "type": "agent_message",
                        "text": "t=%r" % time.time()}}}})
    os.write(1, line.encode() + b"\\n")
    time.sleep({LATENCY_GAP})
"""


def _throughput(seconds: float = 2.0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for fmt in ("claude-stream-json", "codex-exec-json"):
        files = sorted((REPO / "corpus" / fmt).glob("*.jsonl"))
        journals = [[line for line in f.read_bytes().split(b"\n") if line] for f in files]
        n_lines = sum(len(j) for j in journals)

        def translate_all() -> None:
            for lines in journals:
                tr = translator_for(fmt, "bench-run", "bench-thread")
                for line in lines:
                    tr.feed(line)
                tr.finish(0)

        def bare_all() -> None:
            for lines in journals:
                for line in lines:
                    json.loads(line)

        rates = {}
        for name, fn in (("translator", translate_all), ("bare_parse", bare_all)):
            count, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                fn()
                count += n_lines
            rates[name] = count / (time.perf_counter() - t0)
        out[fmt] = {
            "lines_per_s": round(rates["translator"]),
            "bare_parse_lines_per_s": round(rates["bare_parse"]),
            "overhead_vs_bare": round(rates["bare_parse"] / rates["translator"], 2),
            "target_lines_per_s": 20000,
            "meets_target": rates["translator"] >= 20000,
        }
    return out


def _pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


async def _follow_latency(tmp: str) -> list[float]:
    provider = LocalProvider(os.path.join(tmp, "sb"), os.path.join(tmp, "jr"))
    handle = await provider.create("bench-latency", SandboxSpec())
    nonce = new_nonce()
    data = await provider.launch(handle, [sys.executable, "-c", _WRITER], nonce=nonce)
    handle = type(handle)(handle.provider, handle.key, handle.journal_path, handle.stderr_path, handle.workdir,
                          {**handle.data, **data})
    tr = translator_for("codex-exec-json", "bench", "bench")
    lat: list[float] = []
    try:
        async with contextlib.aclosing(follow_journal(provider, handle, handle.journal_path, nonce=nonce,
                                                      poll_interval=0.25)) as items:
            async for item in items:
                if isinstance(item, JournalExit):
                    break
                if isinstance(item, JournalLine):
                    chunks = tr.feed(item.data)
                    now = time.time()
                    for c in chunks:
                        if c["type"] == "TEXT_MESSAGE_CONTENT":
                            lat.append(now - float(c["delta"][2:]))
    finally:
        await provider.destroy(handle)
    return lat


async def _bare_latency(tmp: str) -> list[float]:
    """The same writer, read by a plain loop: os.read every 0.5 ms, split, json.loads."""
    path = os.path.join(tmp, "bare.ndjson")
    with open(path, "wb") as out:  # noqa: ASYNC230 -- setup, before anything is timed
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _WRITER, stdout=out)
    lat: list[float] = []
    buf = b""
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            data = os.read(fd, 1 << 20)
            if not data:
                if proc.returncode is not None:
                    break
                try:
                    async with asyncio.timeout(0.0005):
                        await proc.wait()
                except TimeoutError:
                    pass
                continue
            buf += data
            *lines, buf = buf.split(b"\n")
            now = time.time()
            for line in lines:
                obj = json.loads(line)
                lat.append(now - float(obj["item"]["text"][2:]))
    finally:
        os.close(fd)
    return lat


def _summary(lat: list[float]) -> dict[str, float]:
    ms = [x * 1000 for x in lat]
    return {"n": len(ms), "p50_ms": round(_pct(ms, 50), 3), "p99_ms": round(_pct(ms, 99), 3),
            "max_ms": round(max(ms), 3), "mean_ms": round(statistics.fmean(ms), 3)}


async def main() -> dict[str, Any]:
    throughput = _throughput()
    with tempfile.TemporaryDirectory(prefix="baton-bench-") as tmp:
        follow = _summary(await _follow_latency(tmp))
        bare = _summary(await _bare_latency(tmp))
    result = {
        "throughput": throughput,
        "latency_local_follow": {**follow, "target_p99_ms": 5.0, "meets_target": follow["p99_ms"] <= 5.0},
        "latency_bare_poll_0.5ms": bare,
    }
    print(f"{'translator':<22}{'lines/s':>12}{'bare lines/s':>14}{'x':>7}")
    for fmt, r in throughput.items():
        print(f"{fmt:<22}{r['lines_per_s']:>12,}{r['bare_parse_lines_per_s']:>14,}{r['overhead_vs_bare']:>7}")
    print(f"{'latency':<22}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}")
    for name, r in (("local follow+translate", follow), ("bare 0.5 ms poll", bare)):
        print(f"{name:<22}{r['p50_ms']:>10}{r['p99_ms']:>10}{r['max_ms']:>10}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    asyncio.run(main())
