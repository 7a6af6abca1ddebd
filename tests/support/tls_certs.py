"""Throwaway certificates for TLS tests: a CA, and certificates it signs for loopback servers
(``localhost``, ``127.0.0.1``) and for clients, written as PEM files.

::

    certs = CertificateSet.create(tmp_path)
    certs.ca_file, certs.server.cert, certs.server.key, certs.client.cert, certs.client.key
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class CertificateSet:
    ca_file: Path
    server: KeyPair
    client: KeyPair

    @classmethod
    def create(cls, directory: Path, name: str = "test") -> CertificateSet:
        """A new CA named ``name`` and a server and a client certificate it signed."""
        directory.mkdir(parents=True, exist_ok=True)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
        now = datetime.datetime.now(datetime.UTC)
        ca = (
            _builder(ca_name, ca_name, ca_key.public_key(), now)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(ca_key, hashes.SHA256())
        )
        ca_file = directory / f"{name}-ca.crt"
        ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))

        def issue(stem: str, usage: x509.ObjectIdentifier) -> KeyPair:
            key = ec.generate_private_key(ec.SECP256R1())
            subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, stem)])
            names = x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            )
            certificate = (
                _builder(subject, ca_name, key.public_key(), now)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(names, critical=False)
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                .sign(ca_key, hashes.SHA256())
            )
            pair = KeyPair(directory / f"{name}-{stem}.crt", directory / f"{name}-{stem}.key")
            pair.cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
            pair.key.write_bytes(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
            pair.key.chmod(0o600)
            return pair

        return cls(
            ca_file,
            issue("server", ExtendedKeyUsageOID.SERVER_AUTH),
            issue("client", ExtendedKeyUsageOID.CLIENT_AUTH),
        )


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePublicKey, now: datetime.datetime
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _DAY)
        .not_valid_after(now + 30 * _DAY)
    )
