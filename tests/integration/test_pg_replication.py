"""The PostgreSQL replication reader against a real PostgreSQL: the publication checks, the
snapshot at the slot's consistent point, the change stream and replaying a batch."""

from __future__ import annotations

import datetime
import decimal
import threading
import time
from collections import Counter

import pytest

from tests.support.postgres import DATABASE, PASSWORD, SUPERUSER, PostgresCluster
from tidemark.columnar import ColumnType, Row
from tidemark.sources.postgres.replication import Batch, Replication, parse_lsn
from tidemark.sources.postgres.upstream import ConnectionParams, UpstreamError, publication_tables

pytestmark = pytest.mark.postgres


def params(pg: PostgresCluster) -> ConnectionParams:
    return ConnectionParams(pg.host, pg.port, SUPERUSER, PASSWORD, DATABASE)


@pytest.fixture()
def upstream(postgres: PostgresCluster) -> PostgresCluster:
    postgres.execute(
        "DROP PUBLICATION IF EXISTS rp",
        "DROP TABLE IF EXISTS r_items, r_keyed, r_odd",
        "CREATE TABLE r_items (id int, name text, price numeric(10,2), flag boolean, "
        "at timestamp, day date, data jsonb, raw bytea, score float8, big bigint)",
        "ALTER TABLE r_items REPLICA IDENTITY FULL",
        "CREATE TABLE r_keyed (id int PRIMARY KEY, v text)",
        "CREATE TABLE r_odd (id int, p point)",
        "ALTER TABLE r_odd REPLICA IDENTITY FULL",
        "CREATE PUBLICATION rp FOR TABLE r_items, r_keyed, r_odd",
    )
    return postgres


def test_publication_checks(upstream: PostgresCluster) -> None:
    p = params(upstream)
    with pytest.raises(UpstreamError) as missing:
        publication_tables(p, "nope", None)
    assert missing.value.sqlstate == "42704"
    assert 'publication "nope" does not exist' in missing.value.message
    with pytest.raises(UpstreamError) as identity:
        publication_tables(p, "rp", ["r_keyed"])
    assert identity.value.sqlstate == "55000"
    assert "REPLICA IDENTITY FULL" in identity.value.message
    with pytest.raises(UpstreamError) as odd:
        publication_tables(p, "rp", ["r_odd"])
    assert odd.value.sqlstate == "0A000"
    assert "'p' has type point" in odd.value.message
    with pytest.raises(UpstreamError) as absent:
        publication_tables(p, "rp", ["r_nothing"])
    assert absent.value.sqlstate == "42704"
    (odd_as_text,) = publication_tables(p, "rp", ["r_odd"], text_columns=["r_odd.p"])
    assert [(c.column.name, c.column.type) for c in odd_as_text.columns] == [
        ("id", ColumnType.INT64),
        ("p", ColumnType.TEXT),
    ]
    with pytest.raises(UpstreamError) as unknown:
        publication_tables(p, "rp", ["r_odd"], text_columns=["r_odd.nope", "r_odd.p"])
    assert unknown.value.sqlstate == "42703"
    with pytest.raises(UpstreamError) as no_schema:
        publication_tables(p, "rp", None, schemas=["elsewhere"])
    assert "publishes no tables in schemas elsewhere" in no_schema.value.message
    (items,) = publication_tables(p, "rp", ["public.r_items"])
    assert [(c.column.name, c.column.type) for c in items.columns] == [
        ("id", ColumnType.INT64),
        ("name", ColumnType.TEXT),
        ("price", ColumnType.DECIMAL),
        ("flag", ColumnType.BOOL),
        ("at", ColumnType.TIMESTAMP),
        ("day", ColumnType.DATE),
        ("data", ColumnType.JSON),
        ("raw", ColumnType.BYTES),
        ("score", ColumnType.FLOAT64),
        ("big", ColumnType.INT64),
    ]
    assert (items.columns[2].column.precision, items.columns[2].column.scale) == (10, 2)


def test_snapshot_stream_and_replay(upstream: PostgresCluster) -> None:
    upstream.execute(
        "INSERT INTO r_items VALUES (1, 'a', 1.50, true, '2024-01-02 03:04:05.123456', "
        "'2024-01-02', '{\"k\": 1}', '\\x00ff', 2.5, 9000000000), "
        "(2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"
    )
    p = params(upstream)
    tables = publication_tables(p, "rp", ["r_items"])
    replication = Replication(p, "rp", "test_slot", tables)
    snapshot = replication.snapshot()
    row1 = (
        1,
        "a",
        decimal.Decimal("1.50"),
        True,
        datetime.datetime(2024, 1, 2, 3, 4, 5, 123456),
        datetime.date(2024, 1, 2),
        '{"k": 1}',
        b"\x00\xff",
        2.5,
        9000000000,
    )
    row2 = (2,) + (None,) * 9
    assert sorted(snapshot.changes["public.r_items"], key=str) == sorted(
        [(row1, 1), (row2, 1)], key=str
    )
    upstream.execute(
        "UPDATE r_items SET name = 'b' WHERE id = 1",
        "DELETE FROM r_items WHERE id = 2",
        "INSERT INTO r_items (id) VALUES (3)",
    )
    stop = threading.Event()
    seen: list[Batch] = []
    for batch in replication.stream(snapshot.offset, lambda: snapshot.offset, stop.is_set):
        seen.append(batch)
        if len(batch.commit_times_us) == 0 or sum(len(b.commit_times_us) for b in seen) >= 3:
            break
    changes = [c for b in seen for c in b.changes["public.r_items"]]
    row1b = (1, "b", *row1[2:])
    assert changes == [(row1, -1), (row1b, 1), (row2, -1), ((3,) + (None,) * 9, 1)]
    # The first batch again, from the snapshot's offset (nothing confirmed past it).
    again = replication.replay(snapshot.offset, seen[0].offset)
    assert again.changes == seen[0].changes
    assert again.offset == seen[0].offset
    # The snapshot batch again, though its exported snapshot is long gone.
    rebuilt = replication.replay_snapshot(snapshot.offset)
    assert changes_equal(rebuilt.changes, snapshot.changes)
    # Feedback moves the slot's confirmed flush LSN.
    confirmed_at = seen[-1].offset
    upstream.execute("INSERT INTO r_items (id) VALUES (4)")
    slot_lsn = (
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name='test_slot'"
    )
    flushed = 0
    for _ in replication.stream(confirmed_at, lambda: confirmed_at, lambda: False):
        # The stream is still open: the server reads our feedback while it serves us.
        for _ in range(50):
            flushed = parse_lsn(upstream.query(slot_lsn)[0][0])
            if flushed == confirmed_at:
                break
            time.sleep(0.1)
        break
    assert flushed == confirmed_at
    replication.drop_slot()


def changes_equal(a: dict[str, list[tuple[Row, int]]], b: dict[str, list[tuple[Row, int]]]) -> bool:
    def summed(changes: dict[str, list[tuple[Row, int]]]) -> dict[str, Counter[Row]]:
        out: dict[str, Counter[Row]] = {}
        for key, pairs in changes.items():
            counter: Counter[Row] = Counter()
            for row, diff in pairs:
                counter[row] += diff
            out[key] = +counter
        return out

    return summed(a) == summed(b)


def test_quiet_tables_still_move_the_offset(upstream: PostgresCluster) -> None:
    """Writes elsewhere in the database move the offset with empty batches (so confirming
    them frees WAL), and such a batch replays as empty."""
    p = params(upstream)
    upstream.execute("DROP TABLE IF EXISTS r_elsewhere", "CREATE TABLE r_elsewhere (x int)")
    replication = Replication(p, "rp", "quiet_slot", publication_tables(p, "rp", ["r_items"]))
    snapshot = replication.snapshot()
    upstream.execute("INSERT INTO r_elsewhere SELECT generate_series(1, 1000)")
    empty = next(replication.stream(snapshot.offset, lambda: snapshot.offset, lambda: False))
    assert empty.changes == {} and empty.commit_times_us == []
    assert empty.offset > snapshot.offset
    again = replication.replay(snapshot.offset, empty.offset)
    assert (again.offset, again.changes) == (empty.offset, {})
    upstream.execute("INSERT INTO r_items (id) VALUES (77)")
    after = next(replication.stream(empty.offset, lambda: empty.offset, lambda: False))
    assert after.changes == {"public.r_items": [((77,) + (None,) * 9, 1)]}
    replication.drop_slot()
