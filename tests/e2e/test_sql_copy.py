"""Getting data in and out through the public API: COPY FROM STDIN (text and CSV), COPY FROM
files and S3 objects (CSV and Parquet), COPY TO STDOUT, literal INSERTs and INSERT ... SELECT,
with real processes (the adapter's CopyIn and CopyOut calls over gRPC)."""

from __future__ import annotations

import asyncio
import datetime
import os
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.s3 import S3Server, unique_bucket
from tests.support.sql_results import ok
from tests.support.sql_stack import SqlStack, sql_stack
from tidemark.blob.s3 import S3Blob, S3Settings
from tidemark.clients.adapter import AdapterClient, StatementResult

S3_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, s3_server: S3Server) -> Iterator[SqlStack]:
    # The adapter reads S3 with the credentials in its environment (the test processes pass
    # on everything but TIDEMARK_* settings); the S3 test server takes any.
    saved = {name: os.environ.get(name) for name in S3_CREDENTIALS}
    os.environ.update({name: "copy-test" for name in S3_CREDENTIALS})
    try:
        with sql_stack(tmp_path_factory.mktemp("copy"), adapters=1, engine="local") as running:
            yield running
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
async def client(stack: SqlStack) -> AsyncIterator[AdapterClient]:
    async with AdapterClient(stack.adapter(0)) as connected:
        yield connected


async def contents(client: AdapterClient, table: str) -> list[tuple[object, ...]]:
    return sorted((await ok(client, f"SELECT * FROM {table}")).rows, key=repr)


async def copy_out(client: AdapterClient, sql: str) -> tuple[bytes, StatementResult]:
    chunks: list[bytes] = []
    result = StatementResult("")
    async for item in client.copy_out(sql):
        if isinstance(item, bytes):
            chunks.append(item)
        else:
            result = item
    return b"".join(chunks), result


def pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


async def test_copy_csv_from_stdin_in_any_chunking(client: AdapterClient) -> None:
    await ok(client, "CREATE TABLE c1 (id bigint NOT NULL, name text, amount numeric(8,2), d date)")
    data = (
        b"id,name,amount,d\n"
        b'1,"ada, the first",12.5,2024-02-29\n'
        b'2,"",,\n'
        b"3,,7.255,2024-01-01\r\n"
        b'4,"say ""hi""\nthere",-1,1999-12-31\n'
    )
    result = await client.copy_in("COPY c1 FROM STDIN WITH (FORMAT csv, HEADER)", pieces(data, 7))
    assert result.error is None, result.error
    assert result.tag == "COPY 4" and result.timestamp > 0
    assert await contents(client, "c1") == sorted(
        [
            (1, "ada, the first", Decimal("12.50"), datetime.date(2024, 2, 29)),
            (2, "", None, None),
            (3, None, Decimal("7.26"), datetime.date(2024, 1, 1)),
            (4, 'say "hi"\nthere', Decimal("-1.00"), datetime.date(1999, 12, 31)),
        ],
        key=repr,
    )


async def test_copy_text_format_escapes_and_columns(client: AdapterClient) -> None:
    await ok(client, "CREATE TABLE c2 (a bigint, b text, c boolean)")
    data = b"x\\ty\\\\z\\n!\t1\nplain\t\\N\n\\N\t2\n\\.\n"
    result = await client.copy_in("COPY c2 (b, a) FROM STDIN", [data])
    assert result.error is None, result.error
    assert result.tag == "COPY 3"
    assert await contents(client, "c2") == sorted(
        [(1, "x\ty\\z\n!", None), (None, "plain", None), (2, None, None)], key=repr
    )


async def test_bad_input_names_line_and_column_and_writes_nothing(client: AdapterClient) -> None:
    await ok(client, "CREATE TABLE c3 (a bigint NOT NULL, b date)")
    await ok(client, "INSERT INTO c3 VALUES (0, NULL)")
    cases = [
        (b"1,2024-01-01\n2,2024-13-01\n", "line 2", "column b", "22007"),
        (b"1,2024-01-01\nx,2024-01-02\n", "line 2", "column a", "22P02"),
        (b"1,2024-01-01\n2\n", "line 2", 'missing data for column "b"', "22P04"),
        (b"1,2024-01-01,9\n", "line 1", "extra data", "22P04"),
        (b"1,2024-01-01\n,2024-01-02\n", "line 2", "not-null", "23502"),
    ]
    for data, line, detail, code in cases:
        result = await client.copy_in("COPY c3 FROM STDIN (FORMAT csv)", [data])
        assert result.error is not None, data
        assert result.error.code == code, (data, result.error)
        assert line in result.error.message and detail in result.error.message, result.error
    assert await contents(client, "c3") == [(0, None)]


async def test_copy_to_stdout_round_trips(client: AdapterClient) -> None:
    await ok(client, "CREATE TABLE c4 (id bigint, t text, x double precision, ok boolean)")
    await ok(
        client,
        "INSERT INTO c4 VALUES (1, 'tab\there', 1.5, true), (2, NULL, NULL, false), "
        "(3, 'comma, \"quote\"', -0.25, NULL)",
    )
    csv, result = await copy_out(client, "COPY (SELECT * FROM c4 ORDER BY id) TO STDOUT CSV HEADER")
    assert result.error is None and result.tag == "COPY 3", result
    assert csv == (b'id,t,x,ok\n1,tab\there,1.5,t\n2,,,f\n3,"comma, ""quote""",-0.25,\n')
    text, result = await copy_out(client, "COPY c4 (id, t) TO STDOUT")
    assert result.tag == "COPY 3"
    assert sorted(text.splitlines()) == [b"1\ttab\\there", b"2\t\\N", b'3\tcomma, "quote"']
    await ok(client, "CREATE TABLE c4_copy (id bigint, t text, x double precision, ok boolean)")
    whole, _ = await copy_out(client, "COPY c4 TO STDOUT")
    loaded = await client.copy_in("COPY c4_copy FROM STDIN", [whole])
    assert loaded.error is None and loaded.tag == "COPY 3"
    assert await contents(client, "c4_copy") == await contents(client, "c4")


async def test_copy_from_files_and_a_directory(client: AdapterClient, tmp_path: Path) -> None:
    await ok(client, "CREATE TABLE c5 (id bigint, name text, price numeric(10,2), day date)")
    table = pa.table(
        {
            "id": pa.array([1, 2], pa.int32()),
            "name": ["a", None],
            "price": pa.array([Decimal("1.50"), Decimal("2.25")], pa.decimal128(12, 2)),
            "day": [datetime.date(2024, 1, 1), datetime.date(2024, 1, 2)],
        }
    )
    folder = tmp_path / "parts"
    folder.mkdir()
    pq.write_table(table, folder / "one.parquet")
    pq.write_table(table.slice(0, 1), folder / "two.parquet")
    result = await ok(client, f"COPY c5 FROM '{folder}' (FORMAT parquet)")
    assert result.tag == "COPY 3"
    (tmp_path / "more.csv").write_text("id,name,price,day\n9,z,0.5,2025-06-30\n")
    result = await ok(client, f"COPY c5 FROM 'file://{tmp_path}/more.csv' (HEADER)")
    assert result.tag == "COPY 1"
    assert await contents(client, "c5") == sorted(
        [
            (1, "a", Decimal("1.50"), datetime.date(2024, 1, 1)),
            (1, "a", Decimal("1.50"), datetime.date(2024, 1, 1)),
            (2, None, Decimal("2.25"), datetime.date(2024, 1, 2)),
            (9, "z", Decimal("0.50"), datetime.date(2025, 6, 30)),
        ],
        key=repr,
    )
    missing = await client.execute(f"COPY c5 FROM '{tmp_path}/absent.csv'")
    assert missing.error is not None and missing.error.code == "58P01"


async def test_copy_from_s3_objects(client: AdapterClient, s3_server: S3Server) -> None:
    bucket = unique_bucket()
    blob = await S3Blob.open(S3Settings.from_url(s3_server.url(bucket, "load")))
    try:
        await blob.put("a.csv", b"1,x\n2,y\n")
        await blob.put("b.csv", b"3,z\n")
    finally:
        await blob.close()
    await ok(client, "CREATE TABLE c6 (id bigint, v text)")
    base = s3_server.url(bucket, "load").split("?", 1)
    one = await ok(client, f"COPY c6 FROM '{base[0]}/b.csv?{base[1]}' (FORMAT csv)")
    assert one.tag == "COPY 1"
    every = await ok(client, f"COPY c6 FROM '{base[0]}/?{base[1]}' (FORMAT csv)")
    assert every.tag == "COPY 3"
    assert await contents(client, "c6") == [(1, "x"), (2, "y"), (3, "z"), (3, "z")]


async def test_copy_rules(client: AdapterClient) -> None:
    await ok(client, "CREATE TABLE c7 (a bigint)")
    await ok(client, "CREATE VIEW c7v AS SELECT a FROM c7")
    checks = [
        ("COPY c7v FROM STDIN", "42809"),
        ("COPY c7 FROM STDIN (FORMAT binary)", "0A000"),
        ("COPY c7 FROM STDIN (FORMAT csv, DELIMITER 'ab')", "0A000"),
        ("COPY c7 FROM STDIN (HEADER)", "0A000"),
        ("COPY c7 FROM STDIN (COLOR red)", "42601"),
        ("COPY c7 (b) FROM STDIN", "42703"),
        ("COPY nope FROM STDIN", "42P01"),
    ]
    for sql, code in checks:
        result = await client.copy_in(sql, [b"1\n"])
        assert result.error is not None and result.error.code == code, (sql, result.error)
    via_execute = await client.execute("COPY c7 FROM STDIN")
    assert via_execute.error is not None and via_execute.error.code == "0A000"
    await ok(client, "BEGIN")
    in_transaction = await client.copy_in("COPY c7 FROM STDIN", [b"1\n"])
    assert in_transaction.error is not None and in_transaction.error.code == "25001"
    await ok(client, "ROLLBACK")
    assert await contents(client, "c7") == []


async def test_literal_inserts_and_insert_select(client: AdapterClient) -> None:
    await ok(client, "CREATE TABLE c8 (id bigint NOT NULL, v numeric(6,1), d date)")
    values = ", ".join(f"({i}, {i}.25, '2024-01-{i % 28 + 1:02d}')" for i in range(500))
    inserted = await ok(client, f"INSERT INTO c8 VALUES {values}")
    assert inserted.tag == "INSERT 0 500"
    bad = await client.execute(f"INSERT INTO c8 VALUES {values}, (NULL, 1, NULL)")
    assert bad.error is not None and bad.error.code == "23502"
    await ok(client, "CREATE TABLE c8_even (id bigint, v numeric(6,1), d date)")
    copied = await ok(client, "INSERT INTO c8_even SELECT * FROM c8 WHERE id % 2 = 0")
    assert copied.tag == "INSERT 0 250"
    summary = await ok(client, "SELECT count(*), sum(v), min(d) FROM c8_even")
    expected_sum = sum(Decimal(f"{i}.3") for i in range(0, 500, 2))
    assert summary.rows == [(250, expected_sum, datetime.date(2024, 1, 1))]


async def test_concurrent_copies_each_land_once(client: AdapterClient, stack: SqlStack) -> None:
    await ok(client, "CREATE TABLE c9 (k bigint, batch bigint)")

    async def load(batch: int) -> StatementResult:
        async with AdapterClient(stack.adapter(0)) as other:
            data = "".join(f"{k},{batch}\n" for k in range(1000)).encode()
            return await other.copy_in("COPY c9 FROM STDIN (FORMAT csv)", pieces(data, 4096))

    results = await asyncio.gather(*(load(b) for b in range(4)))
    assert all(r.error is None and r.tag == "COPY 1000" for r in results)
    counts = await ok(client, "SELECT batch, count(*), count(DISTINCT k) FROM c9 GROUP BY batch")
    assert sorted(counts.rows) == [(b, 1000, 1000) for b in range(4)]


async def test_a_copy_larger_than_a_message_is_still_one_write(client: AdapterClient) -> None:
    # About 26 MB of updates: more than one chunk of a chunked append.
    await ok(client, "CREATE TABLE c10 (k bigint, pad text)")
    pad = "x" * 120
    data = "".join(f"{k},{pad}{k}\n" for k in range(200_000)).encode()
    result = await client.copy_in("COPY c10 FROM STDIN (FORMAT csv)", pieces(data, 1 << 20))
    assert result.error is None and result.tag == "COPY 200000", result
    summary = await ok(client, "SELECT count(*), count(DISTINCT pad), sum(k) FROM c10")
    assert summary.rows == [(200_000, 200_000, sum(range(200_000)))]
    at = await ok(client, f"SELECT count(*) FROM c10 AS OF {result.timestamp - 1}")
    assert at.rows == [(0,)]
