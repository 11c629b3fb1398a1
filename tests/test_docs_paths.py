"""Every repository path the docs name exists: `docs/*.md`, the README and
`bench/results/README.md`, read as text (no process, no git).

A path is a backticked word whose first segment is a top-level entry of the repository
(`baton/x.py`, `tests/...`, `docs/...`, `Makefile`), globs allowed (`gateway/_routes_*.py`),
a relative markdown link target, resolved from the file that holds it, or a dotted module
name of a project package (`baton_tools.testing.cluster.start_host`: its package and the
module under it must exist; what follows may be an attribute; a capitalised name right
under the package, `coordinator.RunStore`, is an attribute). Words with
placeholders (`<run>`, `{id}`, `…`) name a family of keys or files, not a path, and are not
checked.
"""
from __future__ import annotations

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCS = sorted([*REPO.glob("docs/*.md"), REPO / "README.md", REPO / "bench/results/README.md"])
# Top-level entries a doc may name (`.venv` and other local-only entries are not paths a
# reader can open in a checkout).
TOP = {p.name for p in REPO.iterdir() if not p.name.startswith(".")} | {".ci"}

pytestmark = pytest.mark.unit

_BACKTICKED = re.compile(r"`([^`\s]+)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_PATHLIKE = re.compile(r"[\w.*/-]+")
_DOTTED = re.compile(r"(baton|baton_tools|coordinator|sandbox_host|gateway)\.([a-z_]\w*)(\.[\w.]+)?(\(\))?")
# Dotted words that are no module: a file of bench/results, the error domain.
_NOT_MODULES = re.compile(r".*\.(json|md|yaml|toml|txt|py)|baton\.dev")


def _exists(doc: pathlib.Path, rel: str, kind: str) -> bool:
    if kind == "module":
        return (REPO / f"{rel}.py").is_file() or (REPO / rel / "__init__.py").is_file()
    base = doc.parent if kind == "link" else REPO
    rel = rel.rstrip("/")
    if any(c in rel for c in "*?["):
        return any(base.glob(rel))
    return (base / rel).exists()


def _named(doc: pathlib.Path) -> list[tuple[int, str, str]]:
    """(line, path, kind) for every repository path ``doc`` names; kind is "path" (from the
    repository's root), "link" (from the doc's folder) or "module" (``pkg/mod``, a ``.py``
    file or a package)."""
    out: list[tuple[int, str, str]] = []
    for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        for word in _BACKTICKED.findall(line):
            word = re.sub(r":\d+$", "", word)  # file.py:123
            if not _PATHLIKE.fullmatch(word) or word.startswith(("-", ".", "/")):
                continue
            if (m := _DOTTED.fullmatch(word)) is not None and not _NOT_MODULES.fullmatch(word):
                out.append((n, f"{m[1]}/{m[2]}", "module"))  # a module or a package
                continue
            first = word.split("/", 1)[0]
            if first in TOP and ("/" in word or (REPO / word).is_file()):
                out.append((n, word, "path"))
        for target in _LINK.findall(line):
            target = target.split("#", 1)[0]
            if not target or re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, mailto:
                continue
            out.append((n, target, "link"))
    return out


def test_the_docs_name_paths() -> None:
    """The check checks something: every doc names at least one path (a regex that matched
    nothing would pass every time)."""
    for doc in DOCS:
        assert _named(doc), doc


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_path_a_doc_names_exists(doc: pathlib.Path) -> None:
    missing = [f"{doc.relative_to(REPO)}:{n}: {path}" for n, path, kind in _named(doc)
               if not _exists(doc, path, kind)]
    assert missing == []
