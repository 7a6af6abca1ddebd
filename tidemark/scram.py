"""SCRAM-SHA-256 verifiers (RFC 5802, RFC 7677): what is kept of a password so that a client
can prove it knows the password without the server keeping it."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from tidemark.v1 import catalog_pb2

ITERATIONS = 4096


@dataclass(frozen=True)
class ScramVerifier:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def from_password(cls, password: str, salt: bytes | None = None) -> ScramVerifier:
        salt = salt if salt is not None else secrets.token_bytes(16)
        salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, ITERATIONS)
        client_key = _hmac(salted, b"Client Key")
        return cls(
            salt,
            ITERATIONS,
            hashlib.sha256(client_key).digest(),
            _hmac(salted, b"Server Key"),
        )

    def to_proto(self) -> catalog_pb2.ScramVerifier:
        return catalog_pb2.ScramVerifier(
            salt=self.salt,
            iterations=self.iterations,
            stored_key=self.stored_key,
            server_key=self.server_key,
        )

    @classmethod
    def from_proto(cls, proto: catalog_pb2.ScramVerifier) -> ScramVerifier:
        return cls(proto.salt, proto.iterations, proto.stored_key, proto.server_key)

    def matches(self, password: str) -> bool:
        """Whether ``password`` is the one this verifier was made from (for clients that send
        the password itself, as gRPC callers do in their call metadata)."""
        salted = hashlib.pbkdf2_hmac("sha256", password.encode(), self.salt, self.iterations)
        stored_key = hashlib.sha256(_hmac(salted, b"Client Key")).digest()
        return hmac.compare_digest(stored_key, self.stored_key)


def _hmac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()
