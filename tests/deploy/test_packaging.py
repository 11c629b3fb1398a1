"""The two wheels of the repository: ``baton-runs`` holds the client alone, ``baton-runs-server`` the rest.

Both are built here from a copy of the sources (``pip wheel --no-deps --no-build-isolation``: the
venv's setuptools, no index), as the Dockerfile builds them; then a fresh venv with the client
wheel and its dependencies (requirements.lock versions, from the pip cache or the index) imports
the clients, and not the services.
"""
from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile

import pytest

import dist_split
from tests.deploy.conftest import REPO

pytestmark = pytest.mark.servers  # spawns pip and a venv's python

SOURCES = ["pyproject.toml", "README.md", "dist_split.py", "server-dist",
           "baton", "baton_tools", "coordinator", "sandbox_host", "gateway"]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    """``{"client": baton_runs-*.whl, "server": baton_runs_server-*.whl}``, built from a clean copy."""
    root = tmp_path_factory.mktemp("pkg")
    src, out = root / "src", root / "wheels"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info")
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
         "--no-build-isolation", "--no-index", "-w", str(out), str(src), str(src / "server-dist")],
        check=True, capture_output=True, text=True, timeout=120,
    )
    return {"client": next(out.glob("baton_runs-*.whl")), "server": next(out.glob("baton_runs_server-*.whl"))}


def _modules(wheel: pathlib.Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert not [n for n in names if ".dist-info/" not in n and not n.endswith((".py", ".pyi"))
                and not n.startswith("gateway/static/")], names
    return {n.removesuffix(".py").replace("/", ".") for n in names if n.endswith(".py")}


def test_the_client_wheel_holds_the_client_modules_alone(wheels: dict[str, pathlib.Path]) -> None:
    client = _modules(wheels["client"])
    assert all(dist_split.is_client(m) for m in client), sorted(m for m in client if not dist_split.is_client(m))
    assert {"baton.client", "baton.grpc_client", "baton.coordinator_client", "baton.errors",
            "baton.grpc_errors", "baton.v1.runs_service_pb2_grpc"} <= client
    assert not {m for m in client if m.split(".")[0] in {"coordinator", "gateway", "sandbox_host"}}
    assert wheels["client"].stat().st_size < 200_000  # the whole tree was ~2.8 MB unpacked


def test_the_two_wheels_split_the_tree_without_overlap(wheels: dict[str, pathlib.Path]) -> None:
    client, server = _modules(wheels["client"]), _modules(wheels["server"])
    assert not client & server
    tree = {p.relative_to(REPO).with_suffix("").as_posix().replace("/", ".")
            for top in ("baton", "baton_tools", "coordinator", "sandbox_host", "gateway")
            for p in (REPO / top).rglob("*.py") if "__pycache__" not in p.parts}
    assert client | server == tree
    with zipfile.ZipFile(wheels["server"]) as z:
        assert any(n.startswith("gateway/static/") for n in z.namelist())  # package data follows


def test_the_server_distribution_pins_the_client_at_its_own_version() -> None:
    with open(REPO / "pyproject.toml", "rb") as f:
        client = tomllib.load(f)["project"]
    with open(REPO / "server-dist" / "pyproject.toml", "rb") as f:
        server = tomllib.load(f)["project"]
    assert client["name"] == "baton-runs" and server["name"] == "baton-runs-server"
    assert server["version"] == client["version"]
    pins = server["dependencies"] + [r for reqs in server["optional-dependencies"].values() for r in reqs]
    assert all(r.startswith("baton-runs[") and r.endswith(f"]=={client['version']}") for r in pins), pins
    assert set(server["optional-dependencies"]) | {"server"} <= set(client["optional-dependencies"])


@pytest.mark.slow
def test_a_venv_with_the_client_wheel_alone_imports_the_clients(
    wheels: dict[str, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    # This venv's pip installs into the new one: the lock's versions, wheels from the pip cache.
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--disable-pip-version-check",
         "-c", str(REPO / "requirements.lock"), str(wheels["client"])],
        check=True, capture_output=True, text=True, timeout=150,
    )
    code = (
        "import importlib.util, baton.client, baton.grpc_client, baton.coordinator_client, baton.grpc_errors\n"
        "assert baton.client.__file__.startswith(%r), baton.client.__file__\n"
        "assert all(importlib.util.find_spec(m) is None for m in ('coordinator', 'gateway', 'sandbox_host'))\n"
        "assert importlib.util.find_spec('baton.log') is None and importlib.util.find_spec('nats') is None\n"
    ) % str(env_dir)
    # -I and cwd outside the repository: nothing of the source tree is on sys.path.
    subprocess.run([str(python), "-I", "-c", code], check=True, cwd=tmp_path, timeout=60)
    # The console scripts are in the client wheel; without the server distribution they say so.
    out = subprocess.run([str(env_dir / "bin" / "baton-gateway")], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0 and "pip install ./server-dist" in out.stderr, out.stderr
