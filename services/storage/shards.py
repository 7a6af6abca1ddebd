"""Shard states in consensus: reading them, creating them, and changing them by
compare-and-set.

Every change is an :data:`~services.storage.operations.Operation` run against the state it
will replace. Concurrent operations on one shard within this process share one
compare-and-set (group commit); when the compare-and-set loses to another writer (another
storage process, say), every operation of the group is run again against the state that won.
The last state this process saw is kept only as a starting guess: a decision is final only
once a compare-and-set based on it succeeded, or a fresh read confirmed it.

A compare-and-set whose outcome is unknown (a timeout after sending it) is settled by reading
the state back: if it holds what was written, it landed; otherwise the operations run again on
what is there. Operations recognise their own earlier effects (an append's batch and token, a
clone's new id, a merge's blob), so a write that landed and was then overtaken is not applied
a second time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from services.storage.operations import Operation, expire_leases
from services.storage.state import ShardState
from tidemark.batching import GroupCommit
from tidemark.consensus import Committed, Consensus, Mismatch, VersionedData
from tidemark.errors import (
    Aborted,
    AlreadyExists,
    Indeterminate,
    Internal,
    NotFound,
    TidemarkError,
    Unavailable,
)
from tidemark.logging import get_logger
from tidemark.retry import RetryPolicy, retry_unavailable

R = TypeVar("R")

log = get_logger("storage.shards")

# Losing this many compare-and-sets in a row means heavy contention; the caller may retry.
MAX_CAS_ATTEMPTS = 64
# A prepared operation (see ShardStore.prepare) stands for a run at most this much later: its
# decisions that depend on the clock (lease renewals, an append's blob age) are that close.
MAX_PREPARED_AGE_MS = 1_000


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Versioned:
    """A shard state and the consensus version it was read or written at."""

    version: int
    state: ShardState
    data: bytes
    """The state as stored."""

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class _Outcome(Generic[R]):
    value: R | None = None
    error: TidemarkError | None = None


class ShardStore:
    """The shard states under ``{prefix}shards/`` in ``consensus``."""

    def __init__(
        self,
        consensus: Consensus,
        *,
        prefix: str = "storage/",
        clock: Callable[[], int] = wall_clock_ms,
        retry: RetryPolicy | None = None,
        on_commit: Callable[[str, Versioned], None] | None = None,
    ) -> None:
        self.consensus = consensus
        self.prefix = prefix
        self.clock = clock
        self.retry = retry or RetryPolicy()
        self.on_commit = on_commit
        self._latest: dict[str, Versioned] = {}
        # The state each shard's compare-and-set in flight is writing: a watch may deliver it
        # before the compare-and-set's reply does, and then needs no decoding.
        self._writing: dict[str, tuple[bytes, ShardState]] = {}
        self._commits: dict[str, GroupCommit[Operation[Any], _Outcome[Any]]] = {}

    def key(self, collection_id: str) -> str:
        return f"{self.prefix}shards/{collection_id}"

    def decode(self, collection_id: str, data: VersionedData) -> Versioned:
        """The state in ``data``, decoded once per version (and not at all if this process
        is writing those very bytes: equal bytes are an equal state)."""
        known = self._latest.get(collection_id)
        if known is not None and known.version == data.version:
            return known
        writing = self._writing.get(collection_id)
        if writing is not None and writing[0] == data.data:
            state = writing[1]
        else:
            try:
                state = ShardState.decode(data.data)
            except Exception as exc:
                raise Internal(f"shard state of {collection_id} does not decode: {exc}") from exc
        versioned = Versioned(data.version, state, data.data)
        self._remember(collection_id, versioned)
        return versioned

    def _remember(self, collection_id: str, versioned: Versioned) -> None:
        known = self._latest.get(collection_id)
        if known is None or known.version < versioned.version:
            self._latest[collection_id] = versioned

    def latest_seen(self, collection_id: str) -> Versioned | None:
        """The newest state this process has seen: possibly stale, good for guesses only."""
        return self._latest.get(collection_id)

    async def read(self, collection_id: str) -> Versioned | None:
        """The current state, or ``None`` if the collection does not exist."""
        key = self.key(collection_id)
        data = await retry_unavailable(
            lambda: self.consensus.head(key), self.retry, "the consensus store"
        )
        return None if data is None else self.decode(collection_id, data)

    async def require(self, collection_id: str) -> Versioned:
        """The current state; ``NotFound`` if the collection does not exist."""
        found = await self.read(collection_id)
        if found is None:
            raise NotFound(f"collection {collection_id} does not exist")
        return found

    async def scan(self) -> list[Versioned]:
        """Every shard's current state."""
        base = f"{self.prefix}shards/"
        entries = await retry_unavailable(
            lambda: self.consensus.scan(base), self.retry, "the consensus store"
        )
        return [self.decode(key[len(base) :], data) for key, data in entries]

    async def create(self, collection_id: str, state: ShardState) -> Versioned:
        """Store a new shard; ``AlreadyExists`` if the id was ever used."""
        data = state.encode()
        for _ in range(MAX_CAS_ATTEMPTS):
            result = await self._compare_and_set(collection_id, None, data, state)
            if isinstance(result, Committed):
                versioned = Versioned(result.version, state, data)
                self._committed(collection_id, versioned)
                return versioned
            if result is not None:
                break
            # Unknown outcome: it landed if the stored state is ours (its capability ids are
            # random, so nobody else's state has them); if nothing is stored, try again.
            found = await self.read(collection_id)
            if found is None:
                continue
            mine = state.capabilities[0].id if state.capabilities else None
            if mine is not None and found.state.capability(mine) is not None:
                return found
            break
        raise AlreadyExists(f"collection {collection_id} already exists")

    async def _compare_and_set(
        self, collection_id: str, version: int | None, data: bytes, state: ShardState
    ) -> Committed | Mismatch | None:
        """One compare-and-set of ``state`` (encoded as ``data``), retried while the store is
        unavailable (it certainly did not happen); ``None`` when its outcome is unknown."""
        key = self.key(collection_id)
        backoff = self.retry.backoffs()
        self._writing[collection_id] = (data, state)
        try:
            while True:
                try:
                    return await self.consensus.compare_and_set(key, version, data)
                except Indeterminate:
                    self._latest.pop(collection_id, None)
                    return None
                except Unavailable as exc:
                    if backoff.expired():
                        message = f"the consensus store is unavailable: {exc.message}"
                        raise Unavailable(message) from exc
                    await backoff.sleep()
        finally:
            self._writing.pop(collection_id, None)

    def prepare(self, collection_id: str, operation: Operation[R]) -> Operation[R]:
        """``operation``, already run against the newest state this process has seen, and
        its next state already encoded: for a caller that has time on its hands before it
        calls :meth:`update` (an append waiting for its blob to be stored). When the group
        commit then runs it against that very state within ``MAX_PREPARED_AGE_MS``, the
        remembered outcome is used instead of running it again; against any other state it
        runs as usual. So nothing is decided on an older state than before, only earlier."""
        seen = self._latest.get(collection_id)
        if seen is None:
            return operation
        prepared_ms = self.clock()
        base = expire_leases(seen.state, prepared_ms)
        try:
            after, result = operation(base, prepared_ms)
        except TidemarkError:
            return operation  # the group commit decides, against the state it finds
        if after is not base:
            after.encode()  # remembered by the state

        def run(state: ShardState, now_ms: int) -> tuple[ShardState, R]:
            if state is base and 0 <= now_ms - prepared_ms <= MAX_PREPARED_AGE_MS:
                return after, result
            return operation(state, now_ms)

        return run

    async def update(self, collection_id: str, operation: Operation[R]) -> R:
        """Run ``operation`` against the current state and store the result; its result, or
        the error it raised (then nothing of it was stored)."""
        commit = self._commits.get(collection_id)
        if commit is None:

            async def flush(ops: Sequence[Operation[Any]]) -> Sequence[_Outcome[Any]]:
                return await self._flush(collection_id, ops)

            commit = self._commits[collection_id] = GroupCommit(flush, max_batch=256)
        outcome = await commit.submit(operation)
        if outcome.error is not None:
            raise outcome.error
        return cast(R, outcome.value)

    async def _flush(
        self, collection_id: str, operations: Sequence[Operation[Any]]
    ) -> list[_Outcome[Any]]:
        current = self._latest.get(collection_id)
        confirmed = current is None
        if current is None:
            current = await self.require(collection_id)
        for _ in range(MAX_CAS_ATTEMPTS):
            now = self.clock()
            state = expire_leases(current.state, now)
            outcomes: list[_Outcome[Any]] = []
            for operation in operations:
                try:
                    state, result = operation(state, now)
                    outcomes.append(_Outcome(value=result))
                except TidemarkError as exc:
                    outcomes.append(_Outcome(error=exc))
            data = current.data if state is current.state else state.encode()
            if data == current.data:
                # Nothing to write: the outcomes stand if the state they saw is current.
                if confirmed:
                    return outcomes
                fresh = await self.require(collection_id)
                if fresh.version == current.version:
                    return outcomes
                current, confirmed = fresh, True
                continue
            result = await self._compare_and_set(collection_id, current.version, data, state)
            if result is None:
                # Unknown outcome: look. If it landed (and nothing came after) we are done;
                # otherwise the operations decide again on what is there. They recognise
                # their own effects (an append's token and batch, a clone's id, a merge's
                # blob), so running one twice never applies it twice.
                fresh = await self.require(collection_id)
                if fresh.data == data:
                    self._committed(collection_id, fresh)
                    return outcomes
                current, confirmed = fresh, True
                continue
            if isinstance(result, Committed):
                self._committed(collection_id, Versioned(result.version, state, data))
                return outcomes
            if result.current is None:
                raise NotFound(f"collection {collection_id} does not exist")
            current, confirmed = self.decode(collection_id, result.current), True
        raise Aborted(
            f"collection {collection_id}: lost {MAX_CAS_ATTEMPTS} compare-and-sets in a row to "
            "concurrent changes; retry"
        )

    def _committed(self, collection_id: str, versioned: Versioned) -> None:
        self._remember(collection_id, versioned)
        if self.on_commit is not None:
            self.on_commit(collection_id, versioned)

    async def close(self) -> None:
        for commit in self._commits.values():
            await commit.close()
        self._commits.clear()
