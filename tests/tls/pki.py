"""A certificate authority made at test time: a CA and leaf certificates (PEM files).

EC P-256 keys (milliseconds to make). Leaves name ``127.0.0.1`` and ``localhost`` and serve
as both server and client certificates, as one certificate per service does in a cluster.
"""
from __future__ import annotations

import datetime
import ipaddress
import pathlib
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Leaf:
    cert: str  # path of the certificate (PEM)
    key: str  # path of its private key (PEM)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: pathlib.Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


class CA:
    """A CA under ``directory`` (``<name>-ca.pem``); :meth:`leaf` issues certificates."""

    def __init__(self, directory: pathlib.Path, name: str) -> None:
        self.dir = directory
        self.name = name
        directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        self._cert = (
            x509.CertificateBuilder().subject_name(_name(f"{name} CA")).issuer_name(_name(f"{name} CA"))
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(self._key, hashes.SHA256()))
        self.cert = str(directory / f"{name}-ca.pem")
        pathlib.Path(self.cert).write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))
        #: The CA's own key (PEM): for settings that sign with the CA (BATON_SANDBOX_CA_KEY).
        self.key = str(directory / f"{name}-ca-key.pem")
        _write_key(self._key, pathlib.Path(self.key))

    def leaf(self, cn: str, names: tuple[str, ...] = ("localhost",),
             ips: tuple[str, ...] = ("127.0.0.1",)) -> Leaf:
        """A certificate for ``cn`` (server and client use) with those DNS names and IPs."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        cert = (
            x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(self._cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256()))
        stem = self.dir / f"{self.name}-{cn}"
        pathlib.Path(f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, pathlib.Path(f"{stem}-key.pem"))
        return Leaf(f"{stem}.pem", f"{stem}-key.pem")
