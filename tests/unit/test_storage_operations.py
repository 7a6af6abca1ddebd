"""The storage state machine as pure functions: capability rules, appends, leases, compaction
bookkeeping, the merge plan, and the state's encoding."""

from __future__ import annotations

import pytest

from services.storage import operations as ops
from services.storage.compaction import needs_compaction, plan_merges
from services.storage.state import (
    CapabilityKind,
    CapabilityRecord,
    RetiredBlob,
    ShardState,
    StoredBatch,
)
from tidemark.columnar import ColumnType, RelationSchema
from tidemark.errors import (
    Aborted,
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
    Unavailable,
)
from tidemark.frontier import u64_frontier

SCHEMA = RelationSchema.of(("k", ColumnType.INT64))
POLICY = ops.Policy(lease_ms=1_000, max_capabilities=6, max_blob_age_ms=500, max_retired=3)
R_ID = "a" * 32
W_ID = "b" * 32
NOW = 10_000


def fresh(initial: int = 5) -> ShardState:
    state, _ = ops.initial_state("u1", SCHEMA, initial, R_ID, W_ID, "me", NOW, POLICY)
    return state


def test_initial_state_and_encoding_round_trip() -> None:
    state = fresh()
    assert state.since == state.upper == u64_frontier(5)
    kinds = {c.id: c.kind for c in state.capabilities}
    assert kinds == {R_ID: CapabilityKind.READ, W_ID: CapabilityKind.WRITE}
    assert all(c.lease_expires_ms == NOW + 1_000 for c in state.capabilities)
    busy = ShardState(
        "u1",
        SCHEMA,
        u64_frontier(3),
        u64_frontier(),
        (StoredBatch("shards/u1/k", u64_frontier(0), u64_frontier(9), u64_frontier(3), 4, 99),),
        (
            CapabilityRecord(
                W_ID, CapabilityKind.WRITE, u64_frontier(), 5, "h", "tok", u64_frontier(9)
            ),
        ),
        (RetiredBlob("shards/u1/old", 77),),
        12,
    )
    for value in (state, busy):
        assert ShardState.decode(value.encode()) == value


# -- appends ----------------------------------------------------------------------------------


def append(state: ShardState, **kwargs: object) -> tuple[ShardState, ops.AppendOutcome]:
    fields: dict[str, object] = {"capability_id": W_ID, "new_upper": u64_frontier(8)}
    fields.update(kwargs)
    request = ops.AppendRequest(**fields)  # type: ignore[arg-type]
    return ops.append(request, POLICY)(state, NOW + 100)


def test_append_moves_upper_capability_and_records_batch_and_token() -> None:
    state, outcome = append(
        fresh(),
        times=(5, 7),
        batch_key="k1",
        batch_rows=3,
        batch_bytes=10,
        blob_written_ms=NOW,
        token="t1",
    )
    assert outcome == ops.AppendOutcome(u64_frontier(8), already_committed=False)
    assert state.upper == u64_frontier(8)
    assert state.batches == (StoredBatch("k1", u64_frontier(5), u64_frontier(8), rows=3, size=10),)
    write = state.capability(W_ID)
    assert write is not None and write.frontier == u64_frontier(8)
    assert write.last_token == "t1" and write.lease_expires_ms == NOW + 1_100
    # The retry is recognised, even though the capability has moved on.
    again, retried = append(state, token="t1", new_upper=u64_frontier(8))
    assert again == state and retried == ops.AppendOutcome(u64_frontier(8), True)


def test_append_without_updates_only_advances_time() -> None:
    state, _ = append(fresh(), new_upper=u64_frontier())
    assert state.upper == u64_frontier() and state.batches == ()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"capability_id": R_ID}, PermissionDenied, "read capability"),
        ({"capability_id": "c" * 32}, PermissionDenied, "not a live capability"),
        ({"capability_id": "nothex"}, PermissionDenied, "not a live capability"),
        ({"expected_upper": u64_frontier(4)}, FailedPrecondition, r"upper \{5\}"),
        ({"new_upper": u64_frontier(5)}, FailedPrecondition, "not beyond"),
        ({"new_upper": u64_frontier(3)}, FailedPrecondition, "not beyond"),
        ({"times": (4, 6)}, InvalidArgument, r"time 4 lies outside \[\{5\}, \{8\}\)"),
        ({"times": (5, 8)}, InvalidArgument, r"time 8 lies outside"),
        (
            {"times": (5, 6), "batch_key": "k", "blob_written_ms": NOW - 1_000},
            Unavailable,
            "too long ago",
        ),
    ],
)
def test_append_refusals(kwargs: dict[str, object], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        append(fresh(), **kwargs)


def test_append_by_a_lagging_write_capability_names_the_upper() -> None:
    state, clone = ops.clone(W_ID, "c" * 32, "", POLICY)(fresh(), NOW)
    state, _ = append(state)
    with pytest.raises(FailedPrecondition, match=r"at \{5\}.*upper \{8\}"):
        append(state, capability_id=clone.id, new_upper=u64_frontier(9))
    state, _ = ops.downgrade(clone.id, u64_frontier(8), POLICY)(state, NOW)
    state, outcome = append(state, capability_id=clone.id, new_upper=u64_frontier(9))
    assert outcome.upper == u64_frontier(9)


def test_a_lagging_write_capability_may_append_when_it_names_the_upper() -> None:
    # Compare-and-append: with expected_upper equal to the upper, a write capability left
    # behind by another writer appends at the upper (not at its own frontier).
    state, clone = ops.clone(W_ID, "c" * 32, "", POLICY)(fresh(), NOW)
    state, _ = append(state)  # the other writer moves the upper to {8}; the clone stays at {5}
    with pytest.raises(InvalidArgument, match=r"time 6 lies outside \[\{8\}, \{9\}\)"):
        append(
            state,
            capability_id=clone.id,
            expected_upper=u64_frontier(8),
            new_upper=u64_frontier(9),
            times=(6, 8),
        )
    with pytest.raises(FailedPrecondition, match=r"expected upper \{5\}"):
        append(
            state, capability_id=clone.id, expected_upper=u64_frontier(5), new_upper=u64_frontier(9)
        )
    moved, outcome = append(
        state,
        capability_id=clone.id,
        expected_upper=u64_frontier(8),
        new_upper=u64_frontier(9),
        times=(8, 8),
        batch_key="k2",
        batch_rows=1,
        blob_written_ms=NOW,
    )
    assert outcome == ops.AppendOutcome(u64_frontier(9))
    assert moved.upper == u64_frontier(9)
    assert moved.batches == (StoredBatch("k2", u64_frontier(8), u64_frontier(9), rows=1),)
    lagging = moved.capability(clone.id)
    writer = moved.capability(W_ID)
    assert lagging is not None and lagging.frontier == u64_frontier(9)
    assert writer is not None and writer.frontier == u64_frontier(8)  # now it lags
    # Without expected_upper a capability behind the upper is still refused.
    with pytest.raises(FailedPrecondition, match=r"write capability 'bbbbbbbb…' is at \{8\}"):
        append(moved, new_upper=u64_frontier(10))


# -- capabilities -----------------------------------------------------------------------------


def test_since_is_the_meet_of_read_capabilities_and_only_advances() -> None:
    state, second = ops.clone(R_ID, "c" * 32, "other", POLICY)(fresh(), NOW)
    assert second.holder == "other" and second.frontier == u64_frontier(5)
    state, _ = ops.downgrade(R_ID, u64_frontier(9), POLICY)(state, NOW)
    assert state.since == u64_frontier(5)
    state, _ = ops.downgrade(second.id, u64_frontier(7), POLICY)(state, NOW)
    assert state.since == u64_frontier(7)
    state, _ = ops.drop(second.id)(state, NOW)
    assert state.since == u64_frontier(9)
    state, _ = ops.drop(R_ID)(state, NOW)
    assert state.since == u64_frontier()


def test_downgrade_backwards_is_refused_and_to_empty_removes() -> None:
    state = fresh()
    with pytest.raises(FailedPrecondition, match=r"from \{5\} to \{4\}"):
        ops.downgrade(R_ID, u64_frontier(4), POLICY)(state, NOW)
    state, record = ops.downgrade(W_ID, u64_frontier(), POLICY)(state, NOW)
    assert record.frontier == u64_frontier() and state.capability(W_ID) is None
    with pytest.raises(PermissionDenied):
        ops.drop(W_ID)(state, NOW)


def test_leases_expire_release_holds_and_renewal_keeps_them() -> None:
    state, _ = ops.downgrade(W_ID, u64_frontier(6), POLICY)(fresh(), NOW)
    state, (renewed, missing) = ops.renew([W_ID, "d" * 32], POLICY)(state, NOW + 900)
    assert [r.id for r in renewed] == [W_ID] and missing == ["d" * 32]
    later = ops.expire_leases(state, NOW + 1_000)
    assert later.capability(R_ID) is None and later.capability(W_ID) is not None
    # The last read hold lapsed rather than being dropped: the data stays readable.
    assert later.since == state.since
    assert ops.expire_leases(later, NOW + 1_900).capabilities == ()


def test_expiry_releases_a_hold_while_another_read_capability_remains() -> None:
    state, other = ops.clone(R_ID, "e" * 32, "other", POLICY)(fresh(), NOW)
    state, _ = ops.downgrade(other.id, u64_frontier(7), POLICY)(state, NOW)
    state, _ = ops.renew([other.id], POLICY)(state, NOW + 900)
    later = ops.expire_leases(state, NOW + 1_000)  # R_ID lapses; the clone lives on
    assert later.capability(R_ID) is None and later.capability(other.id) is not None
    assert later.since == u64_frontier(7)


def test_dropping_the_last_read_capability_releases_the_data() -> None:
    state, _ = ops.drop(R_ID)(fresh(), NOW)
    assert state.since == u64_frontier()


def test_use_renews_only_when_half_the_lease_is_gone() -> None:
    state = fresh()
    same, record = ops.use(R_ID, CapabilityKind.READ, POLICY)(state, NOW + 400)
    assert same is state and record.lease_expires_ms == NOW + 1_000
    _, record = ops.use(R_ID, CapabilityKind.READ, POLICY)(state, NOW + 600)
    assert record.lease_expires_ms == NOW + 1_600
    with pytest.raises(PermissionDenied, match="write capability"):
        ops.use(W_ID, CapabilityKind.READ, POLICY)(state, NOW)


def test_acquire_gives_current_frontiers_and_useless_ones_when_closed() -> None:
    state, _ = append(fresh())
    state, (read, write) = ops.acquire("c" * 32, "d" * 32, "x", POLICY)(state, NOW)
    assert read.frontier == u64_frontier(5) and write.frontier == u64_frontier(8)
    assert state.capability(read.id) and state.capability(write.id)
    state, _ = append(state, capability_id=write.id, new_upper=u64_frontier())
    for cap in (R_ID, read.id):
        state, _ = ops.drop(cap)(state, NOW)
    state, (read, write) = ops.acquire("e" * 32, "f" * 32, "x", POLICY)(state, NOW)
    assert read.id == "" and read.frontier == u64_frontier()
    assert write.id == "" and write.frontier == u64_frontier()


def test_capability_count_is_bounded() -> None:
    state = fresh()
    for n in range(4):
        state, _ = ops.clone(R_ID, f"{n:032x}", "", POLICY)(state, NOW)
    with pytest.raises(FailedPrecondition, match="limit 6"):
        ops.clone(R_ID, "9" * 32, "", POLICY)(state, NOW)


def test_holder_and_token_lengths_are_bounded() -> None:
    with pytest.raises(InvalidArgument, match="holder"):
        ops.clone(R_ID, "c" * 32, "h" * 201, POLICY)
    with pytest.raises(InvalidArgument, match="token"):
        ops.check_token("t" * 129)


# -- compaction bookkeeping -------------------------------------------------------------------


def batch(key: str, lower: int, upper: int, rows: int = 1) -> StoredBatch:
    return StoredBatch(key, u64_frontier(lower), u64_frontier(upper), rows=rows)


def test_replace_batches_swaps_a_run_retires_and_evicts_beyond_the_cap() -> None:
    state = fresh()
    state = ShardState(
        "u1",
        SCHEMA,
        state.since,
        u64_frontier(4),
        tuple(batch(f"k{i}", i, i + 1) for i in range(4)),
    )
    merged = batch("m", 1, 3, 2)
    state, evicted = ops.replace_batches(["k1", "k2"], merged, NOW, POLICY)(state, NOW)
    assert [b.key for b in state.batches] == ["k0", "m", "k3"] and evicted == []
    assert [r.key for r in state.retired] == ["k1", "k2"]
    state, evicted = ops.replace_batches(["k0", "m"], None, NOW, POLICY)(state, NOW + 1)
    assert [b.key for b in state.batches] == ["k3"]
    assert evicted == ["k1"] and [r.key for r in state.retired] == ["k2", "k0", "m"]
    with pytest.raises(Aborted):
        ops.replace_batches(["k0", "k3"], None, NOW, POLICY)(state, NOW)
    with pytest.raises(Aborted, match="too long"):
        ops.replace_batches(["k3"], batch("n", 3, 4), NOW - 600, POLICY)(state, NOW)
    state, _ = ops.forget_retired(["k2", "m"])(state, NOW)
    assert [r.key for r in state.retired] == ["k0"]


def test_merge_plan_keeps_a_logarithmic_number_of_batches() -> None:
    batches: list[StoredBatch] = []
    worst = 0
    for n in range(1, 10_001):
        batches.append(batch(f"k{n}", n, n + 1))
        for start, end in reversed(plan_merges(batches)):
            rows = sum(b.rows for b in batches[start:end])
            batches[start:end] = [batch(f"m{n}-{start}", start, end, rows)]
        worst = max(worst, len(batches))
        assert sum(b.rows for b in batches) == n
    assert len(batches) == bin(10_000).count("1")
    assert worst <= 14  # log2(10_000) ~ 13.3


def test_merge_plan_on_uneven_sizes() -> None:
    assert plan_merges([batch("a", 0, 1, 100), batch("b", 1, 2, 10)]) == []
    assert plan_merges([batch("a", 0, 1, 100), batch("b", 1, 2, 60)]) == [(0, 2)]
    big_then_small = [batch("a", 0, 1, 100), batch("b", 1, 2, 3), batch("c", 2, 3, 3)]
    assert plan_merges(big_then_small) == [(1, 3)]


def test_needs_compaction_when_nothing_is_readable() -> None:
    state = ShardState("u1", SCHEMA, u64_frontier(), u64_frontier(3), (batch("a", 0, 3, 10),))
    assert needs_compaction(state)
