"""The consensus contract: a small, versioned key-value store with compare-and-set.

Every durable decision in Tidemark (oracle timestamps, shard state, capabilities) is one
compare-and-set on one key, so this is the only primitive that must be linearizable.
Backends: etcd (production), SQLite (embedded default), memory (unit tests only).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass


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
        """

    @abstractmethod
    async def close(self) -> None: ...
