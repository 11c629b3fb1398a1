"""A service whose TLS or credential file is missing or unusable refuses to start (exit 2),
naming the variable and the path, before it connects to anything; never a key's bytes."""
from __future__ import annotations

import pathlib

import pytest

from tests.test_credentials import _env, _refused
from tests.tls.pki import CA

pytestmark = pytest.mark.servers


@pytest.mark.parametrize("service, var", [
    ("coordinator", "BATON_TLS_CERT"), ("sandbox host", "BATON_TLS_CERT"), ("coordinator", "BATON_ETCD_CA"),
    ("gateway", "BATON_NATS_CA"), ("gateway", "BATON_GATEWAY_TLS_CERT"), ("sandbox host", "BATON_NATS_CREDS"),
    ("sandbox host", "BATON_SANDBOX_CA_CERT"),
])
def test_a_missing_file_names_its_variable(service: str, var: str, tmp_path: pathlib.Path) -> None:
    leaf = CA(tmp_path, "c").leaf("node")
    key_var = {"BATON_TLS_CERT": "BATON_TLS_KEY", "BATON_GATEWAY_TLS_CERT": "BATON_GATEWAY_TLS_KEY",
               "BATON_SANDBOX_CA_CERT": "BATON_SANDBOX_CA_KEY"}.get(var)
    env = _env(**{var: str(tmp_path / "missing.pem"), **({key_var: leaf.key} if key_var else {})})
    err = _refused(service, env)
    assert f"{var}: cannot read {tmp_path / 'missing.pem'}" in err


def test_a_key_that_is_not_the_certificates(tmp_path: pathlib.Path) -> None:
    ca = CA(tmp_path, "c")
    mine, other = ca.leaf("node"), ca.leaf("other")
    err = _refused("coordinator", _env(BATON_TLS_CERT=mine.cert, BATON_TLS_KEY=other.key))
    assert "BATON_TLS_KEY" in err and "is not the private key of BATON_TLS_CERT" in err
    body = "".join(pathlib.Path(other.key).read_text().splitlines()[1:-1])
    assert body[:24] not in err
