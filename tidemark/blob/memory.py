"""In-memory blob store, for unit tests.

``memory://`` opens a private, empty store. ``memory://NAME`` opens the process-wide store
called NAME, shared by every opener of the same URL, so a test can "restart" a component and
find its blobs again. Named stores live until the process exits; tests that reuse a name see
each other's data.
"""

from __future__ import annotations

import builtins
import threading

from tidemark.blob.base import Blob, validate_key, validate_prefix

_named_stores: dict[str, dict[str, bytes]] = {}
_named_stores_lock = threading.Lock()


def named_store(name: str) -> dict[str, bytes]:
    """The shared dictionary behind ``memory://NAME`` (created empty on first use)."""
    with _named_stores_lock:
        return _named_stores.setdefault(name, {})


class MemoryBlob(Blob):
    """Values in a dictionary. Each operation is one dictionary step, so it is atomic."""

    def __init__(self, objects: dict[str, bytes] | None = None) -> None:
        self._objects: dict[str, bytes] = {} if objects is None else objects

    async def put(self, key: str, data: bytes) -> None:
        validate_key(key)
        # Copy: a caller mutating a bytearray afterwards must not change the stored value.
        self._objects[key] = bytes(data)

    async def get(self, key: str) -> bytes | None:
        validate_key(key)
        return self._objects.get(key)

    async def delete(self, key: str) -> None:
        validate_key(key)
        self._objects.pop(key, None)

    async def list(self, prefix: str = "") -> builtins.list[str]:
        validate_prefix(prefix)
        return sorted(key for key in tuple(self._objects) if key.startswith(prefix))

    async def close(self) -> None:
        pass
