"""The consensus contract: a small, versioned key-value store with compare-and-set.

Every durable decision in Tidemark (oracle timestamps, shard state, capabilities) is one
compare-and-set on one key, so this is the only primitive that must be linearizable.
Backends: etcd (production), SQLite (embedded default), memory (unit tests only).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass

from tidemark.errors import InvalidArgument, ValueTooLarge

# etcd rejects requests above 1.5 MiB by default (--max-request-bytes); a value of at most
# 1 MiB leaves room for the key and the transaction around it. The embedded backends use the
# same default so that what works on a laptop also fits in production.
DEFAULT_MAX_VALUE_BYTES = 1 << 20

# Keys are short paths ("oracle/<timeline>", "shard/<id>"); a bound keeps them clear of the
# request limit whatever the value size.
MAX_KEY_BYTES = 4096


@dataclass(frozen=True)
class VersionedData:
    """A key's value and the version it was written at. Versions increase with every write
    to the key; a deleted and re-created key gets a version higher than any before it."""

    version: int
    data: bytes


@dataclass(frozen=True)
class Committed:
    """The compare-and-set took effect; the key is now at ``version``."""

    version: int


@dataclass(frozen=True)
class Mismatch:
    """The expectation did not hold; nothing was written. ``current`` is the key's state as
    read in the same atomic step (``None``: the key does not exist)."""

    current: VersionedData | None


CasResult = Committed | Mismatch


class Consensus(ABC):
    """A linearizable map from string keys to versioned bytes.

    Failures raise :class:`tidemark.errors.Unavailable` when the request certainly had no
    effect and :class:`tidemark.errors.Indeterminate` when it may have (a timeout after
    sending a write); values larger than :attr:`max_value_bytes` raise
    :class:`tidemark.errors.ValueTooLarge` before anything is sent.
    """

    max_value_bytes: int

    @abstractmethod
    async def head(self, key: str) -> VersionedData | None:
        """The key's current value and version, or ``None`` if absent."""

    @abstractmethod
    async def compare_and_set(
        self, key: str, expected_version: int | None, data: bytes
    ) -> CasResult:
        """Write ``data`` iff the key is at ``expected_version`` (``None``: iff absent)."""

    @abstractmethod
    async def scan(self, prefix: str) -> list[tuple[str, VersionedData]]:
        """Every key starting with ``prefix``, sorted by key, read at one point in time."""

    @abstractmethod
    async def delete(self, key: str, expected_version: int) -> CasResult:
        """Delete iff the key is at ``expected_version``. ``Committed.version`` is the deleted
        version; a missing key is a ``Mismatch(None)``."""

    @abstractmethod
    def watch(self, key: str) -> AsyncIterator[VersionedData | None]:
        """Yield the key's state now, then again each time it may have changed.

        Consumers compare versions rather than count events: a backend may coalesce several
        writes into one notification, but never misses the latest state. ``None`` means the
        key does not exist.

        If the first read fails the iterator raises :class:`~tidemark.errors.Unavailable`;
        after that, backend outages are ridden out (reconnect, re-read, carry on), so a
        long-lived subscriber survives a server restart. The iterator ends when the backend
        is closed.
        """

    @abstractmethod
    async def close(self) -> None:
        """Release connections and end running watches. Later calls raise ``Unavailable``."""


def encode_key(key: str) -> bytes:
    """The key's UTF-8 bytes, or :class:`InvalidArgument` for an unusable key."""
    if not isinstance(key, str) or not key:
        raise InvalidArgument(f"consensus keys are non-empty strings, got {key!r}")
    try:
        encoded = key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"consensus key {key!r} is not valid UTF-8 text") from exc
    if len(encoded) > MAX_KEY_BYTES:
        raise InvalidArgument(
            f"consensus key of {len(encoded)} bytes exceeds the limit of {MAX_KEY_BYTES}"
        )
    return encoded


def encode_prefix(prefix: str) -> bytes:
    """A scan prefix's UTF-8 bytes; unlike a key it may be empty (every key)."""
    if not isinstance(prefix, str):
        raise InvalidArgument(f"scan prefixes are strings, got {prefix!r}")
    return encode_key(prefix) if prefix else b""


def check_write(key: str, expected_version: int | None, data: bytes, max_value_bytes: int) -> bytes:
    """Validate a compare-and-set before anything is sent; returns the encoded key."""
    encoded = encode_key(key)
    check_expected_version(expected_version)
    if not isinstance(data, bytes):
        raise InvalidArgument(f"consensus values are bytes, got {type(data).__name__}")
    if len(data) > max_value_bytes:
        raise ValueTooLarge(
            f"value of {len(data)} bytes for key {key!r} exceeds this backend's limit of "
            f"{max_value_bytes} bytes"
        )
    return encoded


def check_expected_version(expected_version: int | None) -> None:
    """Versions start at 1, so 0 or less can never match: it is a caller bug, not a miss."""
    if expected_version is not None and (
        not isinstance(expected_version, int) or expected_version < 1
    ):
        raise InvalidArgument(
            f"expected_version must be None (absent) or a version >= 1, got {expected_version!r}"
        )
