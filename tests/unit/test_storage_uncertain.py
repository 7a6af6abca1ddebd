"""Compare-and-sets whose outcome is unknown (the reply was lost): the storage core finds out
what happened, applies nothing twice, and never deletes a blob the state refers to."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from services.storage.core import StorageCore, StorageSettings
from tidemark.blob import MemoryBlob
from tidemark.columnar import ColumnType, RelationSchema, table_from_updates, version_from_table
from tidemark.consensus import CasResult, Consensus, VersionedData
from tidemark.consensus.memory import MemoryConsensus
from tidemark.errors import AlreadyExists, Indeterminate
from tidemark.frontier import u64_frontier

SCHEMA = RelationSchema.of(("k", ColumnType.INT64))


class LossyConsensus(Consensus):
    """Memory consensus whose next compare-and-set may lose its reply: it is carried out
    (``land=True``) or not, and ``Indeterminate`` is raised either way. ``meanwhile`` runs
    right after, like a write by another process slipping in."""

    def __init__(self) -> None:
        self.inner = MemoryConsensus()
        self.max_value_bytes = self.inner.max_value_bytes
        self.lose_next: bool | None = None
        self.meanwhile: Callable[[], Awaitable[None]] | None = None

    async def head(self, key: str) -> VersionedData | None:
        return await self.inner.head(key)

    async def compare_and_set(
        self, key: str, expected_version: int | None, data: bytes
    ) -> CasResult:
        land, self.lose_next = self.lose_next, None
        if land is None:
            return await self.inner.compare_and_set(key, expected_version, data)
        if land:
            await self.inner.compare_and_set(key, expected_version, data)
        if self.meanwhile is not None:
            meanwhile, self.meanwhile = self.meanwhile, None
            await meanwhile()
        raise Indeterminate("the reply was lost")

    async def scan(self, prefix: str) -> list[tuple[str, VersionedData]]:
        return await self.inner.scan(prefix)

    async def delete(self, key: str, expected_version: int) -> CasResult:
        return await self.inner.delete(key, expected_version)

    def watch(self, key: str) -> AsyncIterator[VersionedData | None]:
        return self.inner.watch(key)

    async def close(self) -> None:
        await self.inner.close()


@pytest.fixture
async def setup() -> AsyncIterator[tuple[StorageCore, LossyConsensus, MemoryBlob]]:
    consensus = LossyConsensus()
    blob = MemoryBlob()
    core = StorageCore(consensus, blob, StorageSettings())
    yield core, consensus, blob
    await core.close()


@pytest.mark.parametrize("land", [True, False])
async def test_create_with_a_lost_reply(
    setup: tuple[StorageCore, LossyConsensus, MemoryBlob], land: bool
) -> None:
    core, consensus, _ = setup
    consensus.lose_next = land
    read, _ = await core.create("u1", SCHEMA)
    assert (await core.describe("u1")).state.capability(read.id) is not None
    with pytest.raises(AlreadyExists):
        await core.create("u1", SCHEMA)


@pytest.mark.parametrize("land", [True, False])
@pytest.mark.parametrize("interleaved", [False, True])
async def test_append_with_a_lost_reply_applies_once_and_keeps_its_blob(
    setup: tuple[StorageCore, LossyConsensus, MemoryBlob], land: bool, interleaved: bool
) -> None:
    core, consensus, blob = setup
    read, write = await core.create("u1", SCHEMA)
    other = await core.clone("u1", read.id)
    consensus.lose_next = land
    if interleaved:
        # Another storage process changes the state right after: the re-run must recognise
        # its own batch rather than refuse because the write capability has moved on.
        elsewhere = StorageCore(consensus.inner, blob, StorageSettings())

        async def downgrade_elsewhere() -> None:
            await elsewhere.downgrade("u1", other.id, u64_frontier(1))

        consensus.meanwhile = downgrade_elsewhere
    outcome = await core.append(
        "u1", write.id, table_from_updates(SCHEMA, [((1,), 0, 1)]), u64_frontier(3), token="t"
    )
    assert outcome.upper == u64_frontier(3) and not outcome.already_committed
    state = (await core.describe("u1")).state
    assert state.upper == u64_frontier(3)
    assert [b.key for b in state.batches] == await blob.list()
    snapshot = await core.snapshot("u1", other.id, 2)
    assert version_from_table(snapshot.table) == {(1,): 1}
    # The client's own retry with the same token is recognised too.
    again = await core.append(
        "u1", write.id, table_from_updates(SCHEMA, [((1,), 0, 1)]), u64_frontier(3), token="t"
    )
    assert again.already_committed
    assert [b.key for b in (await core.describe("u1")).state.batches] == await blob.list()


async def test_compaction_with_a_lost_reply_keeps_the_merged_blob(
    setup: tuple[StorageCore, LossyConsensus, MemoryBlob],
) -> None:
    core, consensus, blob = setup
    read, write = await core.create("u1", SCHEMA)
    core.compactor.request = lambda collection_id: None  # type: ignore[method-assign]
    for t in range(2):
        await core.append(
            "u1", write.id, table_from_updates(SCHEMA, [((t,), t, 1)]), u64_frontier(t + 1)
        )
    consensus.lose_next = True
    assert await core.compactor.compact("u1") >= 1
    state = (await core.describe("u1")).state
    assert len(state.batches) == 1
    assert state.batches[0].key in await blob.list()
    snapshot = await core.snapshot("u1", read.id, 1)
    assert version_from_table(snapshot.table) == {(0,): 1, (1,): 1}
