"""TLS for gRPC: a service's certificate, key and CA, as server and channel credentials.

With all three files given, a server serves TLS and requires every client to present a
certificate signed by the CA (mTLS), and the service's own channels present its certificate
and verify the server against the CA. Without them everything is plaintext, as in the embedded
default. The files are read when the server or channel is made, so a restart picks up renewed
certificates.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc


@dataclass(frozen=True)
class TlsSettings:
    """PEM file paths. ``require_client_auth=False`` serves TLS without asking for client
    certificates (the adapter's SQL-facing port, whose users authenticate by password)."""

    cert: str
    key: str
    ca: str
    require_client_auth: bool = True

    @classmethod
    def from_paths(
        cls, cert: str, key: str, ca: str, *, require_client_auth: bool = True
    ) -> TlsSettings | None:
        """The settings, or ``None`` when no path is given (plaintext); ValueError when only
        some are: half a TLS setup must not quietly run in plaintext."""
        given = [bool(cert), bool(key), bool(ca)]
        if not any(given):
            return None
        if not all(given):
            raise ValueError("TLS needs --tls-cert, --tls-key and --tls-ca together")
        return cls(cert, key, ca, require_client_auth)

    @property
    def mode(self) -> str:
        """``mtls`` or ``tls``, as logs show it."""
        return "mtls" if self.require_client_auth else "tls"

    def server_credentials(self) -> grpc.ServerCredentials:
        cert, key = Path(self.cert).read_bytes(), Path(self.key).read_bytes()
        ca = Path(self.ca).read_bytes()
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=ca, require_client_auth=self.require_client_auth
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Verifies the server against the CA and presents the certificate, if there is one
        (a SQL client of an adapter that does not require one may have none)."""
        ca = Path(self.ca).read_bytes()
        if not self.cert:
            return grpc.ssl_channel_credentials(root_certificates=ca)
        cert, key = Path(self.cert).read_bytes(), Path(self.key).read_bytes()
        return grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=key, certificate_chain=cert
        )
