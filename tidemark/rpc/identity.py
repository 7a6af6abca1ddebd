"""Service identity: who is calling, from the SAN URI of the peer's client certificate.

With mTLS on (see :mod:`tidemark.rpc.tls`) every caller presents a certificate signed by the
deployment's CA, and its identity is the certificate's ``tidemark://`` URI:

- ``tidemark://adapter``, ``tidemark://catalog``, ``tidemark://oracle``,
  ``tidemark://storage``, ``tidemark://sources``: the shared services;
- ``tidemark://compute/<tenant>/<cluster>``: a compute cluster serving one tenant (a database);
- ``tidemark://client/<name>``: a tool.

The server's authorization interceptor (:mod:`tidemark.rpc.authorization`) puts the caller's
identity in :func:`current_caller` for the duration of each call, so service code can make
decisions that depend on the data (storage's per-collection tenant and writer).
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import grpc.aio
from cryptography import x509

SCHEME = "tidemark://"
SERVICE_KINDS = ("adapter", "catalog", "oracle", "storage", "sources")
COMPUTE = "compute"
CLIENT = "client"
KINDS = (*SERVICE_KINDS, COMPUTE, CLIENT)


@dataclass(frozen=True)
class Identity:
    """A caller: its ``kind`` (``adapter``, ``compute``, ``client``, ...), and for compute
    the ``tenant`` (database) and ``cluster`` it serves, for a client its ``name``."""

    kind: str
    tenant: str = ""
    cluster: str = ""
    name: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown identity kind {self.kind!r}")
        if self.kind == COMPUTE and not (self.tenant and self.cluster):
            raise ValueError("a compute identity names its tenant and its cluster")
        if self.kind == CLIENT and not self.name:
            raise ValueError("a client identity names the client")
        for part in (self.tenant, self.cluster, self.name):
            if "/" in part:
                raise ValueError(f"identity part {part!r} contains '/'")

    @property
    def uri(self) -> str:
        if self.kind == COMPUTE:
            return f"{SCHEME}compute/{self.tenant}/{self.cluster}"
        if self.kind == CLIENT:
            return f"{SCHEME}client/{self.name}"
        return SCHEME + self.kind

    def __str__(self) -> str:
        return self.uri

    @classmethod
    def parse(cls, uri: str) -> Identity:
        """The identity a ``tidemark://`` URI names; ValueError if it names none."""
        if not uri.startswith(SCHEME):
            raise ValueError(f"{uri!r} is not a tidemark:// identity")
        parts = uri[len(SCHEME) :].split("/")
        kind = parts[0]
        if kind == COMPUTE and len(parts) == 3:
            return cls(kind, tenant=parts[1], cluster=parts[2])
        if kind == CLIENT and len(parts) == 2:
            return cls(kind, name=parts[1])
        if kind in SERVICE_KINDS and len(parts) == 1:
            return cls(kind)
        raise ValueError(f"{uri!r} is not a tidemark:// identity")


def compute_identity(tenant: str, cluster: str) -> Identity:
    return Identity(COMPUTE, tenant=tenant, cluster=cluster)


@lru_cache(maxsize=256)
def identity_of_certificate(pem: bytes) -> Identity | None:
    """The identity named by the first ``tidemark://`` SAN URI of a PEM certificate (the
    certificate was verified by the TLS handshake already), or ``None``."""
    try:
        certificate = x509.load_pem_x509_certificate(pem)
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except (ValueError, x509.ExtensionNotFound):
        return None
    for uri in names.value.get_values_for_type(x509.UniformResourceIdentifier):
        if uri.startswith(SCHEME):
            try:
                return Identity.parse(uri)
            except ValueError:
                return None
    return None


def peer_identity(context: grpc.aio.ServicerContext[Any, Any]) -> Identity | None:
    """The identity in the calling peer's verified client certificate; ``None`` when the
    connection is plaintext, the peer presented no certificate, or it names no identity."""
    certificates = list(context.auth_context().get("x509_pem_cert", ()))
    if not certificates:
        return None
    return identity_of_certificate(bytes(certificates[0]))


_CALLER: contextvars.ContextVar[Identity | None] = contextvars.ContextVar(
    "tidemark_caller", default=None
)


def current_caller() -> Identity | None:
    """The identity of the caller of the call being handled, when the server checks
    identities (mTLS on); ``None`` otherwise, and then nothing is to be checked."""
    return _CALLER.get()


def set_caller(identity: Identity | None) -> contextvars.Token[Identity | None]:
    return _CALLER.set(identity)


def reset_caller(token: contextvars.Token[Identity | None]) -> None:
    _CALLER.reset(token)
