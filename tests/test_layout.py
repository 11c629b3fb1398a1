"""The house rules of the layout (docs/design.md §2), checked on the source tree itself.

- The shared package ``baton`` imports no service and no tool (``baton_tools``).
- No service imports ``baton_tools``, nor another service.
- No import cycle between modules (imports at module level, ``TYPE_CHECKING`` blocks and
  imports inside functions included: a cycle hidden in a function is still a cycle a
  reader has to untangle).
- No module over 600 lines unless its docstring says why.
- Every path the "Where things live" table (docs/layout.md) names exists.
"""
from __future__ import annotations

import ast
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("baton", "baton_tools", "coordinator", "sandbox_host", "gateway")
SERVICES = ("coordinator", "sandbox_host", "gateway")
MAX_LINES = 600

pytestmark = pytest.mark.unit


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            if "baton/v1" in path.as_posix() or ".venv" in path.parts:
                continue
            rel = path.relative_to(REPO).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: pathlib.Path) -> set[str]:
    """The project modules ``name`` imports (resolved to the longest known module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_pkg else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for t in targets:
            parts = t.split(".")
            while parts and ".".join(parts) not in MODULES:
                parts.pop()
            if parts and ".".join(parts) != name:
                found.add(".".join(parts))
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _top(name: str) -> str:
    return name.split(".")[0]


def test_the_shared_package_imports_no_service_and_no_tool() -> None:
    bad = sorted(f"{m} -> {d}" for m, deps in GRAPH.items() if _top(m) == "baton"
                 for d in deps if _top(d) != "baton")
    assert bad == []


def test_no_service_imports_a_tool_or_another_service() -> None:
    bad = sorted(f"{m} -> {d}" for m, deps in GRAPH.items() if _top(m) in SERVICES
                 for d in deps if _top(d) not in ("baton", _top(m)))
    assert bad == []


def _edges_without_packages() -> dict[str, set[str]]:
    # A package's __init__ re-exporting its modules is not a cycle of ideas: drop the edge
    # from a package to its own submodules.
    return {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in GRAPH.items()}


def test_no_import_cycle_between_modules() -> None:
    graph = _edges_without_packages()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert cycles == []


def test_no_module_over_600_lines_without_a_reason_in_its_docstring() -> None:
    long = []
    for name, path in MODULES.items():
        text = path.read_text(encoding="utf-8")
        if text.count("\n") <= MAX_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if not re.search(r"\b(over|longer than|more than) (about )?600 lines\b", doc):
            long.append(f"{name}: {text.count(chr(10))} lines")
    assert long == []


def test_every_path_the_layout_table_names_exists() -> None:
    layout = (REPO / "docs" / "layout.md").read_text(encoding="utf-8")
    section = layout.split("# Where things live", 1)[1].split("\n## ", 1)[0]
    paths = set(re.findall(r"`([A-Za-z_][\w./-]*[\w/])`", section))
    paths = {p for p in paths if "/" in p or p.endswith((".py", ".md"))}
    assert paths, "the table names no path"
    missing = sorted(p for p in paths if not any(REPO.glob(p.rstrip("/")))
                     and not (REPO / p).exists())
    assert missing == []
