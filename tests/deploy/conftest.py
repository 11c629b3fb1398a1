"""Helpers for the packaging tests: parsed manifests and what the code says they must match."""
from __future__ import annotations

import ast
import pathlib
import tomllib
from typing import Any

import pytest
import yaml

from baton.config import SETTINGS

REPO = pathlib.Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"


def load_yaml_docs(path: pathlib.Path) -> list[dict[str, Any]]:
    """Every non-empty YAML document of ``path``."""
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def console_scripts() -> dict[str, str]:
    """``[project.scripts]`` of pyproject.toml: name -> ``module:function``."""
    with open(REPO / "pyproject.toml", "rb") as f:
        return dict(tomllib.load(f)["project"]["scripts"])


def resolve_console_script(name: str) -> bool:
    """True when the ``module:function`` a console script names exists in the source.

    Read with ``ast`` rather than imported: a service's ``__main__`` must not start anything
    in the test process.
    """
    target = console_scripts()[name]
    module, _, func = target.partition(":")
    parts = module.split(".")
    candidates = [REPO.joinpath(*parts).with_suffix(".py"), REPO.joinpath(*parts, "__init__.py")]
    path = next((c for c in candidates if c.exists()), None)
    assert path is not None, f"console script {name}: module {module} not found"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    defined |= {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    return func in defined


def setting_names() -> set[str]:
    return {s.env for s in SETTINGS}


def default_port(env: str) -> int:
    """The port of a ``host:port`` setting's documented default."""
    return int(next(s.default for s in SETTINGS if s.env == env).rsplit(":", 1)[1])


def _authority(address: str) -> str:
    """``host:port`` of ``host:port``, ``scheme://host:port/...`` or a gRPC ``dns:///host:port``."""
    if address.startswith("dns:"):
        return address[len("dns:"):].lstrip("/")
    return address.split("://", 1)[-1].split("/", 1)[0]


def port_of(address: str) -> int:
    """``host:port`` (or ``scheme://host:port/...``, ``dns:///host:port``) -> port."""
    return int(_authority(address).rsplit(":", 1)[1])


def host_of(address: str) -> str:
    return _authority(address).rsplit(":", 1)[0]


def package_sources(package: str) -> str:
    """All Python source of a top-level package, concatenated (for cross-checks)."""
    root = REPO / package
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(root.rglob("*.py")))


@pytest.fixture(scope="module")
def k8s_docs() -> list[tuple[pathlib.Path, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [(path, d) for d in load_yaml_docs(path)]
    return docs
