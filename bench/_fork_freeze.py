"""What freezing the fork server's imports saves each forked daemon: memory copied and time
spent when the daemon's collector runs a full collection.

``python -m bench._fork_freeze [--children N]`` imports what the fork server imports (the
daemon, ``setproctitle``), then, as the server does, forks children, each of which runs one
full collection (``gc.collect()``) and reports its private dirty memory
(``/proc/self/smaps_rollup``) before and after it and how long it took: first with the
imports left to the collector (the server before), then frozen (``gc.freeze()``, the server
now). A full collection in a child walks every container it can reach in the collector's
lists and writes their headers: each page holding one is copied out of the memory the child
shares with its server. Prints a table; writes ``--out`` (JSON) when given.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import statistics
import time
from typing import Any


def _private_dirty_kb() -> int:
    for line in pathlib.Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("Private_Dirty:"):
            return int(line.split()[1])
    return 0


def _child(w: int) -> None:
    before = _private_dirty_kb()
    t0 = time.perf_counter()
    gc.collect()
    took = time.perf_counter() - t0
    after = _private_dirty_kb()
    os.write(w, json.dumps({"copied_kb": after - before, "collect_ms": took * 1000}).encode())
    os._exit(0)


def _fork_children(n: int) -> list[dict[str, float]]:
    out = []
    for _ in range(n):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _child(w)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            out.append(json.loads(f.read()))
        os.waitpid(pid, 0)
    return out


def main(children: int) -> dict[str, Any]:
    import sandbox_host.daemon.__main__  # noqa: F401 -- what the fork server imports
    try:
        import setproctitle  # noqa: F401
    except ImportError:
        pass
    gc.collect()
    results: dict[str, Any] = {"objects_tracked": len(gc.get_objects())}
    results["imports_collected"] = _fork_children(children)
    gc.freeze()
    results["frozen_objects"] = gc.get_freeze_count()
    results["imports_frozen"] = _fork_children(children)
    rows = []
    for mode in ("imports_collected", "imports_frozen"):
        rs = results[mode]
        results[f"{mode}_median"] = med = {k: round(statistics.median(x[k] for x in rs), 2) for k in rs[0]}
        rows.append(f"| {mode.replace('_', ' ')} | {med['copied_kb']:.0f} | {med['collect_ms']:.2f} |")
    print(f"{children} children each; {results['objects_tracked']} objects tracked, "
          f"{results['frozen_objects']} frozen")
    print("| the server's imports | KB copied by a child's full collection | its time ms |\n| --- | --- | --- |")
    print("\n".join(rows))
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench._fork_freeze", description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=10)
    parser.add_argument("--out", type=pathlib.Path)
    a = parser.parse_args()
    res = main(a.children)
    if a.out:
        a.out.write_text(json.dumps(res, indent=1) + "\n")
