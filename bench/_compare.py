"""``make bench-compare REV=<commit>`` (``python -m bench._compare REV [bench ...]``): a base
revision's benches side by side with the working tree's, in one table.

The base revision is checked out in a temporary ``git worktree``. It runs with this venv
when its dependencies (``pyproject.toml``, ``requirements.lock``) are the working tree's
(its code first on the path, ``PYTHONSAFEPATH`` so ``python -m`` does not put this checkout
first), else with a venv of its own (``make venv`` there: minutes). Node clients are linked
from this tree when ``tests/node/package.json`` is the same. Each bench runs on both sides,
base and working tree one after the other, the order swapped every round
(``--rounds N``, default 1), so the machine's load falls on both alike; a figure that ran
several rounds is its median.

The table lists every figure either side wrote (the leaves of each ``bench/results/*.json``
the bench wrote; lists are left out), both values, the ratio working/base, and a verdict:
``better``/``worse`` when the ratio moves past ``--noise`` (default 10 %) in a direction
the figure's name tells (per second, ratios and speed-ups up; ms, seconds, RSS, CPU,
overhead down), ``changed`` when the name does not tell; and the figure's target when the
bench states one beside it (``target_<figure>``). A bench's own verdicts on its targets (the
booleans under ``targets``/``targets_met``, ``meets_*``) are rows of their own, after the
figures: ``met``/``missed`` on each side.

The working tree's committed results are restored after its runs: the comparison writes
nothing into the tree.
"""
from __future__ import annotations

import argparse
import dataclasses
import filecmp
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterable

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
Flat = dict[str, float | bool]

# Words in a figure's name that say which way is better: the last match wins ("p99_ms_ratio"
# is a ratio of latencies: lower is better, so "_ms" is checked after "ratio").
_UP = ("per_s", "_s_", "throughput", "speedup", "ratio", "vs_")
_DOWN = ("_ms", "ms_", "latency", "seconds", "rss", "cpu", "_kb", "p50", "p99", "max", "stall", "failures")
# The fields that name a row of a table (a list of objects in a bench's JSON).
_ROW_NAMES = ("name", "engines", "side", "variant", "phase")
# A cost whatever follows it ("overhead_vs_bare").
_COST = ("overhead",)


# --- the table (pure) ---------------------------------------------------------------------


def flatten(obj: Any, prefix: str = "") -> Flat:
    """The numeric and boolean leaves of a bench's JSON, keyed by dotted path.

    A list of objects is a table's rows (one per side or engine set): each row's leaves are
    keyed by its name (its first string field among :data:`_ROW_NAMES`), or by its position.
    Other lists, strings and nulls are left out (per-round lists, names, settings)."""
    out: Flat = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, list) and obj and all(isinstance(v, dict) for v in obj):
        for i, row in enumerate(obj):
            name = next((row[k] for k in _ROW_NAMES if isinstance(row.get(k), str)), str(i))
            out.update(flatten(row, f"{prefix}[{name}]"))
    elif isinstance(obj, bool):
        out[prefix] = obj
    elif isinstance(obj, (int, float)) and prefix:
        out[prefix] = float(obj)
    return out


def median_of(runs: list[Flat]) -> Flat:
    """Each key's median over ``runs`` (a boolean: true when most runs were)."""
    keys = dict.fromkeys(k for r in runs for k in r)
    out: Flat = {}
    for k in keys:
        values = [r[k] for r in runs if k in r]
        if all(isinstance(v, bool) for v in values):
            out[k] = sum(bool(v) for v in values) * 2 > len(values)
        else:
            out[k] = statistics.median(float(v) for v in values)
    return out


def direction(key: str) -> int:
    """+1 when a larger value is better, -1 when smaller is, 0 when the name does not say."""
    name, found = key.lower(), 0
    if any(w in name for w in _COST):
        return -1
    best = -1
    for words, sign in ((_UP, 1), (_DOWN, -1)):
        for w in words:
            at = name.rfind(w)
            if at > best:
                best, found = at, sign
    return found


def is_target(key: str) -> bool:
    """Whether ``key`` is a bench's own verdict on a target (``targets.*``, ``meets_*``) or
    the target's figure (``target_*``), not a measured figure."""
    parts = key.split(".")
    leaf = parts[-1]
    return (any(p in ("targets", "targets_met") for p in parts[:-1])
            or leaf.startswith(("target", "meets_")))


def target_of(key: str, flat: Flat) -> str:
    """The target a bench states beside figure ``key`` (a sibling ``target_<name>``), as
    ``>= v`` or ``<= v`` by the figure's direction; empty when it states none."""
    head, _, leaf = key.rpartition(".")
    t = flat.get(f"{head}.target_{leaf}" if head else f"target_{leaf}")
    if t is None or isinstance(t, bool):
        return ""
    return f"{'<=' if direction(key) < 0 else '>='} {t:g}"


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the table.

    Attributes:
        bench: the bench's name.
        figure: the dotted path in its results.
        base: the base revision's value (``None``: it has no such figure).
        head: the working tree's value (``None``: likewise).
        ratio: head / base when both are numbers and base is not 0.
        target: the target the bench states beside the figure (:func:`target_of`), or "".
        verdict: ``better``, ``worse``, ``changed``, ``same``, ``met``, ``missed``,
            ``now met``, ``now missed``, ``new`` or ``gone``.
    """

    bench: str
    figure: str
    base: float | bool | None
    head: float | bool | None
    ratio: float | None
    verdict: str
    target: str = ""


def build_rows(base: dict[str, Flat], head: dict[str, Flat], noise: float = 0.10) -> list[Row]:
    """The table's rows: every bench on either side, every figure of either, in order.

    Args:
        base: bench name → its flattened figures at the base revision.
        head: likewise for the working tree.
        noise: a ratio within ``1 ± noise`` is ``same``.
    """
    rows: list[Row] = []
    for bench in dict.fromkeys([*base, *head]):
        b, h = base.get(bench, {}), head.get(bench, {})
        for key in dict.fromkeys([*b, *h]):
            bv, hv = b.get(key), h.get(key)
            rows.append(Row(bench, key, bv, hv, _ratio(bv, hv), _verdict(key, bv, hv, noise),
                            target_of(key, h) or target_of(key, b)))
    return rows


def _ratio(b: float | bool | None, h: float | bool | None) -> float | None:
    if isinstance(b, bool) or isinstance(h, bool) or b is None or h is None or b == 0:
        return None
    return h / b


def _verdict(key: str, b: float | bool | None, h: float | bool | None, noise: float) -> str:
    if b is None:
        return "new"
    if h is None:
        return "gone"
    if isinstance(b, bool) or isinstance(h, bool):
        if bool(b) == bool(h):
            return "met" if h else "missed"
        return "now met" if h else "now missed"
    if b == h:
        return "same"
    r = _ratio(b, h)
    if r is not None and abs(r - 1) <= noise:
        return "same"
    sign = direction(key)
    if sign == 0:
        return "changed"
    return "better" if (h - b) * sign > 0 else "worse"


def round_ratios(base_runs: list[Flat], head_runs: list[Flat], key: str) -> str:
    """Working/base of each round's pair of runs (``a / b / c``), to read a median's spread;
    ``-`` where a round lacks a number."""
    out = []
    for b, h in zip(base_runs, head_runs):
        r = _ratio(b.get(key), h.get(key))
        out.append("-" if r is None else f"{r:.2f}")
    return " / ".join(out)


def render(rows: Iterable[Row], base_name: str, head_name: str = "working tree",
           runs: tuple[dict[str, list[Flat]], dict[str, list[Flat]]] | None = None) -> str:
    """The table as aligned text, targets last within each bench.

    Args:
        rows: from :func:`build_rows`.
        base_name: the base column's heading; ``head_name`` the working tree's.
        runs: each side's runs per bench (base, head); with more than one round a column
            gives each round's ratio (:func:`round_ratios`).
    """
    def cell(v: float | bool | None) -> str:
        if v is None:
            return "-"
        if isinstance(v, bool):
            return "met" if v else "missed"
        return f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}"

    ordered = sorted(rows, key=lambda r: is_target(r.figure))
    ordered.sort(key=lambda r: r.bench)  # stable: figures first, targets after, per bench
    table: list[tuple[str, ...]] = [("bench", "figure", base_name, head_name, "ratio", "target", "verdict")]
    table += [(r.bench, r.figure, cell(r.base), cell(r.head), "-" if r.ratio is None else f"{r.ratio:.2f}x",
               r.target or "-", r.verdict) for r in ordered]
    if runs is not None and max((len(v) for v in runs[0].values()), default=0) > 1:
        table[0] += ("per round",)
        for i, r in enumerate(ordered, start=1):
            table[i] += (round_ratios(runs[0].get(r.bench, []), runs[1].get(r.bench, []), r.figure)
                         if r.ratio is not None else "",)
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table)


# --- running the two sides (processes, git) -----------------------------------------------


@dataclasses.dataclass
class Side:
    """A checkout whose benches run: its directory, python and environment."""

    name: str
    root: pathlib.Path
    python: str
    env: dict[str, str]

    def run(self, bench: str) -> Flat:
        """Run ``python -m bench <bench>`` here; its figures (every results file it wrote),
        the tree's results files as they were before."""
        results = self.root / "bench" / "results"
        before = {p: p.read_bytes() for p in results.glob("*.json")}
        started = time.time()
        print(f"== {bench} @ {self.name} ==", flush=True)
        proc = subprocess.run([self.python, "-m", "bench", bench], cwd=self.root, env=self.env, check=False)
        figures: Flat = {}
        try:
            for p in sorted(results.glob("*.json")):
                if p.stat().st_mtime >= started:
                    figures.update(flatten(json.loads(p.read_text()), p.stem if p.stem != bench else ""))
        finally:
            for p in results.glob("*.json"):
                if p not in before:
                    p.unlink()
            for p, data in before.items():
                p.write_bytes(data)
        if proc.returncode != 0:
            figures["bench_failed"] = True
        return figures


def _same_file(a: pathlib.Path, b: pathlib.Path) -> bool:
    return a.exists() and b.exists() and filecmp.cmp(a, b, shallow=False)


def base_side(rev: str, where: pathlib.Path) -> Side:
    """Check out ``rev`` into ``where`` and make it runnable (see the module docstring)."""
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), rev], check=True)
    env = {**os.environ}
    if all(_same_file(REPO / f, where / f) for f in ("pyproject.toml", "requirements.lock")):
        python = sys.executable
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(where), env.get("PYTHONPATH", "")) if p)
        env["PYTHONSAFEPATH"] = "1"
    else:
        print(f"{rev}: other dependencies; building its venv (make venv)", flush=True)
        subprocess.run(["make", "venv"], cwd=where, check=True)
        python = str(where / ".venv" / "bin" / "python")
    node = where / "tests" / "node"
    if _same_file(REPO / "tests/node/package.json", node / "package.json") and (
            REPO / "tests/node/node_modules").is_dir():
        (node / "node_modules").symlink_to(REPO / "tests/node/node_modules")
    elif (node / "package.json").exists():
        subprocess.run(["make", "node-deps"], cwd=where, check=False)
    out = subprocess.run([python, "-c", "import gateway; print(gateway.__file__)"], cwd=where, env=env,
                         capture_output=True, text=True, check=True).stdout.strip()
    if not pathlib.Path(out).resolve().is_relative_to(where.resolve()):
        raise SystemExit(f"the base side would import {out}, not {where}")
    return Side(rev, where, python, env)


def benches_of(root: pathlib.Path) -> list[str]:
    return sorted(p.stem for p in (root / "bench").glob("*.py") if not p.stem.startswith("_"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._compare", description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the base revision (a commit, branch or tag)")
    parser.add_argument("benches", nargs="*", help="bench names (default: every bench both sides have)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each bench per side, interleaved")
    parser.add_argument("--noise", type=float, default=0.10, help="a ratio within 1 ± this is 'same'")
    parser.add_argument("--keep", action="store_true", help="keep the base worktree")
    parser.add_argument("--save", type=pathlib.Path, help="write every run's figures here (JSON) "
                        "after each bench, so a long compare that stops keeps what it measured")
    args = parser.parse_args(argv)
    where = pathlib.Path(tempfile.mkdtemp(prefix="baton-bench-base-")) / "tree"
    try:
        base = base_side(args.rev, where)
        head = Side("working tree", REPO, sys.executable, {**os.environ})
        names = args.benches or [n for n in benches_of(REPO) if n in benches_of(where)]
        runs: dict[str, dict[str, list[Flat]]] = {"base": {}, "head": {}}
        for i in range(args.rounds):
            for n_bench, bench in enumerate(names):
                pair = [("base", base), ("head", head)]
                for key, side in pair if (i + n_bench) % 2 == 0 else pair[::-1]:
                    runs[key].setdefault(bench, []).append(side.run(bench))
                if args.save:
                    args.save.write_text(json.dumps({"base": args.rev, "runs": runs}, indent=1))
                print(render(build_rows({bench: median_of(runs["base"][bench])},
                                        {bench: median_of(runs["head"][bench])}, args.noise),
                             f"base {args.rev}"), flush=True)
        rows = build_rows({b: median_of(r) for b, r in runs["base"].items()},
                          {b: median_of(r) for b, r in runs["head"].items()}, args.noise)
        print(render(rows, f"base {args.rev}", runs=(runs["base"], runs["head"])))
        print(f"({args.rounds} interleaved round(s) per side; figures on a shared machine are noisy: "
              f"read 'worse' next to the bench's own spread)")
    finally:
        if not args.keep:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(where)], check=False)
            shutil.rmtree(where.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
