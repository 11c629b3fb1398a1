"""compose.yaml: the issue's shape, consistent with the code, and accepted by docker-compose."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from tests.conftest import require
from tests.deploy.conftest import (
    REPO,
    console_scripts,
    default_port,
    host_of,
    port_of,
    resolve_console_script,
    setting_names,
)

COMPOSE = REPO / "compose.yaml"
BATON_SERVICES = {
    "coordinator": "baton-coordinator",
    "sandbox-host-1": "baton-sandbox-host",
    "sandbox-host-2": "baton-sandbox-host",
    "gateway": "baton-gateway",
}


# Compose's interpolation: ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error},
# ${VAR?error}, and $$ for a literal $.
_VAR = re.compile(r"\$\$|\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<default>[^}]*))?\}")
#: What the file requires (${VAR:?...}); the tests set it, as a user must.
REQUIRED = {"BATON_INTERNAL_TOKEN": "compose-test-token-5d1e"}
AGENT_KEYS = {"ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", "OPENAI_API_KEY", "CODEX_API_KEY"}


def _interpolate(value: Any, env: dict[str, str]) -> Any:
    """``value`` with compose's ``${...}`` variables substituted, as docker-compose does."""
    if isinstance(value, dict):
        return {k: _interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        if m[0] == "$$":
            return "$"
        name, op, default = m["name"], m["op"], m["default"] or ""
        if op == ":-":
            return env.get(name) or default
        if op == "-":
            return env.get(name, default)
        if op in (":?", "?") and not (env.get(name) if op == ":?" else name in env):
            raise ValueError(f"Missing mandatory value for {name}: {default}")
        return env.get(name, "")

    return _VAR.sub(sub, value)


def _env_without_baton() -> dict[str, str]:
    # The file's defaults are what is tested, not the caller's BATON_* settings or agent keys,
    # plus what it requires.
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_") and k not in AGENT_KEYS}
    return {**env, **REQUIRED}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """The file as docker-compose resolves it (anchors, merges, ${VARS}).

    Without docker-compose (a developer's machine), PyYAML resolves anchors and merge keys and
    :func:`_interpolate` the variables, so the static checks below still run.
    """
    exe = shutil.which("docker-compose")
    if exe is None:
        with open(COMPOSE, encoding="utf-8") as f:
            return _interpolate(yaml.safe_load(f), _env_without_baton())  # type: ignore[no-any-return]
    out = subprocess.run(
        [exe, "-f", str(COMPOSE), "config"], capture_output=True, text=True, timeout=60,
        env=_env_without_baton(),
    )
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


@pytest.mark.servers  # starts processes: not a unit test
def test_docker_compose_config_accepts_the_file() -> None:
    exe = shutil.which("docker-compose")
    require(exe is not None, "docker-compose not installed (apt-get install docker-compose)")
    assert exe is not None
    out = subprocess.run([exe, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True, timeout=60,
                         env=_env_without_baton())
    assert out.returncode == 0, out.stderr


@pytest.mark.servers  # starts processes: not a unit test
def test_docker_compose_refuses_to_start_without_an_internal_token() -> None:
    exe = shutil.which("docker-compose")
    require(exe is not None, "docker-compose not installed (apt-get install docker-compose)")
    assert exe is not None
    env = {k: v for k, v in _env_without_baton().items() if k != "BATON_INTERNAL_TOKEN"}
    out = subprocess.run([exe, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True, timeout=60,
                         env=env)
    assert out.returncode != 0
    assert "set BATON_INTERNAL_TOKEN to a random secret" in out.stderr


@pytest.mark.servers  # starts processes: not a unit test
def test_docker_compose_config_rejects_a_broken_file(tmp_path: Any) -> None:
    exe = shutil.which("docker-compose")
    require(exe is not None, "docker-compose not installed (apt-get install docker-compose)")
    assert exe is not None
    bad = tmp_path / "compose.yaml"
    bad.write_text(COMPOSE.read_text().replace("depends_on:", "depends_onn:", 1))
    out = subprocess.run([exe, "-f", str(bad), "config", "-q"], capture_output=True, text=True, timeout=60,
                         env=_env_without_baton())
    assert out.returncode != 0


def test_services_of_the_issue(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"etcd", "nats", "sandbox-image", *BATON_SERVICES}
    # etcd and NATS keep their data on volumes; NATS runs JetStream.
    assert any(v.startswith("etcd-data:") or (isinstance(v, dict) and v.get("source") == "etcd-data")
               for v in _volumes(services["etcd"]))
    assert any("nats-data" in str(v) for v in _volumes(services["nats"]))
    assert "-js" in services["nats"]["command"]
    # The gateway is published.
    assert services["gateway"]["ports"]


def _volumes(svc: dict[str, Any]) -> list[Any]:
    return list(svc.get("volumes", []))


def test_every_service_has_a_health_check_and_waits_for_healthy_deps(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, svc in services.items():
        if name != "sandbox-image":  # builds an image and exits: nothing to check the health of
            assert svc.get("healthcheck", {}).get("test"), name
        deps = svc.get("depends_on", {})
        assert isinstance(deps, dict), name
        for dep, cond in deps.items():
            assert dep in services
            want = "service_completed_successfully" if dep == "sandbox-image" else "service_healthy"
            assert cond == {"condition": want}, (name, dep)
    assert set(services["gateway"]["depends_on"]) >= {"coordinator", "sandbox-host-1", "sandbox-host-2"}
    assert set(services["coordinator"]["depends_on"]) >= {"etcd"}


def test_commands_are_console_scripts(compose: dict[str, Any]) -> None:
    scripts = console_scripts()
    for name, script in BATON_SERVICES.items():
        cmd = compose["services"][name]["command"]
        assert cmd == [script]
        assert script in scripts and resolve_console_script(script)


def test_env_names_are_baton_settings(compose: dict[str, Any]) -> None:
    for name in BATON_SERVICES:
        env = compose["services"][name]["environment"]
        baton = {k for k in env if k.startswith("BATON_")}
        assert baton == set(env) - AGENT_KEYS, name
        assert baton <= setting_names(), baton - setting_names()


def test_credentials_go_only_where_they_are_used_and_none_has_a_default(compose: dict[str, Any]) -> None:
    s = compose["services"]
    for name in BATON_SERVICES:
        env = s[name]["environment"]
        # Agent keys: the hosts' only (they hand them to agents); API keys: the gateway's.
        assert (set(env) & AGENT_KEYS == AGENT_KEYS) is name.startswith("sandbox-host"), name
        assert ("BATON_API_KEYS" in env) is (name == "gateway"), name
        assert env["BATON_INTERNAL_TOKEN"] == REQUIRED["BATON_INTERNAL_TOKEN"]
        assert all(not env[k] for k in set(env) & (AGENT_KEYS | {"BATON_API_KEYS", "BATON_ALLOW_INSECURE"})), name
    # No default a service would refuse as a placeholder (baton/credentials.py).
    from baton.credentials import placeholders

    for name in BATON_SERVICES:
        assert placeholders(s[name]["environment"]) == [], name


def test_the_interpolation_refuses_a_missing_required_variable() -> None:
    with pytest.raises(ValueError, match="Missing mandatory value for T: say so"):
        _interpolate("${T:?say so}", {"T": ""})
    assert _interpolate("${T:?say so}", {"T": "x"}) == "x"


def _listen_port(env: dict[str, str], setting: str) -> int:
    return port_of(env.get(setting, f"x:{default_port(setting)}"))


def _container_port(mapping: Any) -> int:
    """The container side of a compose port mapping: short ("8080:8080", "127.0.0.1:9101:9101/tcp")
    or long syntax (a mapping with ``target``, as ``docker-compose config`` prints it)."""
    if isinstance(mapping, dict):
        return int(mapping["target"])
    return int(str(mapping).rsplit(":", 1)[1].split("/", 1)[0])


def _published(mapping: Any) -> tuple[str, int]:
    """``(host address, host port)`` of a compose port mapping ("" = every interface)."""
    if isinstance(mapping, dict):
        return str(mapping.get("host_ip", "")), int(mapping["published"])
    parts = str(mapping).split("/", 1)[0].split(":")
    return (parts[0] if len(parts) == 3 else ""), int(parts[-2])


def test_ports_addresses_and_health_checks_agree(compose: dict[str, Any]) -> None:
    s = compose["services"]
    coord_port = _listen_port(s["coordinator"]["environment"], "BATON_COORDINATOR_LISTEN")
    assert f"127.0.0.1:{coord_port}" in s["coordinator"]["healthcheck"]["test"]
    for name in BATON_SERVICES:
        env = s[name]["environment"]
        assert host_of(env["BATON_COORDINATOR"]) == "coordinator"
        assert port_of(env["BATON_COORDINATOR"]) == coord_port
        assert host_of(env["BATON_ETCD_ENDPOINTS"]) == "etcd"
        assert "--listen-client-urls=http://0.0.0.0:%d" % port_of(env["BATON_ETCD_ENDPOINTS"]) in s["etcd"]["command"]
        assert host_of(env["BATON_NATS_URL"]) == "nats"
    for name in ("sandbox-host-1", "sandbox-host-2"):
        env = s[name]["environment"]
        port = _listen_port(env, "BATON_HOST_LISTEN")
        assert env["BATON_HOST_ADVERTISE"] == f"{name}:{port}"
        assert env["BATON_HOST_ID"] == name
        assert f"127.0.0.1:{port}" in s[name]["healthcheck"]["test"]
    assert s["sandbox-host-1"]["environment"]["BATON_HOST_ID"] != s["sandbox-host-2"]["environment"]["BATON_HOST_ID"]
    gw_port = _listen_port(s["gateway"]["environment"], "BATON_GATEWAY_LISTEN")
    published, grpc_published, _ = s["gateway"]["ports"]
    assert _container_port(grpc_published) == _listen_port(s["gateway"]["environment"], "BATON_GATEWAY_GRPC_LISTEN")
    assert _container_port(published) == gw_port
    assert f"http://127.0.0.1:{gw_port}/readyz" in s["gateway"]["healthcheck"]["test"]


METRICS_LISTEN = {"coordinator": "BATON_COORDINATOR_METRICS_LISTEN", "sandbox-host-1": "BATON_HOST_METRICS_LISTEN",
                  "sandbox-host-2": "BATON_HOST_METRICS_LISTEN", "gateway": "BATON_GATEWAY_METRICS_LISTEN"}


def test_every_metrics_listener_is_exposed_and_published_on_loopback_only(compose: dict[str, Any]) -> None:
    s = compose["services"]
    published: dict[str, int] = {}
    for name, setting in METRICS_LISTEN.items():
        env = s[name]["environment"]
        listen = env.get(setting, f"0.0.0.0:{default_port(setting)}")
        # Every interface of the container: a scrape comes over the compose network.
        assert host_of(listen) == "0.0.0.0", (name, listen)
        port = port_of(listen)
        assert str(port) in [str(p) for p in s[name]["expose"]], name
        (mapping,) = [m for m in s[name]["ports"] if _container_port(m) == port]
        # The listener asks for no key: never on the engine's public interfaces.
        address, published[name] = _published(mapping)
        assert address == "127.0.0.1", (name, mapping)
    # One host port each (the two hosts listen on the same port in their containers).
    assert len(set(published.values())) == len(published), published
    assert published == {"coordinator": 9101, "sandbox-host-1": 9102, "sandbox-host-2": 9104, "gateway": 9103}


def test_docker_provider_hosts_reach_the_engine(compose: dict[str, Any]) -> None:
    sandbox = compose["services"]["sandbox-image"]
    for name in ("sandbox-host-1", "sandbox-host-2"):
        svc = compose["services"][name]
        assert svc["environment"]["BATON_PROVIDER"] == "docker"
        assert any("/var/run/docker.sock" in str(v) for v in _volumes(svc))
        # Sandboxes start from the image the sandbox-image service builds (the Dockerfile's
        # `sandbox` target), which the hosts wait for.
        assert svc["environment"]["BATON_DOCKER_IMAGE"] == sandbox["image"]
        assert svc["depends_on"]["sandbox-image"] == {"condition": "service_completed_successfully"}
    assert sandbox["build"]["target"] == "sandbox"
    assert "AS sandbox" in (REPO / "Dockerfile").read_text()


def test_the_test_override_replaces_only_the_engines_images() -> None:
    # The shipped file keeps the upstream images a user pulls; the test override
    # (tests/deploy/compose.test.yaml) swaps in images built from the pip binaries.
    shipped = yaml.safe_load(COMPOSE.read_text())["services"]
    assert shipped["etcd"]["image"].startswith("quay.io/coreos/etcd:")
    assert shipped["nats"]["image"].startswith("nats:")
    override = yaml.safe_load((REPO / "tests" / "deploy" / "compose.test.yaml").read_text())["services"]
    assert {n for n, svc in override.items() if "image" in svc} == {"etcd", "nats"}
    # The baton services keep their image, command and settings; only health-check time-outs
    # are relaxed for a loaded machine.
    for name in BATON_SERVICES:
        assert set(override.get(name, {})) <= {"healthcheck"}, name
        assert "test" not in override.get(name, {}).get("healthcheck", {}), name


def test_health_checks_use_cli_commands_that_exist(compose: dict[str, Any]) -> None:
    from typer.main import get_command

    from baton_tools.cli import app

    commands = get_command(app).commands  # type: ignore[attr-defined]
    for name in BATON_SERVICES:
        test = compose["services"][name]["healthcheck"]["test"]
        assert test[:3] in (["CMD", "baton", "health"],)
        assert test[3] in commands["health"].commands  # type: ignore[attr-defined]


def test_interpolation_without_docker_compose_follows_compose_rules() -> None:
    env = {"SET": "x", "EMPTY": ""}
    assert _interpolate("${SET:-d}/${EMPTY:-d}/${UNSET:-d}", env) == "x/d/d"
    assert _interpolate("${SET-d}/${EMPTY-d}/${UNSET-d}", env) == "x//d"
    assert _interpolate(["$${SET}", {"k": "${UNSET}"}, 3], env) == ["${SET}", {"k": ""}, 3]
