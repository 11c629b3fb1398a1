"""The sandbox CA: settings, the certificate a host mints for one sandbox's daemon, errors
without key material (sandbox_host/providers/_sandbox_tls.py)."""
from __future__ import annotations

import datetime
import pathlib

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives import hashes

from baton.tls import TlsConfigError
from sandbox_host.providers import _sandbox_tls as st
from tests.tls.pki import CA


@pytest.fixture
def ca(tmp_path: pathlib.Path) -> CA:
    return CA(tmp_path, "sandboxes")


def test_unset_means_plaintext() -> None:
    assert st.from_env({}) is None
    assert st.from_env({st.CA_CERT: " ", st.CA_KEY: ""}) is None


def test_a_minted_certificate_names_its_sandbox_alone_and_chains_to_the_ca(ca: CA) -> None:
    got = st.from_env({st.CA_CERT: ca.cert, st.CA_KEY: ca.key, st.CERT_TTL: "3600"})
    assert got is not None and got.ttl == 3600
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    minted = got.mint("run-1#2", now=now)
    leaf = x509.load_pem_x509_certificate(minted.cert)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert names == [st.server_name("run-1#2")] and st.server_name("run-1#2") != st.server_name("run-1#3")
    assert st.server_name("run-1#2").endswith(".sandbox.baton.internal") and len(st.server_name("x").split(".")[0]) <= 63
    assert leaf.not_valid_after_utc - now == datetime.timedelta(seconds=3600)
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    issuer = x509.load_pem_x509_certificate(pathlib.Path(ca.cert).read_bytes())
    pub = issuer.public_key()
    assert isinstance(pub, ec.EllipticCurvePublicKey)
    pub.verify(leaf.signature, leaf.tbs_certificate_bytes, ec.ECDSA(hashes.SHA256()))
    assert minted.cert.endswith(pathlib.Path(ca.cert).read_bytes())  # the chain: leaf, then the CA
    assert b"PRIVATE KEY" in minted.key and b"PRIVATE KEY" not in minted.cert
    assert "PRIVATE" not in repr(minted) and "PRIVATE" not in repr(got)
    tls = got.client_tls("run-1#2")
    assert tls.enabled and tls.ca == got.cert and not tls.cert and tls.server_name == st.server_name("run-1#2")


def test_bad_settings_name_the_variable_never_a_key(ca: CA, tmp_path: pathlib.Path) -> None:
    with pytest.raises(TlsConfigError, match="BATON_SANDBOX_CA_KEY must be set"):
        st.from_env({st.CA_CERT: ca.cert})
    with pytest.raises(TlsConfigError, match="BATON_SANDBOX_CA_CERT: cannot read"):
        st.from_env({st.CA_CERT: str(tmp_path / "nope.pem"), st.CA_KEY: ca.key})
    leaf = ca.leaf("not-a-ca")
    with pytest.raises(TlsConfigError, match="is not a CA certificate") as err:
        st.from_env({st.CA_CERT: leaf.cert, st.CA_KEY: leaf.key})
    other = CA(tmp_path / "other", "other")
    with pytest.raises(TlsConfigError, match="is not the private key of BATON_SANDBOX_CA_CERT") as err2:
        st.from_env({st.CA_CERT: ca.cert, st.CA_KEY: other.key})
    with pytest.raises(TlsConfigError, match="BATON_SANDBOX_CERT_TTL"):
        st.from_env({st.CA_CERT: ca.cert, st.CA_KEY: ca.key, st.CERT_TTL: "0"})
    for e in (err, err2):
        assert "PRIVATE KEY" not in str(e.value) and "BEGIN" not in str(e.value)
