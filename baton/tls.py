"""TLS on the cluster's gRPC links: this process's certificate, the CA, client certificates.

One setting group for every internal link (coordinator, sandbox hosts, and their callers):

- ``BATON_TLS_CERT`` / ``BATON_TLS_KEY``: PEM files of this process's certificate (chain) and
  key. A coordinator or host serves TLS with them; every internal call presents them as its
  client certificate.
- ``BATON_TLS_CA``: PEM bundle that internal clients check the servers' certificates against
  and, with client auth, servers check the clients' (empty: the system's roots).
- ``BATON_TLS_CLIENT_AUTH``: ``1`` = coordinators and hosts refuse, in the handshake, a
  caller without a certificate signed by ``BATON_TLS_CA`` (mutual TLS). It authenticates
  callers as ``BATON_INTERNAL_TOKEN`` does; either or both may be set.
- ``BATON_TLS_SERVER_NAME``: the name internal clients expect in every internal server's
  certificate, when they dial addresses no certificate names (pod IPs).

Internal TLS is on when ``BATON_TLS_CERT`` or ``BATON_TLS_CA`` is set, for the whole cluster:
a service either serves and dials TLS on every internal link or on none.

Files are read when a channel or server is made (a rotated file is used by the next channel;
restart to use it everywhere); every service's ``main()`` reads them all at start-up
(:func:`baton.credentials.check_files`), so that a missing, unreadable or mismatched file
stops the process with the variable's name. Errors name the variable and the path, never a
key's bytes.
"""
from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import grpc

CERT, KEY, CA = "BATON_TLS_CERT", "BATON_TLS_KEY", "BATON_TLS_CA"
CLIENT_AUTH, SERVER_NAME = "BATON_TLS_CLIENT_AUTH", "BATON_TLS_SERVER_NAME"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


class TlsConfigError(ValueError):
    """A TLS setting is unusable; the message names the variable (and the path), no secret."""


def flag(env: Mapping[str, str], name: str) -> bool:
    """A ``1``/``0`` setting (``true``/``false``, ``yes``/``no``, ``on``/``off``; empty is off).

    Raises:
        TlsConfigError: for any other value.
    """
    v = env.get(name, "").strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise TlsConfigError(f"{name} must be 1 or 0, got {v!r}")


def read_pem(name: str, path: str, *, kind: str) -> bytes:
    """The PEM file ``path`` that setting ``name`` points at, checked to hold a ``kind``.

    Args:
        kind: ``"certificate"`` or ``"private key"`` (the PEM block it must contain).

    Raises:
        TlsConfigError: unreadable, empty or not PEM of that kind; names ``name`` and ``path``.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise TlsConfigError(f"{name}: cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    marker = b"PRIVATE KEY-----" if kind == "private key" else b"-----BEGIN CERTIFICATE-----"
    if marker not in data:
        raise TlsConfigError(f"{name}: {path} holds no PEM {kind}")
    return data


def check_pair(cert_var: str, cert: str, key_var: str, key: str) -> None:
    """Refuse a key that is not the certificate's (the handshake would fail obscurely later).

    Raises:
        TlsConfigError: naming both variables.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError:
        raise TlsConfigError(f"{key_var} ({key}) is not the private key of {cert_var} ({cert}), "
                             "or one of them is malformed") from None
    except OSError as exc:
        raise TlsConfigError(f"{cert_var}/{key_var}: cannot read {cert} or {key}: "
                             f"{exc.strerror or type(exc).__name__}") from None


def read_pair(cert_var: str, key_var: str, env: Mapping[str, str]) -> tuple[bytes, bytes]:
    """Certificate and key from two path settings: both or neither (``(b"", b"")``).

    Raises:
        TlsConfigError: one without the other, unreadable, not PEM, or not a pair.
    """
    cert, key = env.get(cert_var, "").strip(), env.get(key_var, "").strip()
    if bool(cert) != bool(key):
        missing, given = (key_var, cert_var) if cert else (cert_var, key_var)
        raise TlsConfigError(f"{missing} must be set with {given}")
    if not cert:
        return b"", b""
    cert_pem, key_pem = read_pem(cert_var, cert, kind="certificate"), read_pem(key_var, key, kind="private key")
    check_pair(cert_var, cert, key_var, key)
    return cert_pem, key_pem


@dataclass(frozen=True)
class GrpcTls:
    """TLS of one process's internal gRPC links (:func:`from_env`); the default is plaintext.

    Attributes:
        enabled: serve and dial TLS.
        cert, key: this process's certificate chain and key (PEM); empty: none (a client
            without a certificate; a server needs one).
        ca: the CA bundle (PEM) peers are checked against; empty: the system's roots.
        client_auth: servers require a client certificate signed by ``ca``.
        server_name: the name clients expect in servers' certificates (empty: the address).
    """

    enabled: bool = False
    cert: bytes = field(default=b"", repr=False)
    key: bytes = field(default=b"", repr=False)
    ca: bytes = field(default=b"", repr=False)
    client_auth: bool = False
    server_name: str = ""

    def server_credentials(self, cert_var: str = CERT) -> grpc.ServerCredentials:
        """Credentials of a TLS listener (requiring client certificates with ``client_auth``).

        Raises:
            TlsConfigError: no certificate to serve with (naming ``cert_var``).
        """
        if not self.cert:
            raise TlsConfigError(f"{cert_var} and its key are needed to serve TLS")
        return grpc.ssl_server_credentials([(self.key, self.cert)],
                                           root_certificates=self.ca if self.client_auth else None,
                                           require_client_auth=self.client_auth)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Credentials of a client channel: the CA (or the system's roots), the certificate."""
        return grpc.ssl_channel_credentials(root_certificates=self.ca or None,
                                            private_key=self.key or None, certificate_chain=self.cert or None)

    def channel_options(self, options: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """``options`` plus the expected server name, when one is set."""
        if self.enabled and self.server_name:
            return [*options, ("grpc.ssl_target_name_override", self.server_name)]
        return list(options)


PLAINTEXT = GrpcTls()


def from_env(env: Mapping[str, str] | None = None) -> GrpcTls:
    """The internal links' TLS from ``BATON_TLS_*`` (:data:`PLAINTEXT` when none is set).

    Raises:
        TlsConfigError: a file missing, unreadable or mismatched, ``BATON_TLS_CLIENT_AUTH``
            without ``BATON_TLS_CA``, or a malformed flag; naming the variable.
    """
    env = os.environ if env is None else env
    client_auth = flag(env, CLIENT_AUTH)
    cert, key = read_pair(CERT, KEY, env)
    ca_path = env.get(CA, "").strip()
    ca = read_pem(CA, ca_path, kind="certificate") if ca_path else b""
    if client_auth and not ca:
        raise TlsConfigError(f"{CLIENT_AUTH}=1 needs {CA} (the CA client certificates are checked against)")
    if client_auth and not cert:
        raise TlsConfigError(f"{CLIENT_AUTH}=1 needs {CERT} and {KEY}: every service presents its certificate")
    if not (cert or ca):
        return PLAINTEXT
    return GrpcTls(True, cert, key, ca, client_auth, env.get(SERVER_NAME, "").strip())


def mtls_required(env: Mapping[str, str]) -> bool:
    """Whether ``BATON_TLS_CLIENT_AUTH`` asks for client certificates (a malformed value is
    :func:`from_env`'s to refuse; here it counts as off)."""
    try:
        return flag(env, CLIENT_AUTH)
    except TlsConfigError:
        return False


def add_port(server: grpc.aio.Server, listen: str, tls: GrpcTls, cert_var: str = CERT) -> int:
    """Bind ``listen`` on ``server``: TLS with ``tls`` when enabled, else plaintext.

    Returns:
        The bound port (0 when it could not bind, as grpc's own ``add_*_port``).
    """
    if tls.enabled:
        return server.add_secure_port(listen, tls.server_credentials(cert_var))
    return server.add_insecure_port(listen)


def aio_channel(address: str, options: Sequence[tuple[str, Any]], tls: GrpcTls) -> grpc.aio.Channel:
    """An asyncio channel to ``address``: TLS with ``tls`` when enabled, else plaintext."""
    if tls.enabled:
        return grpc.aio.secure_channel(address, tls.channel_credentials(), options=tls.channel_options(options))
    return grpc.aio.insecure_channel(address, options=list(options))


def sync_channel(address: str, options: Sequence[tuple[str, Any]], tls: GrpcTls) -> grpc.Channel:
    """A blocking channel to ``address``: TLS with ``tls`` when enabled, else plaintext."""
    if tls.enabled:
        return grpc.secure_channel(address, tls.channel_credentials(), options=tls.channel_options(options))
    return grpc.insecure_channel(address, options=list(options))


def client_ssl_context(ca: str = "", cert: str = "", key: str = "", *, names: tuple[str, str, str]
                       ) -> ssl.SSLContext:
    """An ``ssl`` client context: verifies the server against ``ca`` (else the system's
    roots), presents ``cert``/``key`` when given. ``names`` are the variables of the three
    paths, for the errors.

    Raises:
        TlsConfigError: a file missing or unusable, naming its variable.
    """
    ca_var, cert_var, key_var = names
    ctx = ssl.create_default_context()
    if ca:
        read_pem(ca_var, ca, kind="certificate")
        try:
            ctx.load_verify_locations(cafile=ca)
        except (ssl.SSLError, OSError):
            raise TlsConfigError(f"{ca_var}: {ca} is not a usable CA bundle") from None
    if bool(cert) != bool(key):
        missing, given = (key_var, cert_var) if cert else (cert_var, key_var)
        raise TlsConfigError(f"{missing} must be set with {given}")
    if cert:
        read_pem(cert_var, cert, kind="certificate")
        read_pem(key_var, key, kind="private key")
        check_pair(cert_var, cert, key_var, key)
        ctx.load_cert_chain(cert, key)
    return ctx

