"""The blob contract: a flat store of immutable byte strings under string keys.

Storage keeps the bulk of its data here (Parquet batches); the small, frequently changing
state that points at those batches lives in consensus. Tidemark writes each key once, under a
fresh unique name, and only deletes it once no consensus state references it. That usage
needs no conditional writes, but it does need every ``put`` to be atomic: a reader that races
a writer, or comes after a writer crashed, sees either nothing or the complete value.

Backends: S3 (production: MinIO, AWS, anything S3-compatible), a local directory (the
embedded default) and memory (unit tests). They all pass one contract test suite
(``tests/integration/test_blob_contract.py``).

Semantics shared by every backend:

* ``put`` replaces any existing value as one atomic step (last writer wins); a concurrent or
  later ``get`` returns the old value or the new one, never a mixture or a prefix.
* ``get`` of an absent key returns ``None``; :meth:`Blob.get_existing` raises
  :class:`~tidemark.errors.NotFound` instead, for callers that know the key must exist.
* ``delete`` is idempotent: deleting an absent key succeeds.
* ``list`` returns the keys starting with a prefix, sorted.
* A backend that cannot be reached raises :class:`~tidemark.errors.Unavailable` in bounded
  time (:class:`~tidemark.errors.Indeterminate` when a write may have taken effect).
"""

from __future__ import annotations

import builtins
import re
from abc import ABC, abstractmethod
from typing import Self

from tidemark.errors import InvalidArgument, NotFound

# S3's limit on object names; the other backends share it so a key valid on one is valid
# on all. (The S3 backend also counts its in-bucket prefix against this.)
MAX_KEY_BYTES = 1024

# One path segment: starts with an alphanumeric character, so a segment can never be '.',
# '..' or a dotfile. Backends rely on that: the directory backend's temporary files start
# with '.' and therefore can never be mistaken for a key.
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+-]*")
# A prefix is any leading part of a valid key, so its last segment may be empty or partial.
_PREFIX_SEGMENT = re.compile(r"([A-Za-z0-9][A-Za-z0-9._=+-]*)?")


def is_key_segment(name: str) -> bool:
    """Whether ``name`` may appear between slashes in a key."""
    return _SEGMENT.fullmatch(name) is not None


def validate_key(key: str) -> str:
    """Return ``key`` if it is a valid blob key, else raise ``InvalidArgument``.

    A key is one or more '/'-separated segments; each segment starts with a letter or digit
    and continues with letters, digits and ``. _ = + -``. No leading, trailing or doubled
    '/', hence no '.' or '..' segments and no way to escape a directory.
    """
    if not isinstance(key, str) or not key:
        raise InvalidArgument("blob key must be a non-empty string")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise InvalidArgument(f"blob key is longer than {MAX_KEY_BYTES} bytes")
    for segment in key.split("/"):
        if not _SEGMENT.fullmatch(segment):
            raise InvalidArgument(
                f"invalid blob key {key!r}: each '/'-separated segment must start with a "
                "letter or digit and contain only letters, digits and . _ = + -"
            )
    return key


def validate_prefix(prefix: str) -> str:
    """Return ``prefix`` if some valid key could start with it (``""`` lists everything)."""
    if not isinstance(prefix, str):
        raise InvalidArgument("blob prefix must be a string")
    if len(prefix.encode()) > MAX_KEY_BYTES:
        raise InvalidArgument(f"blob prefix is longer than {MAX_KEY_BYTES} bytes")
    if prefix == "":
        return prefix
    segments = prefix.split("/")
    complete, last = segments[:-1], segments[-1]
    if not all(_SEGMENT.fullmatch(s) for s in complete) or not _PREFIX_SEGMENT.fullmatch(last):
        raise InvalidArgument(f"invalid blob prefix {prefix!r}: no valid key starts with it")
    return prefix


class Blob(ABC):
    """A store of immutable byte strings; see the module docstring for the contract.

    Usable as an async context manager, which closes it on exit.
    """

    url: str = ""
    """The URL the store was opened from (:func:`tidemark.blob.open_blob` sets it), so readers
    in other processes (Spark executors) can open it too; empty when built directly."""

    @abstractmethod
    async def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` atomically, replacing any earlier value. Durable once
        this returns."""

    @abstractmethod
    async def get(self, key: str) -> bytes | None:
        """The value stored under ``key``, or ``None`` if there is none."""

    @abstractmethod
    async def delete(self, key: str) -> None:
        """Remove ``key`` if present; succeed if it is already absent."""

    @abstractmethod
    async def list(self, prefix: str = "") -> builtins.list[str]:
        """Every key starting with ``prefix``, sorted."""

    @abstractmethod
    async def close(self) -> None:
        """Release connections and threads; the store is unusable afterwards."""

    async def get_existing(self, key: str) -> bytes:
        """Like :meth:`get`, for a key the caller knows was written (a batch named in shard
        state): a missing key is an error, :class:`~tidemark.errors.NotFound`."""
        data = await self.get(key)
        if data is None:
            raise NotFound(f"blob {key!r} does not exist")
        return data

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
