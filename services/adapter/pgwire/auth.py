"""Who may connect: trust for loopback clients unless passwords are required (a password file
is configured, or the adapter runs ``auth = password``), else SCRAM-SHA-256 (RFC 5802,
RFC 7677). A trusted client still needs a role that exists and may log in.

Credentials come from ``RoleStore``s: the catalog's roles (``CREATE ROLE name LOGIN PASSWORD
'...'``, kept as SCRAM verifiers) and, to bootstrap a deployment, a ``PasswordFile``
(``user:password`` lines, turned into verifiers as they are read, so no password is kept).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from services.adapter.authentication import Principal
from tidemark.catalog_items import role_named
from tidemark.scram import ScramVerifier
from tidemark.v1 import catalog_pb2

MECHANISM = "SCRAM-SHA-256"
INVALID_PASSWORD = "28P01"
INVALID_AUTHORIZATION = "28000"


class AuthFailed(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _hmac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


class RoleStore(Protocol):
    def verifier(self, user: str) -> ScramVerifier | None:
        """The user's SCRAM verifier, or ``None`` when the user may not log in."""


class FirstOf:
    """Several role stores asked in turn: the first that knows the user answers."""

    def __init__(self, *stores: RoleStore) -> None:
        self.stores = stores

    def verifier(self, user: str) -> ScramVerifier | None:
        for store in self.stores:
            found = store.verifier(user)
            if found is not None:
                return found
        return None


class CatalogRoles:
    """The catalog's roles (CREATE ROLE ... LOGIN PASSWORD '...'), as the adapter's copy of
    the catalog has them now."""

    def __init__(self, items: Callable[[], Iterable[catalog_pb2.CatalogItem]]) -> None:
        self.items = items

    def verifier(self, user: str) -> ScramVerifier | None:
        role = role_named(self.items(), user)
        if role is None or not role.role.login or not role.role.HasField("password"):
            return None
        return ScramVerifier.from_proto(role.role.password)


class PasswordFile:
    """``user:password`` lines (blank lines and ``#`` comments skipped)."""

    def __init__(self, verifiers: dict[str, ScramVerifier]) -> None:
        self._verifiers = verifiers

    @classmethod
    def read(cls, path: Path) -> PasswordFile:
        verifiers: dict[str, ScramVerifier] = {}
        for number, line in enumerate(path.read_text().splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            user, sep, password = line.partition(":")
            if not sep or not user:
                raise ValueError(f"{path}:{number}: expected user:password")
            verifiers[user] = ScramVerifier.from_password(password)
        return cls(verifiers)

    def verifier(self, user: str) -> ScramVerifier | None:
        return self._verifiers.get(user)

    @property
    def users(self) -> frozenset[str]:
        return frozenset(self._verifiers)


class ScramExchange:
    """The server's side of one SCRAM-SHA-256 exchange (no channel binding)."""

    def __init__(self, verifier: ScramVerifier | None) -> None:
        # An unknown user goes through the exchange with a made-up verifier, so the failure
        # comes at the same step as a wrong password.
        self.verifier = verifier or ScramVerifier.from_password(secrets.token_hex(16))
        self.known = verifier is not None
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""

    def first(self, client_first: bytes) -> bytes:
        text = _ascii(client_first)
        header, sep, bare = _split_gs2(text)
        if header not in ("n,,", "y,,") or not sep:
            raise AuthFailed(INVALID_AUTHORIZATION, "SCRAM channel binding is not supported")
        attributes = _attributes(bare)
        client_nonce = attributes.get("r", "")
        if not client_nonce:
            raise AuthFailed(INVALID_AUTHORIZATION, "SCRAM client-first-message has no nonce")
        self._gs2 = header
        self._client_first_bare = bare
        self._nonce = client_nonce + base64.b64encode(secrets.token_bytes(18)).decode()
        salt = base64.b64encode(self.verifier.salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={self.verifier.iterations}"
        return self._server_first.encode()

    def final(self, client_final: bytes) -> bytes:
        text = _ascii(client_final)
        without_proof, sep, proof_part = text.rpartition(",p=")
        if not sep:
            raise AuthFailed(INVALID_AUTHORIZATION, "SCRAM client-final-message has no proof")
        attributes = _attributes(without_proof)
        if attributes.get("r") != self._nonce:
            raise AuthFailed(INVALID_AUTHORIZATION, "SCRAM nonce does not match")
        if attributes.get("c") != base64.b64encode(self._gs2.encode()).decode():
            raise AuthFailed(INVALID_AUTHORIZATION, "SCRAM channel binding does not match")
        try:
            proof = base64.b64decode(proof_part, validate=True)
        except ValueError:
            raise AuthFailed(INVALID_AUTHORIZATION, "SCRAM proof is not base64") from None
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        signature = _hmac(self.verifier.stored_key, auth_message)
        if len(proof) != len(signature):
            raise AuthFailed(INVALID_PASSWORD, "password authentication failed")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        valid = hmac.compare_digest(hashlib.sha256(client_key).digest(), self.verifier.stored_key)
        if not (valid and self.known):
            raise AuthFailed(INVALID_PASSWORD, "password authentication failed")
        server_signature = _hmac(self.verifier.server_key, auth_message)
        return b"v=" + base64.b64encode(server_signature)


def _ascii(data: bytes) -> str:
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        raise AuthFailed(INVALID_AUTHORIZATION, "SCRAM message is not ASCII") from None


def _split_gs2(text: str) -> tuple[str, str, str]:
    first = text.find(",")
    second = text.find(",", first + 1) if first >= 0 else -1
    if second < 0:
        return text, "", ""
    return text[: second + 1], ",", text[second + 1 :]


def _attributes(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if sep and len(key) == 1:
            out.setdefault(key, value)
    return out


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


class Authenticator:
    """Trust for loopback clients unless passwords are required (a password file is
    configured, or the adapter's ``auth = password``); SCRAM-SHA-256 for everyone else,
    against ``roles``. ``administrators`` (the password file's users, who bootstrap a
    deployment) are superusers whatever the catalog holds."""

    def __init__(
        self,
        roles: RoleStore,
        *,
        require_passwords: bool,
        administrators: frozenset[str] = frozenset(),
    ) -> None:
        self.roles = roles
        self.require_passwords = require_passwords
        self.administrators = administrators

    def principal(self, user: str) -> Principal:
        """The role a connection that logged in as ``user`` acts as."""
        return Principal(user, administrator=user in self.administrators)

    def method(self, peer_host: str) -> str:
        """``trust`` or ``scram``."""
        if not self.require_passwords and is_loopback(peer_host):
            return "trust"
        return "scram"

    def exchange(self, user: str) -> ScramExchange:
        return ScramExchange(self.roles.verifier(user))
