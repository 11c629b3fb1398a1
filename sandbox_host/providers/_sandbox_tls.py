"""TLS of the host → sandbox daemon link: an operator's sandbox CA, a certificate per sandbox.

With ``BATON_SANDBOX_CA_CERT`` and ``BATON_SANDBOX_CA_KEY`` set (PEM files), a host creating
a sandbox mints a short-lived server certificate for that sandbox's daemon alone
(:meth:`SandboxCa.mint`: a fresh P-256 key, valid ``BATON_SANDBOX_CERT_TTL`` seconds, naming
:func:`server_name` of the sandbox key) and delivers it with the sandbox's token (a Secret on
Kubernetes, files for docker and local sandboxes). Every host then dials the daemon with TLS,
checks its certificate against the sandbox CA and expects that sandbox's name
(``grpc.ssl_target_name_override``: hosts dial pod and container IPs, which no certificate
names), so a daemon whose certificate another CA signed, or another sandbox's certificate,
is refused in the handshake. The CA's key stays on the hosts; a sandbox holds only its own
certificate and key (its agent can read them, as it can its daemon's token: they open
nothing but the sandbox it is in).

Without the two settings nothing changes: the daemon link is plaintext with the sandbox's
token (confined by the NetworkPolicy on Kubernetes). Errors name the variable and the path,
never a key's bytes; keys are excluded from ``repr``.
"""
from __future__ import annotations

import datetime
import hashlib
import io
import os
import tarfile
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from baton import config
from baton import tls as _tls
from sandbox_host.providers._base import SandboxHandle

if TYPE_CHECKING:
    from sandbox_host.providers._daemon_client import DaemonClient

CA_CERT, CA_KEY, CERT_TTL = "BATON_SANDBOX_CA_CERT", "BATON_SANDBOX_CA_KEY", "BATON_SANDBOX_CERT_TTL"
#: The domain of every sandbox daemon's certificate name (never resolved: only compared).
DOMAIN = "sandbox.baton.internal"


def server_name(key: str) -> str:
    """The DNS name in sandbox ``key``'s daemon certificate, which hosts expect: ``s-<32 hex of
    the key's SHA-256>.sandbox.baton.internal`` (pure)."""
    return f"s-{hashlib.sha256(key.encode()).hexdigest()[:32]}.{DOMAIN}"


def client_tls(ca_cert: bytes, key: str) -> _tls.GrpcTls:
    """How a host dials sandbox ``key``'s daemon: TLS against ``ca_cert``, expecting
    :func:`server_name` of the key, no client certificate (the token authenticates hosts)."""
    return _tls.GrpcTls(enabled=True, ca=ca_cert, server_name=server_name(key))


@dataclass(frozen=True)
class ServerCert:
    """One sandbox daemon's certificate and key (PEM), as the daemon serves them."""

    cert: bytes
    key: bytes = field(repr=False)


@dataclass(frozen=True)
class SandboxCa:
    """The operator's sandbox CA (:func:`from_env`).

    Attributes:
        cert: the CA certificate (PEM): what hosts check daemons against.
        key: the CA's private key (PEM), never logged.
        ttl: seconds a minted certificate is valid.
    """

    cert: bytes
    key: bytes = field(repr=False)
    ttl: float = 7 * 24 * 3600.0

    def client_tls(self, key: str) -> _tls.GrpcTls:
        """:func:`client_tls` with this CA."""
        return client_tls(self.cert, key)

    def mint(self, key: str, *, now: datetime.datetime | None = None) -> ServerCert:
        """A server certificate for sandbox ``key``'s daemon, signed by this CA (CPU-bound:
        a few milliseconds; call it in a thread from a loop).

        Raises:
            baton.tls.TlsConfigError: the CA's key cannot sign (naming ``BATON_SANDBOX_CA_KEY``).
        """
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        ca_cert = x509.load_pem_x509_certificate(self.cert)
        ca_key = serialization.load_pem_private_key(self.key, password=None)
        leaf_key = ec.generate_private_key(ec.SECP256R1())
        now = now or datetime.datetime.now(datetime.timezone.utc)
        name = server_name(key)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject)
            .public_key(leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(seconds=self.ttl))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        )
        try:
            leaf = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise _tls.TlsConfigError(f"{CA_KEY}: the key cannot sign certificates") from None
        return ServerCert(
            leaf.public_bytes(serialization.Encoding.PEM) + self.cert,
            leaf_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))


def tls_for(handle: SandboxHandle, ca: SandboxCa | None) -> _tls.GrpcTls:
    """How a host dials the handle's daemon: TLS against ``ca`` when the sandbox was created
    with one (``handle.data["daemon_tls"]``), else plaintext. Never plaintext to a daemon
    that serves TLS.

    Raises:
        DaemonUnreachable: the daemon serves TLS and this host has no sandbox CA.
    """
    from sandbox_host.providers._daemon_client import DaemonUnreachable

    if not handle.data.get("daemon_tls"):
        return _tls.PLAINTEXT
    if ca is None:
        raise DaemonUnreachable(f"the daemon of sandbox {handle.key} serves TLS, but this host has no {CA_CERT}: "
                                "give every host the same sandbox CA")
    return ca.client_tls(handle.key)


#: A certificate is renewed once less than this share of its TTL is left.
RENEW_LEFT = 1 / 3


def renewal_due(not_after: float, now: float, ttl: float) -> bool:
    """Whether a daemon's certificate expiring at ``not_after`` (Unix seconds; 0: the daemon
    serves no TLS) is renewed at ``now``: less than :data:`RENEW_LEFT` of ``ttl`` is left (pure)."""
    return not_after > 0 and not_after - now <= ttl * RENEW_LEFT


def check_every(ttl: float) -> float:
    """Seconds between looks at whether a sandbox's certificate is due: a sixth of the TTL
    (so a renewal is tried about twice before the last third runs out), within 0.5 s–5 min (pure)."""
    return max(0.5, min(ttl / 6, 300.0))


async def renew_if_due(client: "DaemonClient", ca: SandboxCa, key: str) -> float | None:
    """Renew sandbox ``key``'s daemon certificate through ``client`` when it is due
    (:func:`renewal_due`): a new one minted by ``ca``, served from the daemon's next handshake
    on, open connections untouched.

    Returns:
        The new certificate's expiry (Unix seconds), or ``None`` when none was due.

    Raises:
        OSError: the daemon could not be reached (``DaemonUnreachable``, ``SandboxGone``).
        ValueError: the daemon refused the certificate.
    """
    import asyncio

    status = await client.status()
    if not renewal_due(status.cert_not_after, time.time(), ca.ttl):
        return None
    server = await asyncio.to_thread(ca.mint, key)
    return await client.renew_certificate(server.cert, server.key)


def files_tar(directory: str, server: ServerCert) -> bytes:
    """An uncompressed tar of ``<directory>/tls.crt`` (0444) and ``tls.key`` (0400), root's,
    for ``put_archive`` at ``/``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data, mode in (("tls.crt", server.cert, 0o444), ("tls.key", server.key, 0o400)):
            info = tarfile.TarInfo(f"{directory.strip('/')}/{name}")
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_files(directory: str, server: ServerCert) -> tuple[str, str]:
    """Write ``daemon-tls.crt`` and ``daemon-tls.key`` (0600) into ``directory`` (blocking);
    their paths. Replaces earlier ones whole (written aside, then renamed)."""
    paths = []
    for name, data in (("daemon-tls.crt", server.cert), ("daemon-tls.key", server.key)):
        path = os.path.join(directory, name)
        tmp = f"{path}.tmp-{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        paths.append(path)
    return paths[0], paths[1]


def from_env(env: Mapping[str, str] | None = None) -> SandboxCa | None:
    """The sandbox CA from ``BATON_SANDBOX_CA_CERT``/``_KEY``; ``None`` when neither is set.

    Raises:
        baton.tls.TlsConfigError: one without the other, a file unreadable or not PEM of
            its kind, a key that is not the certificate's, a certificate that is no CA, or a
            malformed ``BATON_SANDBOX_CERT_TTL``; naming the variable and path only.
    """
    env = os.environ if env is None else env
    cert, key = _tls.read_pair(CA_CERT, CA_KEY, env)
    if not cert:
        return None
    try:
        ttl = config.get_float(CERT_TTL, env)
    except ValueError as exc:
        raise _tls.TlsConfigError(str(exc)) from None
    if ttl <= 0:
        raise _tls.TlsConfigError(f"{CERT_TTL} must be positive")
    from cryptography import x509

    try:
        ca = x509.load_pem_x509_certificate(cert)
        constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    except (ValueError, x509.ExtensionNotFound):
        raise _tls.TlsConfigError(f"{CA_CERT} ({env[CA_CERT].strip()}) is not a CA certificate") from None
    if not constraints.ca:
        raise _tls.TlsConfigError(f"{CA_CERT} ({env[CA_CERT].strip()}) is not a CA certificate")
    return SandboxCa(cert, key, ttl)


__all__ = ["CA_CERT", "CA_KEY", "CERT_TTL", "RENEW_LEFT", "SandboxCa", "ServerCert", "check_every", "client_tls",
           "files_tar", "from_env", "renew_if_due", "renewal_due", "server_name", "tls_for", "write_files"]
