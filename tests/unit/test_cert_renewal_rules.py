"""Renewing a sandbox daemon's certificate in place: when it falls due
(sandbox_host/providers/_sandbox_tls.py), and what the daemon refuses to serve
(sandbox_host/daemon/_certs.py); errors without key material."""
from __future__ import annotations

import datetime
import os
import pathlib

import pytest

from baton.tls import GrpcTls
from sandbox_host.daemon import _certs
from sandbox_host.providers import _sandbox_tls as st
from tests.tls.pki import CA


def test_due_in_the_last_third_of_its_ttl() -> None:
    assert not st.renewal_due(0.0, 1000.0, 30.0)  # no TLS
    assert not st.renewal_due(1030.0, 1000.0, 30.0)
    assert not st.renewal_due(1010.5, 1000.0, 30.0)
    assert st.renewal_due(1010.0, 1000.0, 30.0)
    assert st.renewal_due(990.0, 1000.0, 30.0)  # expired already: still renewed
    assert st.check_every(30.0) == 5.0
    assert st.check_every(1.0) == 0.5 and st.check_every(7 * 24 * 3600.0) == 300.0


@pytest.fixture
def minted(tmp_path: pathlib.Path) -> tuple[st.SandboxCa, GrpcTls]:
    ca = CA(tmp_path, "sandboxes")
    got = st.from_env({st.CA_CERT: ca.cert, st.CA_KEY: ca.key, st.CERT_TTL: "60"})
    assert got is not None
    first = got.mint("run-1")
    return got, GrpcTls(enabled=True, cert=first.cert, key=first.key)


def test_a_renewal_is_served_from_the_next_handshake_and_kept(tmp_path: pathlib.Path,
                                                              minted: tuple[st.SandboxCa, GrpcTls]) -> None:
    ca, served = minted
    certs = _certs.ServedCert(served, str(tmp_path))
    assert certs.name == st.server_name("run-1") and certs.fetch() is None
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=30)
    new = ca.mint("run-1", now=later)
    not_after = certs.renew(new.cert, new.key)
    assert not_after > _certs.inspect(served.cert, served.key)[1] and certs.not_after == not_after
    assert certs.fetch() is not None and certs.fetch() is None  # handed to grpc once
    assert oct(os.stat(tmp_path / _certs.RENEWED_KEY).st_mode & 0o777) == "0o600"
    # A restarted daemon serves the renewed one (it lasts longer than its BATON_TLS_* files').
    assert _certs.ServedCert(served, str(tmp_path)).not_after == not_after


def test_what_a_daemon_refuses_to_serve(tmp_path: pathlib.Path, minted: tuple[st.SandboxCa, GrpcTls]) -> None:
    ca, served = minted
    certs = _certs.ServedCert(served, str(tmp_path))
    other = ca.mint("run-2")
    past = ca.mint("run-1", now=datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1))
    for cert, key, why in ((b"junk", served.key, "not a PEM"), (other.cert, served.key, "not the certificate's"),
                           (other.cert, other.key, "names"), (past.cert, past.key, "expired")):
        with pytest.raises(_certs.CertRefused) as err:
            certs.renew(cert, key)
        assert why in str(err.value) and "PRIVATE KEY" not in str(err.value)
    assert not (tmp_path / _certs.RENEWED_CERT).exists() and certs.fetch() is None
