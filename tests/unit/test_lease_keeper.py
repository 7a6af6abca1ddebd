"""Holders of capabilities renew them at the interval they were given, or three times per
lease when the service says its leases are shorter than that interval allows for."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import replace
from typing import Any

from services.adapter.holds import CollectionHolds
from tidemark.clients.storage import (
    Capability,
    CapabilityPair,
    LeaseKeeper,
    RenewResult,
    renewal_wait,
)
from tidemark.frontier import u64_frontier


def test_the_wait_is_every_or_a_third_of_the_lease() -> None:
    assert renewal_wait(20.0, 0) == 20.0  # the service has not said
    assert renewal_wait(20.0, 120_000) == 20.0
    assert renewal_wait(20.0, 30_000) == 10.0
    assert renewal_wait(20.0, 600) == 0.2
    assert renewal_wait(20.0, 3) == 0.05  # no storm, whatever the service says


class _Storage:
    """Renews every capability it is asked to, and says its leases last ``lease_ms``."""

    def __init__(self, lease_ms: int) -> None:
        self.lease_ms = lease_ms
        self.renewals = 0

    async def renew(self, capabilities: list[Capability]) -> RenewResult:
        self.renewals += 1
        return RenewResult(
            [replace(c, lease_expires_ms=1) for c in capabilities], [], self.lease_ms
        )


def _keeper(storage: _Storage, every: float) -> LeaseKeeper:
    capability = Capability("u1", "c1", "read", u64_frontier(0), 0)
    return LeaseKeeper(storage, [capability], every)  # type: ignore[arg-type]


async def test_a_shorter_lease_than_assumed_is_renewed_three_times_per_lease() -> None:
    storage = _Storage(lease_ms=600)
    keeper = _keeper(storage, every=30.0)
    async with keeper:
        await asyncio.sleep(1.1)
    assert keeper.lease_ms == 600
    # At 0, 0.2, 0.4 ... s; the interval given alone would have renewed once.
    assert 4 <= storage.renewals <= 7


async def test_a_longer_lease_keeps_the_interval_given() -> None:
    storage = _Storage(lease_ms=60_000)
    async with _keeper(storage, every=0.2):
        await asyncio.sleep(0.5)
    assert 2 <= storage.renewals <= 4


async def test_the_adapters_holds_renew_on_the_lease_storage_grants() -> None:
    storage = _Storage(lease_ms=600)
    client: Any = storage
    holds = CollectionHolds(client, "adapter", history_ms=1_000, renew_every=0.2)
    read = Capability("u1", "r1", "read", u64_frontier(0), 0)
    holds.adopt(CapabilityPair(read, replace(read, id="w1", kind="write")))
    holds.start()
    try:
        await asyncio.sleep(0.3)  # the first renewal, at once (adopted), says the lease
        holds.renew_every = 30.0  # as if configured for long leases
        await asyncio.sleep(1.0)
    finally:
        await holds.close()
    # Every 0.2 s throughout, where 30 s alone would have renewed once.
    assert 5 <= storage.renewals <= 8


async def test_the_adapter_renews_a_capability_taken_before_it_knows_the_lease_at_once() -> None:
    """Storage's lease (600 ms) is far shorter than the interval the adapter was given (30
    s): a capability taken before any renewal has said so is renewed at once, which learns
    the lease, and then three times per lease: no gap between renewals reaches the lease."""
    storage = _Storage(lease_ms=600)
    times: list[float] = []
    renew = storage.renew

    async def timed(capabilities: list[Capability]) -> RenewResult:
        times.append(asyncio.get_running_loop().time())
        return await renew(capabilities)

    storage.renew = timed  # type: ignore[method-assign]
    client: Any = storage
    holds = CollectionHolds(client, "adapter", history_ms=1_000, renew_every=30.0)
    holds.start()
    try:
        await asyncio.sleep(0.2)
        assert storage.renewals == 0  # nothing held: nothing to renew, nothing learnt
        read = Capability("u1", "r1", "read", u64_frontier(0), 0)
        holds.adopt(CapabilityPair(read, replace(read, id="w1", kind="write")))
        await asyncio.sleep(0.05)
        assert storage.renewals == 1  # at once, not 30 s later
        await asyncio.sleep(1.0)
    finally:
        await holds.close()
    # Every 0.2 s after the first (a loaded machine may stretch a gap, not to a lease).
    assert storage.renewals >= 4
    assert max(b - a for a, b in itertools.pairwise(times)) < 0.6
