"""The vectorised shard of every row of an Arrow table (hydration's routing) is the shard the
tasks compute for the row's key as they decode it (``shard_of``, the steady state's
exchange), under the key rules: NULL, every NaN one value, -0.0 == 0.0, decimals equal but
for their scale."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from services.compute.dataflow import columnar
from services.compute.dataflow.keys import (
    column_hashes,
    key_hash,
    key_hashes,
    shard_of,
    shards_of,
    stable_hash,
)
from services.compute.spark.transport import normalizer
from tidemark.columnar import ColumnType
from tidemark.plan.scalar_types import ScalarType

ROOT = Path(__file__).resolve().parents[2]

_FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, float("nan"), -float("nan"), 1.5]),
)
_SCALE = 4
_DECIMALS = st.integers(-(10**12), 10**12).map(lambda u: Decimal(u).scaleb(-_SCALE))
_COLUMNS: list[tuple[pa.DataType, st.SearchStrategy[Any]]] = [
    (pa.int64(), st.integers(-(2**63), 2**63 - 1) | st.integers(-3, 3)),
    (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    (pa.float64(), _FLOATS),
    (pa.bool_(), st.booleans()),
    (pa.string(), st.text(max_size=6) | st.sampled_from(["", "a", "é", "\U0001f600"])),
    (pa.large_string(), st.text(max_size=4)),
    (pa.binary(), st.binary(max_size=6)),
    (pa.decimal128(20, _SCALE), _DECIMALS),
    (pa.decimal128(38, 0), st.integers(-(10**30), 10**30).map(Decimal)),
    (pa.date32(), st.dates()),
    (pa.timestamp("us"), st.datetimes()),
    (pa.timestamp("us", tz="UTC"), st.datetimes(timezones=st.just(datetime.UTC))),
]


@st.composite
def tables(draw: st.DrawFn) -> pa.Table:
    picked = draw(st.lists(st.sampled_from(range(len(_COLUMNS))), min_size=1, max_size=4))
    rows = draw(st.integers(0, 30))
    arrays = []
    for index in picked:
        kind, values = _COLUMNS[index]
        column = draw(st.lists(st.none() | values, min_size=rows, max_size=rows))
        array = pa.array(column, kind)
        if draw(st.booleans()) and rows > 1:  # a sliced, chunked column
            cut = draw(st.integers(0, rows))
            array = pa.chunked_array([array.slice(0, cut), array.slice(cut)], kind)
        arrays.append(array)
    return pa.table(arrays, names=[f"c{i}" for i in range(len(arrays))])


def _decoded(table: pa.Table) -> list[tuple[Any, ...]]:
    """The key tuples as the tasks read them: ``to_pylist``, NaN and -0.0 normalised."""
    types = [
        ScalarType(ColumnType.FLOAT64 if pa.types.is_floating(f.type) else ColumnType.INT64)
        for f in table.schema
    ]
    normalize = normalizer(types)
    rows = list(zip(*(c.to_pylist() for c in table.columns), strict=True))
    return [normalize.row(row) for row in rows] if normalize.float_columns else rows


@settings(max_examples=300, deadline=None)
@given(tables(), st.integers(1, 9), st.sampled_from([1, 4, 32_768]))
def test_the_shard_of_each_row_is_shard_of_its_key(
    table: pa.Table, shards: int, hash_chunk: int
) -> None:
    """Also when the rows are hashed a few at a time (chunk boundaries inside the table)."""
    expected = [shard_of(row, shards) for row in _decoded(table)]
    with mock.patch.object(columnar, "_HASH_CHUNK", hash_chunk):
        assert shards_of(table.columns, table.num_rows, shards).tolist() == expected
        assert key_hashes(table.columns, table.num_rows).tolist() == [
            key_hash(row) for row in _decoded(table)
        ]


@settings(max_examples=100, deadline=None)
@given(tables())
def test_equal_keys_hash_equally(table: pa.Table) -> None:
    """Rows rewritten with equal values of another form (the other NaN, -0.0, another
    decimal scale) hash as before."""
    column = pa.array([0.0, -0.0, float("nan"), -float("nan"), None])
    hashes = column_hashes(column).tolist()
    assert hashes[0] == hashes[1] and hashes[2] == hashes[3]
    scales = [
        pa.array([Decimal("1.5"), Decimal("-0")], pa.decimal128(5, 1)),
        pa.array([Decimal("1.5000"), Decimal("0.0000")], pa.decimal128(9, 4)),
    ]
    assert column_hashes(scales[0]).tolist() == column_hashes(scales[1]).tolist()
    assert stable_hash(Decimal("1E+2")) == stable_hash(Decimal("100.00"))
    assert stable_hash(1) != stable_hash(True) != stable_hash(1.0) != stable_hash("1")
    for row in _decoded(table):
        assert shard_of(row, 5) == shard_of(tuple(row), 5)


def test_value_hashes_agree_across_processes_with_different_hash_seeds() -> None:
    values = "['a', b'a', Decimal('1.50'), datetime.date(2020, 1, 2), 2**70, float('nan')]"
    script = (
        "import datetime; from decimal import Decimal; "
        "from services.compute.dataflow.keys import stable_hash; "
        f"print([stable_hash(v) for v in {values}])"
    )
    outputs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        outputs.add(done.stdout)
    assert len(outputs) == 1
