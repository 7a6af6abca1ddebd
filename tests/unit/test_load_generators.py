"""The load generators: deterministic ticks, exact replay, Materialize's relations and
options, and TPC-H's cardinalities (against DuckDB's dbgen)."""

from __future__ import annotations

import asyncio
import datetime
from collections import Counter as Multiset
from decimal import Decimal

import pytest

from tidemark.columnar import ColumnType, Row, table_from_updates
from tidemark.sources.ingest import changes_equal
from tidemark.sources.loadgen import LoadGeneratorReader, LoadGeneratorSpec, generator_for
from tidemark.sources.loadgen.base import MAX_TICKS_PER_BATCH
from tidemark.sources.reader import Changes, SourceBatch, decode_u64, encode_u64


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def spec(generator: str, **options: object) -> LoadGeneratorSpec:
    return LoadGeneratorSpec(generator=generator, start_time_ms=1_700_000_000_000, **options)  # type: ignore[arg-type]


def contents(changes: Changes, name: str) -> Multiset[Row]:
    counts: Multiset[Row] = Multiset()
    for row, diff in changes.get(name, []):
        counts[row] += diff
    return +counts


def merged(*batches: Changes) -> dict[str, list[tuple[Row, int]]]:
    out: dict[str, list[tuple[Row, int]]] = {}
    for batch in batches:
        for name, pairs in batch.items():
            out.setdefault(name, []).extend(pairs)
    return out


async def take(reader: LoadGeneratorReader, count: int) -> list[SourceBatch]:
    out = []
    iterator = aiter(reader.batches())
    for _ in range(count):
        out.append(await asyncio.wait_for(anext(iterator), 5))
    return out


# -- COUNTER ----------------------------------------------------------------------------------


def test_counter_counts_from_one_and_max_cardinality_keeps_the_newest() -> None:
    counter = generator_for(spec("COUNTER"))
    assert [c.name for c in counter.schemas()["counter"].columns] == ["counter"]
    assert counter.schemas()["counter"].columns[0].type is ColumnType.INT64
    assert sorted(contents(counter.ticks(0, 5), "counter").elements()) == [
        (1,), (2,), (3,), (4,), (5,)
    ]  # fmt: skip
    bounded = generator_for(spec("COUNTER", max_cardinality=3))
    assert sorted(contents(bounded.ticks(0, 10), "counter").elements()) == [(8,), (9,), (10,)]
    assert bounded.tick(3)["counter"] == [((4,), 1), ((1,), -1)]
    assert bounded.tick(2)["counter"] == [((3,), 1)]


async def test_counter_ticks_follow_the_clock_and_catch_up_in_batches() -> None:
    clock = Clock(1_700_000_000.0)
    reader = LoadGeneratorReader(generator_for(spec("COUNTER", tick_interval_ms=100)), clock=clock)
    await reader.start(None)
    (first,) = await take(reader, 1)
    assert decode_u64(first.offset) == 1 and first.changes == {"counter": [((1,), 1)]}
    clock.now += 0.25  # ticks 1 and 2 are due
    (second,) = await take(reader, 1)
    assert decode_u64(second.offset) == 3
    assert sorted(second.changes["counter"]) == [((2,), 1), ((3,), 1)]
    # Far behind: the missed ticks come at once, in bounded batches.
    clock.now += 0.1 * (MAX_TICKS_PER_BATCH + 10)
    big, rest = await take(reader, 2)
    assert decode_u64(big.offset) == 3 + MAX_TICKS_PER_BATCH
    # Now is 101.25 s after tick 0: ticks 0 .. 1012 are due.
    assert decode_u64(rest.offset) == 1013
    values = sorted(v for (v,), _ in big.changes["counter"] + rest.changes["counter"])
    assert values == list(range(4, 1014))


async def test_a_resumed_reader_starts_after_the_offset_and_up_to_stops() -> None:
    clock = Clock(1_700_000_000.0 + 100)
    reader = LoadGeneratorReader(generator_for(spec("COUNTER", up_to=7)), clock=clock)
    await reader.start(encode_u64(4))
    batches = [b async for b in reader.batches()]  # ends: UP TO 7
    assert [decode_u64(b.offset) for b in batches] == [7]
    assert sorted(batches[0].changes["counter"]) == [((5,), 1), ((6,), 1), ((7,), 1)]


# -- determinism and replay -------------------------------------------------------------------


@pytest.mark.parametrize("generator", ["COUNTER", "AUCTION", "TPCH"])
async def test_replay_rebuilds_exactly_the_batches_the_reader_made(generator: str) -> None:
    options: dict[str, object] = {"tick_interval_ms": 10}
    if generator == "TPCH":
        options["scale_factor"] = 0.001
    clock = Clock(1_700_000_000.0)
    reader = LoadGeneratorReader(generator_for(spec(generator, **options)), clock=clock)
    await reader.start(None)
    batches = []
    previous: bytes | None = None
    bounds = []
    for step in (0.0, 0.035, 0.01, 0.2):
        clock.now += step
        (batch,) = await take(reader, 1)
        batches.append(batch)
        bounds.append((previous, batch.offset))
        previous = batch.offset
    # A fresh reader (another process, after a crash) rebuilds each batch exactly.
    other = LoadGeneratorReader(generator_for(spec(generator, **options)), clock=Clock())
    for (start, end), batch in zip(bounds, batches, strict=True):
        replayed = await other.replay(start, end)
        assert changes_equal(replayed, batch.changes)
        assert replayed == batch.changes  # the same rows in the same order, even
    # ... and a batch is not another one.
    assert not changes_equal(await other.replay(*bounds[1]), batches[2].changes)
    # Resuming after a batch gives exactly the later ones.
    resumed = LoadGeneratorReader(generator_for(spec(generator, **options)), clock=clock)
    await resumed.start(batches[1].offset)
    (after,) = await take(resumed, 1)
    assert changes_equal(after.changes, merged(batches[2].changes, batches[3].changes))


@pytest.mark.parametrize("generator", ["COUNTER", "AUCTION", "TPCH"])
def test_rows_fit_the_schemas_the_catalog_records(generator: str) -> None:
    made = generator_for(spec(generator, scale_factor=0.001))
    schemas = made.schemas()
    changes = made.ticks(0, 4)
    assert set(changes) <= set(schemas)
    for name, pairs in changes.items():
        table = table_from_updates(schemas[name], [(row, 1, diff) for row, diff in pairs])
        assert table.num_rows == len(pairs)
        assert table.schema.names[:-2] == schemas[name].names


# -- AUCTION ----------------------------------------------------------------------------------


def test_auction_makes_the_relations_materialize_makes_with_consistent_references() -> None:
    auction = generator_for(spec("AUCTION"))
    assert {name: schema.names for name, schema in auction.schemas().items()} == {
        "organizations": ["id", "name"],
        "users": ["id", "org_id", "name"],
        "accounts": ["id", "org_id", "balance"],
        "auctions": ["id", "seller", "item", "end_time"],
        "bids": ["id", "buyer", "auction_id", "amount", "bid_time"],
    }
    changes = auction.ticks(0, 200)
    users = {row[0] for row in contents(changes, "users")}
    organizations = {row[0] for row in contents(changes, "organizations")}
    assert {row[1] for row in contents(changes, "users")} <= organizations
    auctions = {row[0]: row for row in contents(changes, "auctions")}
    assert sorted(auctions) == list(range(1, 200))
    bids = list(contents(changes, "bids").elements())
    assert bids and len({b[0] for b in bids}) == len(bids)  # bid ids are unique
    for _, buyer, auction_id, amount, bid_time in bids:
        assert buyer in users and 1 <= amount < 100
        opened = auction.spec.tick_time(auction_id)
        # A bid lands on an auction that is open: after it opened, before it ends.
        assert opened <= bid_time < auctions[auction_id][3]
    assert auction.spec.tick_time(1) == datetime.datetime(2023, 11, 14, 22, 13, 21)


# -- TPCH -------------------------------------------------------------------------------------


def test_tpch_cardinalities_match_dbgen() -> None:
    """Row counts against DuckDB's TPC-H extension at the same scale factor (lineitem has one
    to seven lines per order drawn at random: within 2 % of dbgen's)."""
    from tests.support.tpch_workload import TABLES, tpch_duckdb

    tpch = generator_for(spec("TPCH", scale_factor=0.01))
    initial = tpch.tick(0)
    assert set(initial) == set(TABLES) == set(tpch.schemas())
    duck = tpch_duckdb(0.01)
    for table in TABLES:
        (expected,) = duck.execute(f"SELECT count(*) FROM {table}").fetchone()  # type: ignore[misc]
        made = len(initial[table])
        if table == "lineitem":
            assert abs(made - expected) < 0.02 * expected, (table, made, expected)
        else:
            assert made == expected, (table, made, expected)
        # The same columns in the same order as dbgen's.
        columns = [d[0] for d in duck.execute(f"SELECT * FROM {table} LIMIT 0").description]
        assert tpch.schemas()[table].names == columns


def test_tpch_changes_replace_whole_orders_and_keep_keys_consistent() -> None:
    tpch = generator_for(spec("TPCH", scale_factor=0.001))
    orders_count = len(tpch.tick(0)["orders"])
    state = merged(tpch.ticks(0, 1))
    changed = merged(state, tpch.ticks(1, orders_count + 20))  # a round and then some
    orders = contents(changed, "orders")
    items = contents(changed, "lineitem")
    # Every retraction met its insertion: nothing negative, one row per order key.
    assert all(count == 1 for count in orders.values())
    assert len({row[0] for row in orders}) == orders_count == len(orders)
    keys = {row[0] for row in orders}
    assert {row[0] for row in items} == keys
    # Totals follow their line items; lines are numbered from 1.
    for order in orders:
        lines = sorted((r for r in items if r[0] == order[0]), key=lambda r: r[3])
        assert [r[3] for r in lines] == list(range(1, len(lines) + 1))
        total = sum((r[5] * (1 + r[7]) * (1 - r[6])).quantize(Decimal("0.01")) for r in lines)
        assert abs(total - order[3]) <= Decimal("0.01") * len(lines)
    # Ticks did change orders.
    assert contents(changed, "orders") != contents(state, "orders")
