"""A local certificate authority and one certificate per service identity, for mTLS.

``tidemark certs DIR`` writes ``ca.crt``/``ca.key`` and ``<name>.crt``/``<name>.key`` for each
identity. A service's identity is its certificate's SAN URI (``tidemark://storage``,
``tidemark://compute/<tenant>/<cluster>``, ``tidemark://client/<name>``; see
:mod:`tidemark.rpc.identity`); the certificate also names ``localhost``, ``127.0.0.1`` and the
Kubernetes service names, so it serves as a server certificate wherever the service runs.

An existing CA in ``DIR`` is reused, so certificates for a new tenant's cluster can be added
later and still verify against the CA the other services trust.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tidemark.rpc.identity import SERVICE_KINDS, Identity

CA_NAME = "ca"
VALIDITY = datetime.timedelta(days=825)
# Kubernetes service names are tried in the namespaces of deploy/k8s.
K8S_SUFFIXES = ("", ".tidemark", ".tidemark.svc", ".tidemark.svc.cluster.local")


def default_identities() -> list[Identity]:
    """What ``tidemark up --tls`` needs: every service, the ``default`` cluster of the
    database ``tidemark``, and a client certificate for the command-line tools."""
    return [
        *(Identity(kind) for kind in SERVICE_KINDS),
        Identity("compute", tenant="tidemark", cluster="default"),
        Identity("client", name="cli"),
    ]


def file_stem(identity: Identity) -> str:
    """``storage``, ``compute-<tenant>-<cluster>``, ``client-<name>``: the files' name."""
    return "-".join(
        part for part in (identity.kind, identity.tenant, identity.cluster, identity.name) if part
    )


def dns_names(identity: Identity) -> list[str]:
    """The host names a service with ``identity`` answers to."""
    services = [identity.kind]
    if identity.kind == "compute" and identity.cluster:
        services.append(f"compute-{identity.cluster}")
    return ["localhost", *(s + suffix for s in services for suffix in K8S_SUFFIXES)]


@dataclass(frozen=True)
class Authority:
    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_private(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # Created owner-only, never readable by others even for a moment.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _write_certificate(path: Path, certificate: x509.Certificate) -> None:
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))


def load_or_create_authority(directory: Path) -> Authority:
    """The CA in ``directory`` (``ca.crt``, ``ca.key``), made first if missing."""
    cert_path, key_path = directory / f"{CA_NAME}.crt", directory / f"{CA_NAME}.key"
    if cert_path.exists() and key_path.exists():
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_path} is not an EC private key")
        return Authority(key, x509.load_pem_x509_certificate(cert_path.read_bytes()))
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Tidemark local CA")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    _write_private(key_path, key)
    _write_certificate(cert_path, certificate)
    return Authority(key, certificate)


def issue(
    authority: Authority, identity: Identity, extra_dns: Sequence[str] = ()
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A key and a certificate for ``identity``, signed by ``authority``: usable both as a
    server and as a client certificate, as every service is both. ``extra_dns``: host names
    it answers to besides its own (:func:`dns_names`)."""
    key = _new_key()
    now = datetime.datetime.now(datetime.UTC)
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(identity.uri)]
    hosts = dict.fromkeys([*dns_names(identity), *extra_dns])
    names += [x509.DNSName(name) for name in hosts]
    names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity.uri)]))
        .issuer_name(authority.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(authority.key.public_key()),
            critical=False,
        )
        .sign(authority.key, hashes.SHA256())
    )
    return key, certificate


def write_certificates(
    directory: Path, identities: Sequence[Identity], *, extra_dns: Sequence[str] = ()
) -> list[Path]:
    """The CA (reused if ``directory`` has one) and a fresh key and certificate for each
    identity (naming the ``extra_dns`` host names too); returns the certificate files
    written."""
    authority = load_or_create_authority(directory)
    written = []
    for identity in identities:
        key, certificate = issue(authority, identity, extra_dns)
        stem = file_stem(identity)
        _write_private(directory / f"{stem}.key", key)
        _write_certificate(directory / f"{stem}.crt", certificate)
        written.append(directory / f"{stem}.crt")
    return written
