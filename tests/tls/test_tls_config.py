"""TLS and credential settings, parsed without servers: what each variable turns on, and a
bad file refused at start-up naming its variable, never a key's or a password's bytes."""
from __future__ import annotations

import pathlib
import ssl

import pytest

from baton import config, credentials, tls
from baton.grpc_client import RunsClient
from baton.log._nats_auth import connect_options
from coordinator._config import CoordinatorConfig
from coordinator._etcd_auth import EtcdSecurity
from gateway._settings import GatewaySettings
from tests.tls.pki import CA, Leaf


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[CA, Leaf, Leaf]:
    """A CA, a leaf of it, and a leaf of another CA."""
    d = tmp_path_factory.mktemp("pki")
    ca = CA(d, "cluster")
    return ca, ca.leaf("node"), CA(d, "other").leaf("stranger")


def _secret_free(message: str, *files: str) -> None:
    """No byte of a key file's body appears in ``message``."""
    for f in files:
        body = "".join(pathlib.Path(f).read_text().splitlines()[1:-1])
        assert body[:24] not in message


def test_nothing_set_is_plaintext() -> None:
    assert tls.from_env({}) is tls.PLAINTEXT
    assert not tls.PLAINTEXT.enabled
    assert EtcdSecurity.from_env({}) == EtcdSecurity()
    assert connect_options({}) == {}
    assert GatewaySettings.from_env({}).public_tls is tls.PLAINTEXT


def test_the_internal_settings(pki: tuple[CA, Leaf, Leaf]) -> None:
    ca, leaf, _ = pki
    got = tls.from_env({tls.CERT: leaf.cert, tls.KEY: leaf.key, tls.CA: ca.cert, tls.CLIENT_AUTH: "1",
                        tls.SERVER_NAME: "baton.internal"})
    assert got.enabled and got.client_auth and got.server_name == "baton.internal"
    assert got.cert == pathlib.Path(leaf.cert).read_bytes() and got.ca == pathlib.Path(ca.cert).read_bytes()
    assert got.key.decode() not in repr(got)  # keys stay out of reprs (and so of logs)
    assert ("grpc.ssl_target_name_override", "baton.internal") in got.channel_options([])
    # A CA alone: TLS for a client without a certificate of its own (the CLI, a gateway).
    only_ca = tls.from_env({tls.CA: ca.cert})
    assert only_ca.enabled and not only_ca.cert and not only_ca.client_auth
    assert only_ca.channel_options([("a", 1)]) == [("a", 1)]
    # A certificate alone: TLS checked against the system's roots.
    assert tls.from_env({tls.CERT: leaf.cert, tls.KEY: leaf.key}).enabled
    # Every setting read here is declared (and documented in docs/operating.md).
    declared = {s.env for s in config.SETTINGS}
    assert {tls.CERT, tls.KEY, tls.CA, tls.CLIENT_AUTH, tls.SERVER_NAME, "BATON_GATEWAY_TLS_CERT",
            "BATON_GATEWAY_TLS_KEY", "BATON_ETCD_CA", "BATON_ETCD_CERT", "BATON_ETCD_KEY", "BATON_ETCD_USER",
            "BATON_ETCD_PASSWORD", "BATON_NATS_CA", "BATON_NATS_CERT", "BATON_NATS_KEY", "BATON_NATS_CREDS",
            "BATON_NATS_NKEY_SEED"} <= declared


@pytest.mark.parametrize("env_of, named", [
    (lambda ca, leaf, other, tmp: {tls.CERT: leaf.cert}, "BATON_TLS_KEY must be set with BATON_TLS_CERT"),
    (lambda ca, leaf, other, tmp: {tls.KEY: leaf.key}, "BATON_TLS_CERT must be set with BATON_TLS_KEY"),
    (lambda ca, leaf, other, tmp: {tls.CERT: str(tmp / "none.pem"), tls.KEY: leaf.key},
     "BATON_TLS_CERT: cannot read"),
    (lambda ca, leaf, other, tmp: {tls.CERT: leaf.key, tls.KEY: leaf.key}, "BATON_TLS_CERT: "),
    (lambda ca, leaf, other, tmp: {tls.CERT: leaf.cert, tls.KEY: leaf.cert}, "BATON_TLS_KEY: "),
    (lambda ca, leaf, other, tmp: {tls.CERT: leaf.cert, tls.KEY: other.key},
     "BATON_TLS_KEY (" ),
    (lambda ca, leaf, other, tmp: {tls.CA: leaf.key}, "BATON_TLS_CA: "),
    (lambda ca, leaf, other, tmp: {tls.CERT: leaf.cert, tls.KEY: leaf.key, tls.CLIENT_AUTH: "1"},
     "BATON_TLS_CLIENT_AUTH=1 needs BATON_TLS_CA"),
    (lambda ca, leaf, other, tmp: {tls.CA: ca.cert, tls.CLIENT_AUTH: "1"},
     "BATON_TLS_CLIENT_AUTH=1 needs BATON_TLS_CERT"),
    (lambda ca, leaf, other, tmp: {tls.CA: ca.cert, tls.CLIENT_AUTH: "sure"}, "BATON_TLS_CLIENT_AUTH must be 1 or 0"),
])
def test_a_bad_internal_setting_names_its_variable(pki: tuple[CA, Leaf, Leaf], tmp_path: pathlib.Path,
                                                   env_of: object, named: str) -> None:
    ca, leaf, other = pki
    env = env_of(ca, leaf, other, tmp_path)  # type: ignore[operator]
    with pytest.raises(tls.TlsConfigError) as err:
        tls.from_env(env)
    assert named in str(err.value)
    _secret_free(str(err.value), leaf.key, other.key)
    # The coordinator's and the gateway's settings refuse it alike (their main()s exit 2 with it).
    with pytest.raises(ValueError, match=named.split(" ")[0].rstrip(":(")):
        CoordinatorConfig.from_env(env)
    with pytest.raises(ValueError, match=named.split(" ")[0].rstrip(":(")):
        credentials.check_files(nats=False, env=env)


def test_a_pair_that_does_not_match_is_refused(pki: tuple[CA, Leaf, Leaf]) -> None:
    _, leaf, other = pki
    with pytest.raises(tls.TlsConfigError, match="is not the private key of BATON_TLS_CERT"):
        tls.from_env({tls.CERT: leaf.cert, tls.KEY: other.key})


def test_the_gateway_public_certificate(pki: tuple[CA, Leaf, Leaf], tmp_path: pathlib.Path) -> None:
    _, leaf, _ = pki
    got = GatewaySettings.from_env({"BATON_GATEWAY_TLS_CERT": leaf.cert, "BATON_GATEWAY_TLS_KEY": leaf.key}).public_tls
    assert got.enabled and got.cert and not got.client_auth  # API keys tell callers apart, not certificates
    with pytest.raises(ValueError, match="BATON_GATEWAY_TLS_KEY must be set with BATON_GATEWAY_TLS_CERT"):
        GatewaySettings.from_env({"BATON_GATEWAY_TLS_CERT": leaf.cert})
    with pytest.raises(ValueError, match="BATON_GATEWAY_TLS_CERT: cannot read"):
        GatewaySettings.from_env({"BATON_GATEWAY_TLS_CERT": str(tmp_path / "gone.pem"),
                                  "BATON_GATEWAY_TLS_KEY": leaf.key})


def test_etcd_settings(pki: tuple[CA, Leaf, Leaf], tmp_path: pathlib.Path) -> None:
    ca, leaf, _ = pki
    sec = EtcdSecurity.from_env({"BATON_ETCD_CA": ca.cert, "BATON_ETCD_CERT": leaf.cert, "BATON_ETCD_KEY": leaf.key,
                                 "BATON_ETCD_USER": "baton", "BATON_ETCD_PASSWORD": "s3cr3t-pw"})
    assert sec.tls and sec.cert and sec.user == "baton" and sec.password == "s3cr3t-pw"
    assert "s3cr3t-pw" not in repr(sec) and sec.key.decode() not in repr(sec)
    assert EtcdSecurity.from_env({"BATON_ETCD_USER": "u", "BATON_ETCD_PASSWORD": "p"}).tls is False
    with pytest.raises(ValueError, match="BATON_ETCD_PASSWORD must be set with BATON_ETCD_USER"):
        EtcdSecurity.from_env({"BATON_ETCD_USER": "baton"})
    with pytest.raises(ValueError, match="BATON_ETCD_USER must be set with BATON_ETCD_PASSWORD") as err:
        EtcdSecurity.from_env({"BATON_ETCD_PASSWORD": "s3cr3t-pw"})
    assert "s3cr3t-pw" not in str(err.value)
    with pytest.raises(ValueError, match="BATON_ETCD_CA: cannot read"):
        CoordinatorConfig.from_env({"BATON_ETCD_CA": str(tmp_path / "gone.pem")})
    with pytest.raises(ValueError, match="BATON_ETCD_KEY must be set with BATON_ETCD_CERT"):
        CoordinatorConfig.from_env({"BATON_ETCD_CERT": leaf.cert})


def test_nats_settings(pki: tuple[CA, Leaf, Leaf], tmp_path: pathlib.Path) -> None:
    ca, leaf, other = pki
    opts = connect_options({"BATON_NATS_CA": ca.cert, "BATON_NATS_CERT": leaf.cert, "BATON_NATS_KEY": leaf.key})
    assert isinstance(opts["tls"], ssl.SSLContext) and opts["tls"].verify_mode == ssl.CERT_REQUIRED
    assert opts["tls"].check_hostname
    with pytest.raises(ValueError, match="BATON_NATS_KEY must be set with BATON_NATS_CERT"):
        connect_options({"BATON_NATS_CERT": leaf.cert})
    with pytest.raises(ValueError, match=r"BATON_NATS_KEY \("):
        connect_options({"BATON_NATS_CERT": leaf.cert, "BATON_NATS_KEY": other.key})
    seed = tmp_path / "user.nk"
    seed.write_text("SUAEXAMPLEEXAMPLEEXAMPLEEXAMPLEEXAMPLEEXAMPLEEXAMPLEEXAMPLE\n")
    assert connect_options({"BATON_NATS_NKEY_SEED": str(seed)}) == {"nkeys_seed": str(seed)}
    creds = tmp_path / "user.creds"
    creds.write_text("-----BEGIN NATS USER JWT-----\neyJ0\n------END NATS USER JWT------\n\n"
                     "-----BEGIN USER NKEY SEED-----\nSUAEXAMPLE\n------END USER NKEY SEED------\n")
    assert connect_options({"BATON_NATS_CREDS": str(creds)}) == {"user_credentials": str(creds)}
    with pytest.raises(ValueError, match="set one of BATON_NATS_CREDS and BATON_NATS_NKEY_SEED"):
        connect_options({"BATON_NATS_CREDS": str(creds), "BATON_NATS_NKEY_SEED": str(seed)})
    with pytest.raises(ValueError, match="BATON_NATS_CREDS: .* is not a NATS .creds file") as err:
        connect_options({"BATON_NATS_CREDS": str(seed)})
    assert "SUAEXAMPLE" not in str(err.value)
    with pytest.raises(ValueError, match="BATON_NATS_NKEY_SEED: .* holds no user nkey seed") as err:
        connect_options({"BATON_NATS_NKEY_SEED": str(creds)})
    assert "SUAEXAMPLE" not in str(err.value) and "eyJ0" not in str(err.value)
    with pytest.raises(ValueError, match="BATON_NATS_NKEY_SEED: cannot read"):
        credentials.check_files(nats=True, env={"BATON_NATS_NKEY_SEED": str(tmp_path / "gone")})


def test_mutual_tls_counts_as_internal_auth_off_loopback() -> None:
    listens = {"BATON_COORDINATOR_LISTEN": "0.0.0.0:7100"}
    with pytest.raises(credentials.UnsafeStart, match="BATON_TLS_CLIENT_AUTH is off") as err:
        credentials.check_start("coordinator", listens=listens, auth_var="BATON_INTERNAL_TOKEN", env={})
    assert "BATON_TLS_CLIENT_AUTH=1 (mutual TLS)" in str(err.value)
    credentials.check_start("coordinator", listens=listens, auth_var="BATON_INTERNAL_TOKEN",
                            env={"BATON_TLS_CLIENT_AUTH": "1"})
    # TLS alone encrypts but authenticates nobody; and the gateway's auth is its API keys.
    with pytest.raises(credentials.UnsafeStart):
        credentials.check_start("sandbox host", listens={"BATON_HOST_LISTEN": "0.0.0.0:7200"},
                                auth_var="BATON_INTERNAL_TOKEN", env={"BATON_TLS_CERT": "/x", "BATON_TLS_KEY": "/y"})
    with pytest.raises(credentials.UnsafeStart, match="BATON_API_KEYS is empty: set BATON_API_KEYS,"):
        credentials.check_start("gateway", listens={"BATON_GATEWAY_LISTEN": "0.0.0.0:8080"},
                                auth_var="BATON_API_KEYS", env={"BATON_TLS_CLIENT_AUTH": "1"})


def test_a_placeholder_etcd_password_is_refused() -> None:
    with pytest.raises(credentials.UnsafeStart, match="BATON_ETCD_PASSWORD holds a placeholder"):
        credentials.check_start("coordinator", listens={}, auth_var="BATON_INTERNAL_TOKEN",
                                env={"BATON_ETCD_USER": "baton", "BATON_ETCD_PASSWORD": "change-me"})


async def test_the_public_client_reads_its_files(pki: tuple[CA, Leaf, Leaf], tmp_path: pathlib.Path) -> None:
    ca, leaf, _ = pki
    async with RunsClient("127.0.0.1:1", ca_file=ca.cert, cert_file=leaf.cert, key_file=leaf.key):
        pass
    with pytest.raises(ValueError, match="ca_file: cannot read"):
        RunsClient("127.0.0.1:1", ca_file=str(tmp_path / "gone.pem"))
    with pytest.raises(ValueError, match="cert_file and key_file go together"):
        RunsClient("127.0.0.1:1", cert_file=leaf.cert)
