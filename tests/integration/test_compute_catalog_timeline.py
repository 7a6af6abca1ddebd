"""A compute process follows the catalog on the oracle timeline the catalog writes, whatever
its name, also when it starts after the catalog has compacted its early history (the start
time then has to be a recent catalog time, not the 0 of a timeline nobody writes)."""

from __future__ import annotations

from pathlib import Path

from tests.support.compute import eventually, running_stack
from tidemark.clients.catalog import CatalogClient
from tidemark.clients.compute import ComputeClient
from tidemark.errors import FailedPrecondition

# The catalog keeps 10 ms of history and compacts every 0.1 s.
COMPACTING = ("--history-seconds", "0.01", "--maintenance-interval", "0.1")


async def _time_0_compacted(catalog: CatalogClient) -> None:
    try:
        await catalog.snapshot_at(0)
    except FailedPrecondition:
        return
    raise AssertionError("catalog time 0 is still readable")


async def test_a_cluster_started_after_compaction_follows_a_named_timeline(
    tmp_path: Path,
) -> None:
    with running_stack(
        tmp_path, clusters=(), catalog=True, engine="local", catalog_extra=COMPACTING
    ) as stack:
        assert stack.catalog is not None and stack.catalog_timeline is not None
        assert stack.catalog_timeline != "catalog"
        catalog = CatalogClient(stack.catalog.address)
        await eventually(lambda: _time_0_compacted(catalog), seconds=30.0)

        # Told the catalog's timeline (the stack passes --catalog-timeline): it follows.
        following = ComputeClient(stack.start_compute("default").address, timeout=60.0)
        applied = await following.advance_catalog_frontier(1, wait_ms=60_000)
        assert applied > 1
        assert (await following.status()).cluster_id

        # Reading the default timeline, which nobody writes here, it starts at 0, which the
        # catalog no longer has: it says why it cannot follow instead of applying anything.
        stack.catalog_timeline = None
        lost = stack.start_compute("b")
        record = lost.wait_for_record(
            lambda r: r.get("event") == "compute_catalog_resume_failed", timeout=60.0
        )
        assert "oracle timeline the catalog writes" in str(record.get("error"))
        stray = ComputeClient(lost.address, timeout=60.0)
        assert (await stray.status()).catalog_applied_upper == 0
        for client in (following, stray):
            await client.close()
        await catalog.close()
