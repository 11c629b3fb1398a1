"""The Grafana dashboard and docs/operating.md name only metrics the services declare."""
from __future__ import annotations

import json
import pathlib
import re

from coordinator._metrics import CoordinatorMetrics
from gateway._metrics import Metrics
from sandbox_host.metrics import HostMetrics

REPO = pathlib.Path(__file__).resolve().parents[2]


def declared() -> set[str]:
    names: set[str] = set()
    for m in (CoordinatorMetrics(), HostMetrics(), Metrics()):
        for family in m.registry.collect():
            # A labelled metric has no sample before its first child: name its series by type.
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}.get(family.type, ())
            names |= {family.name, *(family.name + s for s in suffixes), *(s.name for s in family.samples)}
    return names


def test_the_dashboard_queries_declared_metrics() -> None:
    dash = json.loads((REPO / "deploy" / "grafana" / "baton.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    used = {n for e in exprs for n in re.findall(r"\b(?:baton|process|python)_[a-z_]+\b", e)}
    assert used and used <= declared(), used - declared()


def test_the_documented_metrics_are_declared() -> None:
    text = (REPO / "docs" / "operating.md").read_text().split("## Metrics", 1)[1]
    documented = set(re.findall(r"`(baton_[a-z_]+)`", text))
    assert documented and documented <= declared(), documented - declared()
    ours = {n for n in declared() if n.startswith("baton_") and not n.endswith(("_bucket", "_count", "_sum", "_created"))}
    # Every family is documented (a counter by its _total name).
    assert {n for n in ours if not any(d == n or d == n + "_total" or n == d + "_total" for d in documented)} == set()
