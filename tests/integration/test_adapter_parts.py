"""The adapter's parts that need no other process: transactions and their wire form, the
finishing of results, index matching, session settings, value encoding, the catalog copy and
the write path (against in-memory stand-ins for the catalog and storage)."""

from __future__ import annotations

import asyncio
import datetime
import math
from collections.abc import AsyncIterator, Sequence
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from services.adapter.backends import parse_compute_endpoints
from services.adapter.catalog_cache import CatalogCache, CatalogState
from services.adapter.finishing import apply_finishing
from services.adapter.index_match import indexed_relations, match_indexes
from services.adapter.results import error_from_backend, sql_value
from services.adapter.session import Settings
from services.adapter.sql.errors import SqlError
from services.adapter.sql.planned import Finishing, SortSpec
from services.adapter.transactions import Transaction
from services.adapter.writes import ReadSet, TableWriter
from tidemark.clients.catalog import CatalogChange, CatalogProgress
from tidemark.clients.storage import AppendResult
from tidemark.columnar import Column, ColumnType, RelationSchema, from_ipc, to_ipc
from tidemark.columnar.rows import updates_from_table
from tidemark.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, Unavailable
from tidemark.frontier import u64_frontier
from tidemark.plan import builders as pb
from tidemark.v1 import catalog_pb2, plan_pb2

SCHEMA = RelationSchema(
    [
        Column("id", ColumnType.INT64, nullable=False),
        Column("amount", ColumnType.DECIMAL, precision=10, scale=2),
        Column("day", ColumnType.DATE),
        Column("name", ColumnType.TEXT),
    ]
)


# -- transactions ---------------------------------------------------------------------------


def test_transaction_round_trips_through_its_bytes() -> None:
    transaction = Transaction(read_ts=42, reads={"u1", "u2"}, read_sources={"u3"})
    rows = [
        ((1, Decimal("1.50"), datetime.date(2024, 2, 29), "a"), 1),
        ((2, None, None, None), -1),
        ((1, Decimal("1.50"), datetime.date(2024, 2, 29), "a"), 1),
    ]
    transaction.add_write("u1", "t", SCHEMA, rows)
    decoded = Transaction.decode(transaction.encode())
    assert decoded.read_ts == 42
    assert decoded.reads == {"u1", "u2"}
    assert decoded.read_sources == {"u3"}
    assert decoded.write is not None
    assert decoded.write.table_id == "u1"
    assert decoded.write.schema == SCHEMA
    assert sorted(decoded.write.consolidated(), key=repr) == sorted(
        [((1, Decimal("1.50"), datetime.date(2024, 2, 29), "a"), 2), ((2, None, None, None), -1)],
        key=repr,
    )
    empty = Transaction.decode(Transaction().encode())
    assert empty.read_ts is None and empty.write is None and not empty.failed


@pytest.mark.parametrize("data", [b"junk", b"TMTX\x00\x00\x00\x05{bad}", b"TMTX\x00\x00\x00"])
def test_a_malformed_transaction_is_invalid_argument(data: bytes) -> None:
    with pytest.raises(InvalidArgument, match="malformed session transaction"):
        Transaction.decode(data)


def test_transaction_rules() -> None:
    transaction = Transaction()
    transaction.add_write("u1", "t1", SCHEMA, [((1, None, None, None), 1)])
    with pytest.raises(SqlError) as second_table:
        transaction.add_write("u2", "t2", SCHEMA, [((1, None, None, None), 1)])
    assert second_table.value.code == "0A000"
    with pytest.raises(SqlError) as read_after_write:
        transaction.check_can_read()
    assert read_after_write.value.code == "0A000"
    read_only = Transaction(read_only=True)
    with pytest.raises(SqlError) as refused:
        read_only.add_write("u1", "t1", SCHEMA, [])
    assert refused.value.code == "25006"


# -- finishing ------------------------------------------------------------------------------


def test_finishing_orders_like_the_plan_contract() -> None:
    rows = [(3.0, "c"), (None, "n"), (math.nan, "nan"), (-1.0, "a"), (2.0, "b")]
    ascending = Finishing((SortSpec(0),), None, 0, (1,))
    assert apply_finishing(rows, ascending) == [("a",), ("b",), ("c",), ("nan",), ("n",)]
    descending = Finishing((SortSpec(0, descending=True, nulls_first=True),), 2, 1, (1,))
    assert apply_finishing(rows, descending) == [("nan",), ("c",)]
    nulls_first = Finishing((SortSpec(0, nulls_first=True),), 1, 0, (0, 1))
    assert apply_finishing(rows, nulls_first) == [(None, "n")]
    two_keys = Finishing((SortSpec(1, descending=True), SortSpec(0)), None, 0, (0,))
    assert apply_finishing([(2, "x"), (1, "x"), (5, "y")], two_keys) == [(5,), (1,), (2,)]


# -- index matching -------------------------------------------------------------------------


def _items() -> list[catalog_pb2.CatalogItem]:
    schema = RelationSchema([Column("a", ColumnType.INT64), Column("b", ColumnType.TEXT)])
    view_plan = pb.plan(
        pb.filter(
            pb.get("u1", schema), pb.call("gt", pb.column(0), pb.literal(1, ColumnType.INT64))
        ),
        schema,
    )
    return [
        catalog_pb2.CatalogItem(
            id="u1",
            name=catalog_pb2.QualifiedName(database="d", schema="s", item="t"),
            table=catalog_pb2.Table(schema=schema.to_proto(), collection_id="u1"),
        ),
        catalog_pb2.CatalogItem(
            id="u2",
            name=catalog_pb2.QualifiedName(database="d", schema="s", item="t2"),
            table=catalog_pb2.Table(schema=schema.to_proto(), collection_id="u2"),
        ),
        catalog_pb2.CatalogItem(
            id="u3",
            name=catalog_pb2.QualifiedName(database="d", schema="s", item="v"),
            view=catalog_pb2.View(
                sql="...", schema=schema.to_proto(), plan=view_plan.SerializeToString()
            ),
        ),
        catalog_pb2.CatalogItem(
            id="u4",
            name=catalog_pb2.QualifiedName(database="d", schema="s", item="v_idx"),
            index=catalog_pb2.Index(on_id="u3", key_columns=["a"], cluster_id="s4"),
        ),
        catalog_pb2.CatalogItem(
            id="u5",
            name=catalog_pb2.QualifiedName(database="d", schema="s", item="t2_idx"),
            index=catalog_pb2.Index(on_id="u2", key_columns=["a"], cluster_id="s9"),
        ),
    ]


def test_index_matching_replaces_indexed_subtrees() -> None:
    items = _items()
    view_root = plan_pb2.Plan.FromString(items[2].view.plan).root
    indexes = indexed_relations(items, "s4")
    assert [i.index_id for i in indexes] == ["u4"]
    # SELECT b FROM v: the view's plan (Get schemas aside) under a projection.
    bare = plan_pb2.Relation()
    bare.CopyFrom(view_root)
    bare.filter.input.get.ClearField("schema")
    query = pb.plan(pb.project(bare, 1))
    peek = match_indexes(query, indexes)
    assert peek is not None
    assert peek.dataflow_id == "u4"
    assert peek.finishing is not None
    assert peek.finishing.root.project.input.get.collection_id == "u4"
    # The view itself: no finishing needed.
    whole = match_indexes(pb.plan(view_root), indexes)
    assert whole is not None and whole.finishing is None
    # A query that also reads a collection no index of the cluster holds: no index peek.
    schema = RelationSchema([Column("a", ColumnType.INT64), Column("b", ColumnType.TEXT)])
    joined = pb.plan(pb.union(view_root, pb.get("u1", schema)))
    assert match_indexes(joined, indexes) is None
    # The index of t2 lives on another cluster.
    assert match_indexes(pb.plan(pb.get("u2", schema)), indexes) is None
    other = match_indexes(pb.plan(pb.get("u2", schema)), indexed_relations(items, "s9"))
    assert other is not None and other.dataflow_id == "u5"


# -- settings, endpoints, values, errors --------------------------------------------------------


def test_settings_validate_and_canonicalise() -> None:
    settings = Settings({})
    assert settings.cluster == "default" and settings.database == "tidemark"
    settings.set("TRANSACTION ISOLATION LEVEL", "  SERIALIZABLE ")
    assert settings.get("transaction_isolation") == "serializable"
    settings.set("search_path", 'other, "Quoted"')
    assert settings.search_path == ["other", "Quoted"]
    settings.set("statement_timeout", "250")
    assert settings.statement_timeout_ms == 250
    for name, value, code in [
        ("nope", "1", "42704"),
        ("statement_timeout", "soon", "22023"),
        ("transaction_isolation", "read committed", "22023"),
        ("cluster", "", "22023"),
    ]:
        with pytest.raises(SqlError) as error:
            settings.set(name, value)
        assert error.value.code == code
    settings.reset("statement_timeout")
    assert settings.statement_timeout_ms == 0
    client_kept = Settings({"my_client_thing": "x", "cluster": "c"})
    client_kept.check()
    assert client_kept.values == {"my_client_thing": "x", "cluster": "c"}
    with pytest.raises(SqlError):
        Settings({"statement_timeout": "-5"}).check()


def test_compute_endpoints() -> None:
    assert parse_compute_endpoints("default=h:1, big = h:2") == {"default": "h:1", "big": "h:2"}
    for bad in ("default", "=h:1", "a=h:1,a=h:2", "a="):
        with pytest.raises(ValueError):
            parse_compute_endpoints(bad)


def test_values_travel_as_the_proto_says() -> None:
    assert sql_value(None).WhichOneof("value") is None
    assert sql_value(True).bool_value is True
    assert sql_value(-3).int_value == -3
    assert sql_value(0.5).float_value == 0.5
    assert sql_value(Decimal("0E-10")).text_value == "0.0000000000"
    assert sql_value(Decimal("-0.00")).text_value == "0.00"
    assert sql_value(Decimal("12.50")).text_value == "12.50"
    assert sql_value(datetime.date(2024, 1, 2)).text_value == "2024-01-02"
    stamp = datetime.datetime(2024, 1, 2, 3, 4, 5, 6)
    assert sql_value(stamp).text_value == "2024-01-02 03:04:05.000006"
    assert sql_value(b"\x00\x01").bytes_value == b"\x00\x01"


def test_backend_failures_map_to_sqlstates() -> None:
    assert error_from_backend(Unavailable("down")).code == "08006"
    assert error_from_backend(DeadlineExceeded("slow")).code == "57014"
    assert error_from_backend(FailedPrecondition("since")).code == "55000"


# -- the catalog copy -----------------------------------------------------------------------


def _table(global_id: str, name: str) -> catalog_pb2.CatalogItem:
    return catalog_pb2.CatalogItem(
        id=global_id,
        name=catalog_pb2.QualifiedName(database="d", schema="s", item=name),
        table=catalog_pb2.Table(collection_id=global_id),
    )


class FakeCatalog:
    """Serves a subscription from a queue the test fills."""

    def __init__(self) -> None:
        self.reports: asyncio.Queue[CatalogProgress] = asyncio.Queue()
        self.snapshots: list[int] = []

    async def subscribe_at(self, timestamp: int) -> AsyncIterator[CatalogProgress]:
        while True:
            yield await self.reports.get()

    async def snapshot_at(self, timestamp: int, **options: Any) -> Any:
        self.snapshots.append(timestamp)
        raise AssertionError("the copy should have answered from memory")


async def test_catalog_copy_answers_at_past_times_and_reports_drops() -> None:
    fake = FakeCatalog()
    cache = CatalogCache(fake)  # type: ignore[arg-type]
    seen: list[list[CatalogChange]] = []
    cache.add_listener(seen.append)
    t1, t2 = _table("u1", "a"), _table("u2", "b")
    await fake.reports.put(CatalogProgress([CatalogChange(t1, 10, 1)], 11))
    await cache.start(10)
    assert [i.id for i in cache.latest()] == ["u1"]
    waiting = asyncio.create_task(cache.state_at(20))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    renamed = _table("u1", "a2")
    await fake.reports.put(
        CatalogProgress(
            [CatalogChange(t2, 15, 1), CatalogChange(t1, 20, -1), CatalogChange(renamed, 20, 1)],
            21,
        )
    )
    at_20 = await waiting
    assert sorted(i.name.item for i in at_20) == ["a2", "b"]
    at_12 = await cache.state_at(12)
    assert [i.name.item for i in at_12] == ["a"]
    at_17 = await cache.state_at(17)
    assert sorted(i.name.item for i in at_17) == ["a", "b"]
    assert fake.snapshots == []
    await fake.reports.put(CatalogProgress([CatalogChange(t2, 30, -1)], 31))
    state = await cache.state_at(30)
    assert isinstance(state, CatalogState) and state.get("u2") is None
    assert [c.item.id for c in seen[-1]] == ["u2"]
    with pytest.raises(DeadlineExceeded):
        await cache.wait_for(1000, timeout=0.05)
    await cache.close()


# -- the write path -------------------------------------------------------------------------


class FakeTimestamps:
    def __init__(self, writes: Sequence[int]) -> None:
        self.writes = list(writes)
        self.applied: list[int] = []
        self.uppers: dict[str, list[int]] = {}

    async def write_ts(self) -> int:
        return self.writes.pop(0)

    async def upper(self, collection_id: str) -> int:
        values = self.uppers[collection_id]
        return values.pop(0) if len(values) > 1 else values[0]

    def saw_upper(self, collection_id: str, upper: object) -> None:
        pass

    async def apply_write(self, timestamp: int) -> None:
        self.applied.append(timestamp)

    async def advance_table(self, collection_id: str, target: int) -> int:
        return target


class FakeHolds:
    holder = "test"

    async def write(self, collection_id: str) -> str:
        return f"write-{collection_id}"

    async def read(self, collection_id: str) -> str:
        return f"read-{collection_id}"

    def append_lock(self, collection_id: str) -> asyncio.Lock:
        return asyncio.Lock()

    def forget(self, collection_id: str) -> None:
        pass


class FakeBatch:
    def __init__(self, lower: int, upper: int, rows: int) -> None:
        self.lower, self.upper, self.rows = u64_frontier(lower), u64_frontier(upper), rows


class FakeStorage:
    def __init__(self, batches: list[FakeBatch], versions: dict[int, dict[Any, int]]) -> None:
        self.batches = batches
        self.versions = versions
        self.appends: list[tuple[int, list[Any], int]] = []
        self.fail_appends = 0

    async def append_ipc(
        self, capability: str, data: bytes, new_upper: int, *, expected_upper: int
    ) -> AppendResult:
        if self.fail_appends:
            self.fail_appends -= 1
            raise FailedPrecondition("upper mismatch")
        updates = updates_from_table(from_ipc(data)) if data else []
        self.appends.append((expected_upper, updates, new_upper))
        return AppendResult(u64_frontier(new_upper), False)

    async def append_table(
        self, capability: str, updates: pa.Table, new_upper: int, *, expected_upper: int
    ) -> AppendResult:
        data = to_ipc(updates) if updates.num_rows else b""
        return await self.append_ipc(capability, data, new_upper, expected_upper=expected_upper)

    async def describe(self, collection_id: str) -> Any:
        return type("Info", (), {"batches": self.batches})()

    async def snapshot(self, capability: str, as_of: int) -> Any:
        version = self.versions[as_of]
        return type("Snapshot", (), {"version": lambda self: version})()


def _writer(timestamps: FakeTimestamps, storage: FakeStorage) -> TableWriter:
    return TableWriter(timestamps, storage, FakeHolds())  # type: ignore[arg-type]


SMALL = RelationSchema([Column("x", ColumnType.INT64)])


async def test_a_blind_write_retries_lost_races_and_applies_its_time() -> None:
    timestamps = FakeTimestamps([100, 105])
    timestamps.uppers["u1"] = [90, 103, 103]
    storage = FakeStorage([], {})
    storage.fail_appends = 1
    w = await _writer(timestamps, storage).write("u1", SMALL, [((7,), 1)])
    # The first attempt lost its race; the upper then passed 100, so a new time was taken.
    assert w == 105
    assert storage.appends == [(103, [((7,), 105, 1)], 106)]
    assert timestamps.applied == [105]


async def test_read_then_write_checks_what_it_read() -> None:
    reads = ReadSet(50, frozenset({"u1"}))
    # Only an empty advance after the read: the write goes ahead.
    timestamps = FakeTimestamps([100])
    timestamps.uppers["u1"] = [60]
    storage = FakeStorage([FakeBatch(40, 51, 3), FakeBatch(51, 60, 0)], {})
    assert await _writer(timestamps, storage).write("u1", SMALL, [((1,), 1)], reads) == 100
    # A batch with rows after the read whose contents differ: serialization failure.
    timestamps = FakeTimestamps([100])
    timestamps.uppers["u1"] = [60]
    storage = FakeStorage(
        [FakeBatch(40, 51, 3), FakeBatch(51, 60, 1)], {50: {(1,): 1}, 59: {(1,): 1, (2,): 1}}
    )
    with pytest.raises(SqlError) as failure:
        await _writer(timestamps, storage).write("u1", SMALL, [((1,), 1)], reads)
    assert failure.value.code == "40001"
    assert storage.appends == []
    # Rows that cancelled out leave the contents as read: allowed.
    timestamps = FakeTimestamps([100])
    timestamps.uppers["u1"] = [60]
    storage = FakeStorage([FakeBatch(51, 60, 2)], {50: {(1,): 1}, 59: {(1,): 1}})
    assert await _writer(timestamps, storage).write("u1", SMALL, [((1,), 1)], reads) == 100
