"""Partitioning stateful operators across shards: a stable key encoding, shard assignment that
agrees across processes, exchange, and output that does not depend on the shard count."""

from __future__ import annotations

import datetime
import json
import os
import random
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.compute.dataflow import Dataflow, Update, encode_key, shard_of
from services.compute.dataflow.exchange import exchange, partition
from services.compute.dataflow.keys import key_hash
from tidemark.columnar import ColumnType as T
from tidemark.columnar import RelationSchema
from tidemark.plan import builders as pb
from tidemark.v1 import plan_pb2

ROOT = Path(__file__).resolve().parents[2]
Row = tuple[Any, ...]


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((0.0,), (-0.0,)),
        ((float("nan"),), (-float("nan"),)),
        ((Decimal("1.5"),), (Decimal("1.50"),)),
        ((Decimal("0"),), (Decimal("-0.00"),)),
        ((Decimal("100"),), (Decimal("1E+2"),)),
        (
            (Decimal("1234567890123456789012345678901234.5678"),),
            (Decimal("1234567890123456789012345678901234.56780"),),
        ),
    ],
)
def test_equal_values_encode_equally(a: Row, b: Row) -> None:
    assert encode_key(a) == encode_key(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((1,), (True,)),
        ((1,), (1.0,)),
        (("a", "b"), ("ab", "")),  # length prefixes keep column boundaries
        ((b"a",), ("a",)),
        ((None,), ("",)),
        (
            (Decimal("1234567890123456789012345678901234.5678"),),
            (Decimal("1234567890123456789012345678901234.5679"),),
        ),
        ((datetime.date(2020, 1, 2),), (datetime.datetime(2020, 1, 2),)),
    ],
)
def test_different_values_encode_differently(a: Row, b: Row) -> None:
    assert encode_key(a) != encode_key(b)


KEYS: list[Row] = [
    (1,),
    ("a",),
    (None,),
    (
        1,
        "x",
        Decimal("1.50"),
        2.5,
        True,
        b"\x00",
        datetime.date(2020, 1, 2),
        datetime.datetime(2020, 1, 2, 3, 4, 5, 6),
    ),
]


def test_shards_are_pinned_values_of_the_stable_key_hash() -> None:
    """The assignment is part of the wire contract between driver and tasks: pin it."""
    assert [shard_of(key, 7) for key in KEYS] == [6, 0, 6, 4]
    assert all(shard_of(key, 1) == 0 for key in KEYS)


def test_shards_agree_across_processes_with_different_hash_seeds() -> None:
    script = (
        "import datetime, json, sys; from decimal import Decimal; "
        "from services.compute.dataflow import shard_of; "
        f"keys = {KEYS!r}; "
        "more = [shard_of((str(i),), 5) for i in range(50)]; "
        "print(json.dumps([shard_of(k, 5) for k in keys] + more))"
    )
    results = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", script],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        results.append(json.loads(done.stdout))
    here = [shard_of(k, 5) for k in KEYS] + [shard_of((str(i),), 5) for i in range(50)]
    assert results[0] == results[1] == here
    assert len(set(here)) == 5  # and the keys do spread


def test_exchange_sends_each_update_to_the_owner_of_its_key() -> None:
    updates: list[Update] = [((f"k{i % 13}", i), i, 1) for i in range(100)]

    def route(row: Row) -> Row:
        return (row[0],)

    held = [updates[:40], updates[40:], []]
    received = exchange(held, route, 3)
    assert sorted(u for part in received for u in part) == sorted(updates)
    for shard, part in enumerate(received):
        assert all(shard_of(route(u[0]), 3) == shard for u in part)
    assert partition(updates, route, 1) == [updates]


# One column type per key column, as a route's keys have; repeats, None, NaN and -0.0 among
# them, the values a key memo could mix up.
_COLUMN_VALUES = {
    "int": st.one_of(st.none(), st.integers(-3, 3), st.integers()),
    "float": st.one_of(
        st.none(), st.sampled_from([0.0, -0.0, 1.5, float("nan"), float("inf")]), st.floats()
    ),
    "text": st.one_of(st.none(), st.sampled_from(["", "a", "é"]), st.text(max_size=3)),
    "decimal": st.one_of(
        st.none(),
        st.sampled_from(
            [Decimal("1.5"), Decimal("1.50"), Decimal("0"), Decimal("-0.00"), Decimal("1E+2")]
        ),
        st.decimals(allow_nan=False, allow_infinity=False, places=2),
    ),
    "bool": st.one_of(st.none(), st.booleans()),
    "bytes": st.one_of(st.none(), st.sampled_from([b"", b"a"]), st.binary(max_size=3)),
    "date": st.one_of(st.none(), st.dates()),
    "timestamp": st.one_of(st.none(), st.datetimes()),
}


@st.composite
def typed_updates(draw: st.DrawFn) -> list[Update]:
    kinds = draw(st.lists(st.sampled_from(sorted(_COLUMN_VALUES)), min_size=1, max_size=3))
    row = st.tuples(*(_COLUMN_VALUES[kind] for kind in kinds))
    rows = draw(st.lists(row, max_size=40))
    # Rows again, as a step's retractions and insertions repeat them.
    rows += draw(st.lists(st.sampled_from(rows), max_size=20)) if rows else []
    return [(r, t, 1 if t % 2 else -1) for t, r in enumerate(rows)]


@given(typed_updates(), st.integers(2, 5))
def test_partition_routes_every_update_as_shard_of_its_key_in_order(
    updates: list[Update], shards: int
) -> None:
    def route(row: Row) -> Row:
        return row[::-1]

    expected: list[list[Update]] = [[] for _ in range(shards)]
    for update in updates:
        expected[shard_of(route(update[0]), shards)].append(update)
    assert partition(updates, route, shards) == expected


def test_keys_python_finds_equal_hash_apart_across_classes() -> None:
    # Why partition needs one class per key column: its memo shares a shard between keys
    # Python finds equal, which shard_of would hash apart across classes.
    assert (1,) == (1.0,) == (True,) == (Decimal(1),)
    hashes = {key_hash((1,)), key_hash((1.0,)), key_hash((True,)), key_hash((Decimal(1),))}
    assert len(hashes) == 4


# -- P = 3 against P = 1 -------------------------------------------------------------------------

ORDERS = RelationSchema.of(("o", T.INT64), ("cust", T.INT64), ("amount", T.INT64))
CUSTOMERS = RelationSchema.of(("cust", T.INT64), ("region", T.TEXT))


def sharded_plan() -> plan_pb2.Relation:
    joined = pb.join(
        pb.get("orders", ORDERS), pb.get("customers", CUSTOMERS), [1], [0], kind="full_outer"
    )
    per_region = pb.reduce(
        joined,
        [4],
        [
            pb.aggregate("count"),
            pb.aggregate("sum", 2),
            pb.aggregate("max", 2),
            pb.aggregate("count", 1, distinct=True),
        ],
    )
    best = pb.top_k(joined, [4], [pb.sort_key(2, descending=True)], limit=2)
    regions = pb.distinct(pb.project(joined, 4))
    positive = pb.threshold(
        pb.union(
            pb.project(pb.get("orders", ORDERS), 1),
            pb.negate(pb.project(pb.get("customers", CUSTOMERS), 0)),
        )
    )
    return pb.union(
        pb.project(per_region, 0, 1),
        pb.project(pb.map(best, pb.cast(2, T.TEXT)), 4, 1),
        pb.map(regions, pb.literal(-1, T.INT64)),
        pb.project(pb.map(positive, pb.literal("p", T.TEXT)), 1, 0),
    )


def random_histories(seed: int, times: int) -> dict[str, list[Update]]:
    rng = random.Random(seed)
    orders: dict[int, Row] = {}
    customers: dict[int, Row] = {}
    history: dict[str, list[Update]] = {"orders": [], "customers": []}
    for time in range(times):
        for _ in range(rng.randint(0, 12)):
            if rng.random() < 0.25:
                cust = rng.randrange(12)
                old = customers.pop(cust, None)
                if old is not None:
                    history["customers"].append((old, time, -1))
                if rng.random() < 0.8:
                    customers[cust] = (cust, rng.choice(["n", "s", "e", "w", None]))
                    history["customers"].append((customers[cust], time, 1))
            else:
                o = rng.randrange(60)
                old = orders.pop(o, None)
                if old is not None:
                    history["orders"].append((old, time, -1))
                if rng.random() < 0.85:
                    orders[o] = (o, rng.choice([*range(14), None]), rng.randrange(1, 50))
                    history["orders"].append((orders[o], time, 1))
    return history


def run(
    shards: int, history: dict[str, list[Update]], as_of: int, uppers: list[int]
) -> tuple[list[list[Update]], Dataflow]:
    dataflow = Dataflow(sharded_plan(), as_of=as_of, shards=shards)
    out = [dataflow.hydrate({k: [u for u in v if u[1] <= as_of] for k, v in history.items()})[0]]
    for upper in uppers:
        lower = dataflow.upper
        assert lower is not None
        out.append(
            dataflow.step(
                {k: [u for u in v if lower <= u[1] < upper] for k, v in history.items()}, upper
            )[0]
        )
    return out, dataflow


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_three_shards_give_exactly_the_output_of_one(seed: int) -> None:
    history = random_histories(seed, 40)
    uppers = [6, 7, 15, 16, 30, 40]
    single, one = run(1, history, 5, uppers)
    sharded, three = run(3, history, 5, uppers)
    assert single == sharded  # batch by batch, byte for byte
    assert sum(len(batch) for batch in single) > 50
    # The state really is split: every shard holds keys, and all of them together hold
    # exactly what one shard holds alone.
    per_shard = [worker.key_count() for worker in three.workers]
    assert all(per_shard) and sum(per_shard) == one.key_count()
