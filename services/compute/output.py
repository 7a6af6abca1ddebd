"""Appending a dataflow's output to its storage collection, exactly once per time.

The writer knows the collection's upper ``W`` and appends each step's interval ``[lower,
upper)`` with ``expected_upper = W``, so it never overwrites and never leaves a gap. Because
outputs are deterministic, anything already in the collection at times before ``W`` is what
the dataflow would write again: updates at earlier times are dropped (a dataflow restarted at
``W - 1``, or an append whose first attempt had taken effect, writes nothing twice).

Each append carries a token derived from the dataflow id and the interval, so a retry of an
append whose outcome was unknown is recognised by storage and not applied twice.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence

from services.compute.dataflow import Row, Update
from services.compute.dataflow.ordering import canonical_float
from tidemark.blob import open_blob
from tidemark.clients.storage import Capability, PartsListing, StorageClient, WrittenPart
from tidemark.columnar import (
    RelationSchema,
    from_parquet,
    frontier_bound,
    table_from_updates,
    updates_from_table,
)
from tidemark.errors import DeadlineExceeded, FailedPrecondition, Unavailable
from tidemark.logging import get_logger
from tidemark.retry import RetryPolicy

log = get_logger("compute.output")

# Storage being down stalls the dataflow rather than failing it.
APPEND_RETRY = RetryPolicy(total_seconds=float("inf"), initial_backoff=0.05, max_backoff=2.0)


def append_token(dataflow_id: str, lower: int, upper: int) -> str:
    """The same for every attempt (and every process) appending ``[lower, upper)``."""
    digest = hashlib.sha256(dataflow_id.encode()).hexdigest()[:32]
    return f"compute-{digest}-{lower}-{upper}"


class OutputWriter:
    def __init__(
        self,
        storage: StorageClient,
        capability: Capability,
        schema: RelationSchema,
        dataflow_id: str,
        upper: int,
    ) -> None:
        self.storage = storage
        self.capability = capability
        self.schema = schema
        self.dataflow_id = dataflow_id
        self.upper = upper
        """The collection's upper as far as this writer knows (it is the only writer)."""
        self.appends = 0

    @property
    def collection_id(self) -> str:
        return self.capability.collection_id

    async def write(self, updates: Sequence[Update], upper: int) -> None:
        """Appends the updates at times in ``[self.upper, upper)`` and moves the upper to
        ``upper``; a no-op when the collection is already there."""

        async def append(lower: int) -> None:
            await self._append_rows(updates, lower, upper)

        await self._append_until(upper, append)

    async def _append_rows(self, updates: Sequence[Update], lower: int, upper: int) -> None:
        """One attempt at appending ``[lower, upper)``: the updates at times from ``lower``."""
        kept = [update for update in updates if update[1] >= lower]
        await self.storage.append(
            self.capability,
            table_from_updates(self.schema, kept),
            upper,
            token=append_token(self.dataflow_id, lower, upper),
            expected_upper=lower,
        )

    async def write_parts(
        self,
        parts: Sequence[WrittenPart],
        times: tuple[int, int],
        upper: int,
        *,
        blob_url: str = "",
    ) -> None:
        """``write`` for updates already written as Parquet parts (by Spark's executors or
        the resident tasks), at times from ``times[0]`` to ``times[1]``: commits them as one
        batch through ``AppendParts``. If the collection is already written past
        ``times[0]`` (another writer went ahead), the parts cannot be cut: their updates are
        read back from ``blob_url`` and the later ones appended as rows (without
        ``blob_url``: ``FailedPrecondition``). Parts never committed are left to storage's
        orphan sweep."""
        if not parts:
            await self.write([], upper)
            return
        least, greatest = times

        async def append(lower: int) -> None:
            if least < lower:
                if not blob_url:
                    raise FailedPrecondition(
                        f"output {self.collection_id!r} is already written up to {lower}, "
                        f"past the parts' least time {least}"
                    )
                await self._append_rows(await read_back(blob_url, parts), lower, upper)
                return
            await self.storage.append_parts(
                self.capability,
                parts,
                upper,
                times=(least, greatest),
                token=append_token(self.dataflow_id, lower, upper),
                expected_upper=lower,
            )

        await self._append_until(upper, append)

    async def _append_until(self, upper: int, append: Callable[[int], Awaitable[None]]) -> None:
        """Runs ``append(lower)`` (an append of ``[lower, upper)`` expecting the upper at
        ``lower``) until the collection's upper is at ``upper``: after storage was
        unavailable, and from where someone else stopped when the upper moved."""
        backoff = APPEND_RETRY.backoffs()
        while upper > self.upper:
            lower = self.upper
            try:
                await append(lower)
                self.upper = upper
                self.appends += 1
                return
            except FailedPrecondition as exc:
                actual = await self._current_upper()
                if actual <= lower:
                    raise
                # Someone (an earlier attempt, a replica) wrote past us: its contents there are
                # ours too; continue from where it stopped.
                log.info(
                    "output_upper_moved",
                    dataflow=self.dataflow_id,
                    expected=lower,
                    actual=actual,
                    error=exc.message,
                )
                self.upper = actual
            except (Unavailable, DeadlineExceeded) as exc:
                log.warning("output_append_retry", dataflow=self.dataflow_id, error=exc.message)
                await backoff.sleep()

    async def existing_parts(self, holder: str) -> tuple[PartsListing, Capability] | None:
        """The parts holding the collection at ``upper - 1`` (``None`` when empty), with the
        read capability that holds them readable; the caller drops it when done."""
        if self.upper == 0:
            return None
        pair = await self.storage.acquire(self.collection_id, holder)
        await self.storage.drop(pair.write)
        try:
            since = frontier_bound(pair.read.frontier)
            if since is None or since > self.upper - 1:
                raise FailedPrecondition(
                    f"output {self.collection_id!r} cannot be read at {self.upper - 1}: its "
                    f"since is {since}"
                )
            return await self.storage.list_parts(pair.read, self.upper - 1), pair.read
        except BaseException:
            await self.storage.drop(pair.read)
            raise

    async def _current_upper(self) -> int:
        bound = frontier_bound((await self.storage.describe(self.collection_id)).upper)
        return 2**64 - 1 if bound is None else bound

    async def contents_before_upper(self, holder: str) -> dict[Row, int]:
        """What the collection holds at ``upper - 1`` (read with a capability of its own)."""
        if self.upper == 0:
            return {}
        pair = await self.storage.acquire(self.collection_id, holder)
        try:
            since = frontier_bound(pair.read.frontier)
            if since is None or since > self.upper - 1:
                raise FailedPrecondition(
                    f"output {self.collection_id!r} cannot be read at {self.upper - 1}: its "
                    f"since is {since}"
                )
            snapshot = await self.storage.snapshot(pair.read, self.upper - 1)
            return {_canonical_row(row): n for row, n in snapshot.version().items()}
        finally:
            for capability in (pair.read, pair.write):
                if capability.usable:
                    await self.storage.drop(capability)


def _canonical_row(row: Row) -> Row:
    if any(value.__class__ is float for value in row):
        return tuple(canonical_float(v) if v.__class__ is float else v for v in row)
    return row


async def read_back(blob_url: str, parts: Sequence[WrittenPart]) -> list[Update]:
    """The updates of written parts, read from the blob store (for the rare caller that
    needs the rows of parts the tasks wrote)."""
    async with await open_blob(blob_url) as blob:
        data = await asyncio.gather(*(blob.get_existing(part.key) for part in parts))
    return [update for item in data for update in updates_from_table(from_parquet(item))]
