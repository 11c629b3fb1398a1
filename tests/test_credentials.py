"""Start-up refusals (baton/credentials.py): every service refuses a placeholder credential,
and serving off loopback without its auth unless BATON_ALLOW_INSECURE=1, naming the
variable and never the value. The services are real subprocesses (``python -m ...``), as an
orchestrator starts them; the refusals come before any connection, so no server is needed
for them."""
from __future__ import annotations

import pathlib
import signal
import subprocess
import sys
from typing import Any

import pytest

from baton import credentials
from baton_tools.testing.cluster import wait_serving
from baton_tools.testing.servers import env_without_proxy, free_port
from tests.conftest import assert_eventually

REPO = pathlib.Path(__file__).resolve().parent.parent
MODULES = {"coordinator": "coordinator", "gateway": "gateway", "sandbox host": "sandbox_host"}
LISTEN = {"coordinator": "BATON_COORDINATOR_LISTEN", "gateway": "BATON_GATEWAY_LISTEN",
          "sandbox host": "BATON_HOST_LISTEN"}
AUTH = {"coordinator": "BATON_INTERNAL_TOKEN", "gateway": "BATON_API_KEYS", "sandbox host": "BATON_INTERNAL_TOKEN"}


def _env(**settings: str) -> dict[str, str]:
    """A clean environment (none of the caller's BATON_* or agent keys), loopback everywhere."""
    env = {k: v for k, v in env_without_proxy().items()
           if not k.startswith("BATON_") and k not in credentials.AGENT_SECRET_NAMES}
    env.update({"PYTHONPATH": str(REPO), "BATON_COORDINATOR_LISTEN": "127.0.0.1:0",
                "BATON_HOST_LISTEN": "127.0.0.1:0", "BATON_GATEWAY_LISTEN": f"127.0.0.1:{free_port()}",
                "BATON_GATEWAY_GRPC_LISTEN": "127.0.0.1:0"})
    env.update(settings)
    return env


def _refused(service: str, env: dict[str, str]) -> str:
    """Start ``service``; it must exit 2 at once. Returns its stderr."""
    p = subprocess.run([sys.executable, "-m", MODULES[service]], env=env, capture_output=True, text=True,
                       timeout=60, cwd=str(REPO))
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert f"baton-{service.replace(' ', '-')}: refusing to start:" in p.stderr
    assert "Traceback" not in p.stderr
    return p.stderr


# --- the rules, pure ------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["change-me", "change-me-internal", "CHANGEME", "change_me_token",
                                   "replace-me", "<your api key>", "xxxxxxxx", "placeholder", "changeit"])
def test_placeholders_are_recognised(value: str) -> None:
    assert credentials.is_placeholder(value)


@pytest.mark.parametrize("value", ["", "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
                                   "sk-ant-api03-Qw3rTy", "test-key", "s3cr3t-value"])
def test_real_looking_values_are_not_placeholders(value: str) -> None:
    assert not credentials.is_placeholder(value)


def test_placeholders_name_the_variable_and_the_entry() -> None:
    env = {"BATON_API_KEYS": "k1-real=acme,change-me=default", "OPENAI_API_KEY": "<key>",
           "BATON_NATS_URL": "nats://a:4222,nats://baton:change-me@b:4222", "BATON_INTERNAL_TOKEN": "fine-token"}
    assert credentials.placeholders(env) == [
        "BATON_API_KEYS (the key of entry #2)", "OPENAI_API_KEY", "BATON_NATS_URL (the credentials of server #2)"]


@pytest.mark.parametrize("listen, loopback", [("127.0.0.1:7100", True), ("127.3.4.5:1", True), ("localhost:80", True),
                                              ("[::1]:7100", True), ("0.0.0.0:7100", False), (":7100", False),
                                              ("[::]:7100", False), ("10.0.0.7:7100", False),
                                              ("baton-coordinator:7100", False)])
def test_loopback_addresses(listen: str, loopback: bool) -> None:
    assert credentials.is_loopback(listen) is loopback


def test_auth_or_the_explicit_setting_lets_a_service_listen_off_loopback() -> None:
    listens = {"BATON_HOST_LISTEN": "0.0.0.0:7200"}
    with pytest.raises(credentials.UnsafeStart, match="BATON_HOST_LISTEN=0.0.0.0:7200.*BATON_INTERNAL_TOKEN"):
        credentials.check_start("sandbox host", listens=listens, auth_var="BATON_INTERNAL_TOKEN", env={})
    credentials.check_start("sandbox host", listens=listens, auth_var="BATON_INTERNAL_TOKEN",
                            env={"BATON_INTERNAL_TOKEN": "a-real-token"})
    credentials.check_start("sandbox host", listens=listens, auth_var="BATON_INTERNAL_TOKEN",
                            env={"BATON_ALLOW_INSECURE": "1"})
    # A placeholder is refused even when insecure serving is allowed: it is never meant.
    with pytest.raises(credentials.UnsafeStart, match="BATON_INTERNAL_TOKEN holds a placeholder"):
        credentials.check_start("sandbox host", listens=listens, auth_var="BATON_INTERNAL_TOKEN",
                                env={"BATON_ALLOW_INSECURE": "1", "BATON_INTERNAL_TOKEN": "change-me"})


# --- the services, as processes --------------------------------------------------------------


@pytest.mark.servers
@pytest.mark.parametrize("service", list(MODULES))
def test_every_service_refuses_the_shipped_internal_token_naming_it_not_its_value(service: str) -> None:
    err = _refused(service, _env(BATON_INTERNAL_TOKEN="change-me-internal"))
    assert "BATON_INTERNAL_TOKEN holds a placeholder" in err
    assert "change-me-internal" not in err


@pytest.mark.servers
def test_the_gateway_refuses_the_shipped_api_key() -> None:
    err = _refused("gateway", _env(BATON_API_KEYS="k-4f1c9a=acme,change-me=default"))
    assert "BATON_API_KEYS (the key of entry #2) holds a placeholder" in err
    assert "change-me" not in err and "k-4f1c9a" not in err


@pytest.mark.servers
def test_a_host_refuses_a_placeholder_agent_key() -> None:
    err = _refused("sandbox host", _env(ANTHROPIC_API_KEY="change-me"))
    assert "ANTHROPIC_API_KEY holds a placeholder" in err


@pytest.mark.servers
def test_a_host_refuses_a_placeholder_in_a_tenants_credentials(tmp_path: pathlib.Path) -> None:
    (tmp_path / "acme").mkdir()
    (tmp_path / "acme" / "OPENAI_API_KEY").write_text("<paste the key here>\n")
    err = _refused("sandbox host", _env(BATON_TENANT_SECRETS_DIR=str(tmp_path)))
    assert "BATON_TENANT_SECRETS_DIR: acme/OPENAI_API_KEY holds a placeholder" in err
    assert "paste" not in err


@pytest.mark.servers
@pytest.mark.parametrize("service", list(MODULES))
def test_every_service_refuses_to_serve_off_loopback_without_auth(service: str) -> None:
    err = _refused(service, _env(**{LISTEN[service]: f"0.0.0.0:{free_port()}"}))
    assert "non-loopback address" in err and LISTEN[service] in err
    assert f"set {AUTH[service]}" in err and "BATON_ALLOW_INSECURE=1" in err


@pytest.mark.servers
def test_the_gateway_grpc_port_counts_too() -> None:
    err = _refused("gateway", _env(BATON_GATEWAY_GRPC_LISTEN="0.0.0.0:0"))
    assert "BATON_GATEWAY_GRPC_LISTEN=0.0.0.0:0" in err


@pytest.mark.parametrize("extra", [{"BATON_ALLOW_INSECURE": "1"}, {"BATON_INTERNAL_TOKEN": "3b1f0c7e2a9d4f68"}],
                         ids=["allow-insecure", "token"])
async def test_a_coordinator_off_loopback_serves_with_a_token_or_when_told(
        extra: dict[str, str], etcd: Any, tmp_path: pathlib.Path) -> None:
    port = free_port()
    env = _env(BATON_COORDINATOR_LISTEN=f"0.0.0.0:{port}", BATON_ETCD_ENDPOINTS=etcd.endpoint,
               BATON_ETCD_PREFIX=f"/creds-{port}/", **extra)
    log = tmp_path / "coordinator.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "coordinator"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                cwd=str(REPO), start_new_session=True)
    try:
        await wait_serving(f"127.0.0.1:{port}", 30, alive=lambda: proc.poll() is None)
        assert b"refusing" not in log.read_bytes()
    finally:
        proc.send_signal(signal.SIGTERM)
        await assert_eventually(lambda: proc.poll() is not None, timeout=20)
