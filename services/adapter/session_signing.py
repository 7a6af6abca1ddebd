"""Signed sessions: the adapter only takes back the sessions it (or a peer with the same keys)
handed out, to the same user.

A gRPC client carries its session (settings, open transaction) from call to call, so without a
check it could drop a transaction's read set (turning a read-then-write into a blind write) or
edit the buffered rows. Every session the adapter returns is signed: HMAC-SHA256 with the first
of the shared keys (``tidemark.session_keys``) over a canonical encoding of the settings, the
transaction bytes and the caller's user name (so another user cannot replay it). The signature
names its key, so any adapter holding that key verifies it, and rotation is a matter of the
keys file. An empty session (a new client) needs no signature.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from tidemark.errors import InvalidArgument
from tidemark.logging import get_logger
from tidemark.session_keys import SessionKey, new_key, read_keys
from tidemark.v1 import adapter_pb2

log = get_logger("services.adapter.session_signing")

INVALID = "session signature invalid"
_DOMAIN = b"tidemark-session-v1\0"
_MAC_BYTES = hashlib.sha256().digest_size


def _field(data: bytes) -> bytes:
    return struct.pack(">Q", len(data)) + data


def canonical_parts(
    settings: Mapping[str, str], transaction: bytes, user: str, key_id: str
) -> Iterator[bytes]:
    """The bytes a signature covers, in pieces (the transaction is not copied): one encoding
    for one session, whatever order the map's entries travelled in, with every part
    length-prefixed so no two sessions share it."""
    yield _DOMAIN
    yield _field(key_id.encode())
    yield struct.pack(">Q", len(settings))
    for name, value in sorted((k.encode(), v.encode()) for k, v in settings.items()):
        yield _field(name)
        yield _field(value)
    yield struct.pack(">Q", len(transaction))
    yield transaction
    yield _field(user.encode())


def canonical(settings: Mapping[str, str], transaction: bytes, user: str, key_id: str) -> bytes:
    return b"".join(canonical_parts(settings, transaction, user, key_id))


class SessionSigner:
    """Signs sessions with the first key and verifies them with any."""

    def __init__(self, keys: Sequence[SessionKey]) -> None:
        if not keys:
            raise ValueError("a session signer needs at least one key")
        self.keys = list(keys)
        self._by_id = {key.key_id: key for key in keys}

    @classmethod
    def from_file(cls, path: str) -> SessionSigner:
        """The keys of ``path``; without one, a random key of this process alone."""
        if path:
            signer = cls(read_keys(Path(path)))
            log.info("session_keys_loaded", path=path, keys=[k.key_id for k in signer.keys])
            return signer
        log.warning(
            "session_keys_generated",
            detail="no --session-keys-file: sessions are signed with a random key, so a session "
            "(its settings, an open transaction) is valid only on this adapter until it restarts",
        )
        return cls([new_key("ephemeral")])

    def _mac(self, key: SessionKey, session: adapter_pb2.Session, user: str) -> bytes:
        mac = hmac.new(key.secret, digestmod=hashlib.sha256)
        for part in canonical_parts(session.settings, session.transaction, user, key.key_id):
            mac.update(part)
        return mac.digest()

    def sign(self, session: adapter_pb2.Session, user: str) -> None:
        """Sets ``session.signature`` (cleared for an empty session, which needs none)."""
        if is_empty(session):
            session.signature = b""
            return
        key = self.keys[0]
        session.signature = key.key_id.encode() + b":" + self._mac(key, session, user)

    def verify(self, session: adapter_pb2.Session, user: str) -> None:
        """``InvalidArgument`` unless ``session`` is empty or signed by a known key for
        ``user`` exactly as it is."""
        if is_empty(session):
            return
        key_id, colon, mac = session.signature.partition(b":")
        key = self._by_id.get(key_id.decode("ascii", "replace")) if colon else None
        if key is None or len(mac) != _MAC_BYTES:
            raise InvalidArgument(INVALID)
        if not hmac.compare_digest(mac, self._mac(key, session, user)):
            raise InvalidArgument(INVALID)


def is_empty(session: adapter_pb2.Session) -> bool:
    return not session.settings and not session.transaction
