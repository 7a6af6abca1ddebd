"""An in-process consensus store, for unit tests only (nothing survives the process)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from tidemark.change_signal import ChangeSignal
from tidemark.consensus.base import (
    DEFAULT_MAX_VALUE_BYTES,
    CasResult,
    Committed,
    Consensus,
    Mismatch,
    VersionedData,
    check_expected_version,
    check_write,
    encode_key,
    encode_prefix,
)
from tidemark.errors import Unavailable


class MemoryConsensus(Consensus):
    """A dict behind the consensus contract, used from one event loop.

    Every call yields to the event loop once before acting, as a networked backend would,
    so concurrent tasks in a test really interleave between reading and writing.
    """

    def __init__(self, max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> None:
        self.max_value_bytes = max_value_bytes
        self._entries: dict[str, VersionedData] = {}
        self._last_version = 0
        self._changes = ChangeSignal()
        self._closed = False

    async def _enter(self) -> None:
        await asyncio.sleep(0)
        if self._closed:
            raise Unavailable("memory consensus store is closed")

    def _next_version(self) -> int:
        self._last_version += 1
        return self._last_version

    async def head(self, key: str) -> VersionedData | None:
        encode_key(key)
        await self._enter()
        return self._entries.get(key)

    async def compare_and_set(
        self, key: str, expected_version: int | None, data: bytes
    ) -> CasResult:
        check_write(key, expected_version, data, self.max_value_bytes)
        await self._enter()
        current = self._entries.get(key)
        if (current.version if current else None) != expected_version:
            return Mismatch(current)
        written = VersionedData(self._next_version(), bytes(data))
        self._entries[key] = written
        self._changes.notify()
        return Committed(written.version)

    async def scan(self, prefix: str) -> list[tuple[str, VersionedData]]:
        encode_prefix(prefix)
        await self._enter()
        # Sort by UTF-8 bytes, the order etcd and SQLite use.
        return sorted(
            ((key, value) for key, value in self._entries.items() if key.startswith(prefix)),
            key=lambda item: item[0].encode("utf-8"),
        )

    async def delete(self, key: str, expected_version: int) -> CasResult:
        encode_key(key)
        check_expected_version(expected_version)
        await self._enter()
        current = self._entries.get(key)
        if current is None or current.version != expected_version:
            return Mismatch(current)
        del self._entries[key]
        # Spend a version on the delete too, like the other backends, so a re-created key
        # is always newer than anything a watcher saw before.
        self._next_version()
        self._changes.notify()
        return Committed(current.version)

    async def watch(self, key: str) -> AsyncIterator[VersionedData | None]:
        encode_key(key)
        await self._enter()
        last_seen: int | None = -1  # no version is -1: the first state is always yielded
        while not self._closed:
            token = self._changes.token
            state = self._entries.get(key)
            version = state.version if state else None
            if version != last_seen:
                last_seen = version
                yield state
            await self._changes.wait_past(token)

    async def close(self) -> None:
        self._closed = True
        self._changes.notify()
