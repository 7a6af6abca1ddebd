"""Certificates for tests of mTLS: a CA and certificates for the services, two tenants'
compute clusters and a tool, written once per test session by ``tidemark certs``'s code."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tidemark.rpc.identity import Identity, compute_identity
from tidemark.rpc.tls import TlsSettings
from tidemark.security.certs import default_identities, file_stem, write_certificates

TENANT_A = compute_identity("tenant_a", "c1")
TENANT_A_OTHER = compute_identity("tenant_a", "c2")
TENANT_B = compute_identity("tenant_b", "c1")
TOOL = Identity("client", name="tests")


@dataclass(frozen=True)
class CertDir:
    directory: Path

    def tls(self, identity: Identity) -> TlsSettings:
        stem = self.directory / file_stem(identity)
        return TlsSettings(f"{stem}.crt", f"{stem}.key", str(self.directory / "ca.crt"))

    def flags(self, identity: Identity) -> list[str]:
        """A service's flags to serve and call with ``identity``'s certificate."""
        tls = self.tls(identity)
        return ["--tls-cert", tls.cert, "--tls-key", tls.key, "--tls-ca", tls.ca]


def make_certs(directory: Path) -> CertDir:
    write_certificates(directory, [*default_identities(), TENANT_A, TENANT_A_OTHER, TENANT_B, TOOL])
    return CertDir(directory)
