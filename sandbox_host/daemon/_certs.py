"""The TLS certificate a sandbox daemon serves, renewable in place (the daemon's TLS adapter).

The daemon starts serving the certificate of its ``BATON_TLS_*`` files (a sandbox's own,
minted by the host that created it with ``BATON_SANDBOX_CERT_TTL``), or the renewed one kept
in its state directory when that one lasts longer (a daemon restarted after a renewal). A
host renews it before it expires (``RenewCertificate``): the next handshake uses the new one
(grpc's dynamic server credentials ask :meth:`ServedCert.fetch` before each new connection),
and open connections, a journal follow among them, are not touched: a TLS session is
checked at its handshake only. Keys never reach a log or an error.
"""
from __future__ import annotations

import os
import threading
import time

import grpc

from baton import tls as _tls

#: The renewed certificate and key, in the daemon's state directory (0600).
RENEWED_CERT, RENEWED_KEY = "tls-renewed.crt", "tls-renewed.key"


class CertRefused(ValueError):
    """A certificate the daemon will not serve (the reason holds no key material)."""


def inspect(cert: bytes, key: bytes) -> tuple[str, float]:
    """The server name (the leaf's common name, ``""`` when none) and expiry (Unix seconds)
    of a PEM chain and its key.

    With the standard library's ``ssl`` alone (a docker sandbox's daemon runs with grpc and
    protobuf only): the pair is loaded as a server's would be, through two private temporary
    files (0600), and the leaf decoded by ``ssl``'s own decoder. Blocking (file I/O).

    Raises:
        CertRefused: not PEM, or the key is not the leaf's.
    """
    import ssl
    import tempfile

    with tempfile.TemporaryDirectory(prefix="baton-cert-") as tmp:
        paths = os.path.join(tmp, "c.pem"), os.path.join(tmp, "k.pem")
        for path, data in zip(paths, (cert, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(*paths)
        except ssl.SSLError as exc:
            why = "the key is not the certificate's" if "KEY_VALUES_MISMATCH" in str(exc) else \
                "not a PEM certificate chain and private key"
            raise CertRefused(why) from None
        # The decoder ssl's own tests use (stable since Python 3.2): no third-party parser.
        leaf = ssl._ssl._test_decode_cert(paths[0])  # type: ignore[attr-defined]
    names = [v for rdn in leaf.get("subject", ()) for k, v in rdn if k == "commonName"]
    return (str(names[0]) if names else ""), float(ssl.cert_time_to_seconds(leaf["notAfter"]))


class ServedCert:
    """The certificate a daemon serves and its renewals.

    Args:
        served: the daemon's TLS settings (``BATON_TLS_*``, enabled, with a certificate).
        state_dir: where a renewed certificate is kept.
    """

    def __init__(self, served: _tls.GrpcTls, state_dir: str) -> None:
        self._tls = served
        self._dir = state_dir
        self._lock = threading.Lock()
        self._pending: grpc.ServerCertificateConfiguration | None = None
        pair = served.cert, served.key
        self.name, self.not_after = inspect(*pair)
        renewed = self._renewed()
        if renewed is not None:
            try:
                name, not_after = inspect(*renewed)
            except CertRefused:
                name, not_after = "", 0.0
            if name == self.name and not_after > self.not_after:
                pair, self.not_after = renewed, not_after
        self._initial = self._config(*pair)

    def _renewed(self) -> tuple[bytes, bytes] | None:
        try:
            with open(os.path.join(self._dir, RENEWED_CERT), "rb") as c, \
                    open(os.path.join(self._dir, RENEWED_KEY), "rb") as k:
                return c.read(), k.read()
        except FileNotFoundError:
            return None

    def _config(self, cert: bytes, key: bytes) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(key, cert)], root_certificates=self._tls.ca if self._tls.client_auth else None)

    def credentials(self) -> grpc.ServerCredentials:
        """The listener's credentials: this certificate, replaced by each renewal."""
        # The stubs want a fetcher that always answers; grpc's own contract is "None: no change".
        return grpc.dynamic_ssl_server_credentials(self._initial, self.fetch,  # type: ignore[arg-type]
                                                   require_client_authentication=self._tls.client_auth)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """The renewed certificate, once, else ``None`` (no change). grpc calls it before
        every new connection's handshake, from its own thread."""
        with self._lock:
            pending, self._pending = self._pending, None
        return pending

    def renew(self, cert: bytes, key: bytes) -> float:
        """Serve ``cert`` (PEM chain, leaf first) with ``key`` from the next handshake on, and
        keep it for a restarted daemon (blocking: two small file writes).

        Returns:
            Its expiry (Unix seconds).

        Raises:
            CertRefused: not PEM, the key is not its own, it names another server than the
                one served, or it has expired.
        """
        name, not_after = inspect(cert, key)
        if name != self.name:
            raise CertRefused(f"it names {name[:100]!r}, the daemon serves {self.name[:100]!r}")
        if not_after <= time.time():
            raise CertRefused("it has expired")
        # The key first, then the certificate, each written aside and renamed: a restart
        # between the two finds a new key without its certificate, which does not match
        # and is ignored (the original is served).
        for name_, data in ((RENEWED_KEY, key), (RENEWED_CERT, cert)):
            path = os.path.join(self._dir, name_)
            tmp = f"{path}.tmp-{os.getpid()}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        config = self._config(cert, key)
        with self._lock:
            self._pending, self.not_after = config, not_after
        return not_after


__all__ = ["CertRefused", "RENEWED_CERT", "RENEWED_KEY", "ServedCert", "inspect"]
