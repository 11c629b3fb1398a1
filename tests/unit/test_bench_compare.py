"""The table of ``make bench-compare`` (bench/_compare.py): every figure of either side,
both values, the ratio, a verdict in the direction the figure's name tells, the bench's
own targets as rows of their own."""
from __future__ import annotations

import pytest

from bench._compare import Row, build_rows, direction, flatten, median_of, render, round_ratios

pytestmark = pytest.mark.unit

BASE = {"bench": "gateway", "results": {"gateway": {"many": {"delivered_chunks_per_s": 5000, "burst_p99_ms": 40.0,
                                                             "rounds": [1, 2, 3], "name": "x"}}},
        "summary": {"throughput_ratio": 0.6, "targets": {"throughput_ge_half": True, "p99_le_50ms": False}}}
HEAD = {"bench": "gateway", "results": {"gateway": {"many": {"delivered_chunks_per_s": 8000, "burst_p99_ms": 60.0}}},
        "summary": {"throughput_ratio": 0.62, "targets": {"throughput_ge_half": True, "p99_le_50ms": True},
                    "workers_2_vs_1": 1.7}}


def test_flatten_keeps_numbers_and_booleans_by_dotted_path() -> None:
    flat = flatten(BASE)
    assert flat["results.gateway.many.delivered_chunks_per_s"] == 5000.0
    assert flat["summary.targets.p99_le_50ms"] is False
    assert not any(k.endswith(("rounds", "name", "bench")) for k in flat)  # lists and strings left out


def test_a_list_of_objects_is_a_tables_rows_keyed_by_name() -> None:
    flat = flatten({"rows": [{"engines": "1-node", "chunks_per_s": 400, "ms": {"p99": 9}},
                             {"engines": "replicated", "chunks_per_s": 300}, {"chunks_per_s": 1}],
                    "rounds": [1.0, 2.0]})
    assert flat == {"rows[1-node].chunks_per_s": 400.0, "rows[1-node].ms.p99": 9.0,
                    "rows[replicated].chunks_per_s": 300.0, "rows[2].chunks_per_s": 1.0}


def test_rows_give_both_values_the_ratio_and_a_verdict() -> None:
    rows = {r.figure: r for r in build_rows({"gateway": flatten(BASE)}, {"gateway": flatten(HEAD)})}
    tput = rows["results.gateway.many.delivered_chunks_per_s"]
    assert (tput.base, tput.head, tput.ratio, tput.verdict) == (5000.0, 8000.0, 1.6, "better")
    assert rows["results.gateway.many.burst_p99_ms"].verdict == "worse"  # ms: lower is better
    assert rows["summary.throughput_ratio"].verdict == "same"  # within 10 %
    assert rows["summary.targets.throughput_ge_half"].verdict == "met"
    assert rows["summary.targets.p99_le_50ms"].verdict == "now met"
    assert rows["summary.workers_2_vs_1"] == Row("gateway", "summary.workers_2_vs_1", None, 1.7, None, "new")


def test_a_target_stated_beside_a_figure_is_its_target() -> None:
    rows = {r.figure: r for r in build_rows({"t": {"x.p99_ms": 9.0, "x.target_p99_ms": 5.0, "x.meets_target": False}},
                                            {"t": {"x.p99_ms": 4.0, "x.target_p99_ms": 5.0, "x.meets_target": True}})}
    assert (rows["x.p99_ms"].target, rows["x.p99_ms"].verdict) == ("<= 5", "better")
    assert rows["x.meets_target"].verdict == "now met"
    assert rows["x.target_p99_ms"].target == ""


def test_a_bench_on_one_side_only_and_a_figure_gone() -> None:
    rows = build_rows({"log": {"a_per_s": 1.0}, "old": {"x_ms": 2.0}}, {"log": {}})
    assert [(r.bench, r.figure, r.verdict) for r in rows] == [("log", "a_per_s", "gone"), ("old", "x_ms", "gone")]


@pytest.mark.parametrize("key, sign", [("delivered_chunks_per_s", 1), ("latency_p99_ms", -1), ("rss_kb_per_idle_reader", -1),
                                       ("workers_2_vs_1_many_runs", 1), ("ratios.reference.read_latency_p50", -1),
                                       ("cpu_ms_per_request.gateway", -1), ("readers", 0),
                                       ("overhead_vs_bare", -1)])
def test_the_direction_a_name_tells(key: str, sign: int) -> None:
    assert direction(key) == sign


def test_median_over_rounds_and_majority_of_targets() -> None:
    m = median_of([{"a": 1.0, "t": True}, {"a": 5.0, "t": False}, {"a": 2.0, "t": True}])
    assert m == {"a": 2.0, "t": True}


def test_render_puts_targets_after_figures_and_marks_missing_values() -> None:
    text = render(build_rows({"gateway": flatten(BASE)}, {"gateway": flatten(HEAD)}), "base abc123")
    lines = text.splitlines()
    assert lines[0].split() == ["bench", "figure", "base", "abc123", "working", "tree", "ratio", "target", "verdict"]
    figures = [line.split()[1] for line in lines[1:]]
    assert figures.index("summary.workers_2_vs_1") < figures.index("summary.targets.p99_le_50ms")
    assert "1.60x" in text and "now met" in text
    assert any(line.split()[2] == "-" for line in lines if "workers_2_vs_1" in line)


def test_each_round_ratio_shows_a_medians_spread() -> None:
    base = [{"a_per_s": 10.0}, {"a_per_s": 20.0}, {}]
    head = [{"a_per_s": 15.0}, {"a_per_s": 10.0}, {"a_per_s": 1.0}]
    assert round_ratios(base, head, "a_per_s") == "1.50 / 0.50 / -"
    rows = build_rows({"b": median_of(base)}, {"b": median_of(head)})
    text = render(rows, "base x", runs=({"b": base}, {"b": head}))
    assert text.splitlines()[0].rstrip().endswith("per round")
    assert text.splitlines()[1].endswith("1.50 / 0.50 / -")


def test_a_bench_that_raises_does_not_stop_the_others(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import bench.__main__ as bench_main

    ran = []

    def run(name: str) -> dict[str, float]:
        ran.append(name)
        if name == "b":
            raise TimeoutError("only 255 of 1000 readers registered")
        return {}

    monkeypatch.setattr(bench_main, "available", lambda: ["a", "b", "c"])
    monkeypatch.setattr(bench_main, "run", run)
    assert bench_main.cli([]) == 1
    assert ran == ["a", "b", "c"]
    err = capsys.readouterr().err
    assert "only 255 of 1000 readers registered" in err and "failed: b (the others ran)" in err
