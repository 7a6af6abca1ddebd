"""INSERT ... VALUES of plain literals, read without building a syntax tree.

A bulk INSERT is mostly literals: building sqlglot's tree for 1,000 rows and lowering every
cell through the expression planner costs a few hundred milliseconds, while the rows are known
the moment the text is read. :func:`scan_literal_inserts` recognises a request made only of
``INSERT INTO name [(columns)] VALUES (literal, ...), ...`` statements whose cells are numbers,
quoted strings, ``NULL``, ``TRUE``/``FALSE``, ``DEFAULT`` or ``DATE``/``TIMESTAMP '...'``, and
:func:`fold_literal_rows` turns their cells into the table's values by the same assignment rules
the planner applies.

Both only ever take the easy path: anything else (an expression, a comment, an escape string,
a value that does not convert, a NULL in a NOT NULL column) makes them give up, and the
statement is parsed and planned the ordinary way, so every error and every corner case is the
planner's, word for word.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from services.adapter.sql.errors import SqlError
from services.adapter.sql.literals import number_literal, parse_text, round_decimal
from services.adapter.sql.names import QualifiedName
from tidemark.columnar import Column, ColumnType
from tidemark.plan.datum import INT64_MAX, INT64_MIN
from tidemark.plan.scalar_types import ScalarType

CellKind = Literal["number", "string", "null", "true", "false", "default", "date", "timestamp"]

# Below this many characters the ordinary parser is as fast and the scan is not worth trying.
MIN_SCANNED_CHARS = 200

_NAME = r'(?:[A-Za-z_][A-Za-z0-9_$]*|"(?:[^"]|"")+")'
_HEAD = re.compile(
    rf"\s*INSERT\s+INTO\s+(?P<name>{_NAME}(?:\s*\.\s*{_NAME}){{0,2}})\s*"
    rf"(?:\((?P<columns>\s*{_NAME}\s*(?:,\s*{_NAME}\s*)*)\)\s*)?VALUES\s*",
    re.IGNORECASE,
)
# One cell and what follows it: a comma (next cell) or a closing parenthesis (end of row).
_CELL = re.compile(
    r"""\s*(?:
        (?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)(?![A-Za-z0-9_.'])
      | '(?P<string>(?:[^']|'')*)'(?!\s*(?:::|'))
      | (?P<typed>DATE|TIMESTAMP)\s*'(?P<typed_text>[^']*)'(?!\s*(?:::|'))
      | (?P<word>NULL|TRUE|FALSE|DEFAULT)(?![A-Za-z0-9_$.(])
    )\s*(?P<end>[,)])""",
    re.IGNORECASE | re.VERBOSE,
)
_ROW_START = re.compile(r"\s*\(")
_SEPARATORS = re.compile(r"[\s;]*")
_BETWEEN_ROWS = re.compile(r"\s*(?P<sep>[,;]|$)")


@dataclass(frozen=True)
class Cell:
    kind: CellKind
    text: str
    # 1-based offset in the request.
    position: int


@dataclass(frozen=True)
class LiteralRows:
    """The VALUES rows of one INSERT, cell by cell, as written."""

    rows: tuple[tuple[Cell, ...], ...]


@dataclass(frozen=True)
class ScannedInsert:
    text: str
    position: int
    table: QualifiedName
    columns: tuple[str, ...] | None
    values: LiteralRows


def _identifier(part: str) -> str:
    part = part.strip()
    if part.startswith('"'):
        return part[1:-1].replace('""', '"')
    return part.lower()


def _names(text: str) -> tuple[str, ...]:
    return tuple(_identifier(m.group(0)) for m in re.finditer(_NAME, text))


def scan_literal_inserts(sql: str) -> list[ScannedInsert] | None:
    """The request's statements when every one is an INSERT of literal rows, else ``None``."""
    if len(sql) < MIN_SCANNED_CHARS:
        return None
    found: list[ScannedInsert] = []
    offset = 0
    while True:
        offset = _SEPARATORS.match(sql, offset).end()  # type: ignore[union-attr]
        if offset >= len(sql):
            return found or None
        scanned = _scan_one(sql, offset)
        if scanned is None:
            return None
        insert, offset = scanned
        found.append(insert)


def _scan_one(sql: str, start: int) -> tuple[ScannedInsert, int] | None:
    head = _HEAD.match(sql, start)
    if head is None:
        return None
    table = _names(head.group("name"))
    columns = _names(head.group("columns")) if head.group("columns") else None
    rows: list[tuple[Cell, ...]] = []
    offset = head.end()
    cell_match = _CELL.match
    while True:
        opening = _ROW_START.match(sql, offset)
        if opening is None:
            return None
        offset = opening.end()
        row: list[Cell] = []
        while True:
            cell = cell_match(sql, offset)
            if cell is None:
                return None
            row.append(_cell(cell))
            offset = cell.end()
            if cell.group("end") == ")":
                break
        rows.append(tuple(row))
        between = _BETWEEN_ROWS.match(sql, offset)
        if between is None:
            return None
        if between.group("sep") != ",":
            end = between.start("sep")
            text = sql[start:end].strip()
            position = start + (len(sql[start:end]) - len(sql[start:end].lstrip())) + 1
            return ScannedInsert(text, position, table, columns, LiteralRows(tuple(rows))), (
                between.end()
            )
        offset = between.end()


def _cell(match: re.Match[str]) -> Cell:
    kind = match.lastgroup
    if match.group("number") is not None:
        return Cell("number", match.group("number"), match.start("number") + 1)
    if match.group("string") is not None:
        return Cell("string", match.group("string").replace("''", "'"), match.start("string"))
    if match.group("typed") is not None:
        typed: CellKind = "date" if match.group("typed").upper() == "DATE" else "timestamp"
        return Cell(typed, match.group("typed_text"), match.start("typed") + 1)
    word = match.group("word").lower()
    assert kind is not None
    return Cell(word, word, match.start("word") + 1)  # type: ignore[arg-type]


class NotLiteral(Exception):
    """The rows need the planner: an error to report, or a conversion this module leaves to it."""


def fold_literal_rows(
    values: LiteralRows, columns: Sequence[Column], targets: Sequence[int]
) -> tuple[tuple[Any, ...], ...]:
    """The rows as the table's values (in its column order), or :class:`NotLiteral`."""
    width = len(columns)
    convert = [_converter(columns[target]) for target in targets]
    missing = [i for i in range(width) if i not in set(targets)]
    if any(not columns[i].nullable for i in missing):
        raise NotLiteral
    order = list(targets)
    folded: list[tuple[Any, ...]] = []
    try:
        for row in values.rows:
            if len(row) != len(order):
                raise NotLiteral
            full: list[Any] = [None] * width
            for index, cell, to_value in zip(order, row, convert, strict=True):
                full[index] = to_value(cell)
            folded.append(tuple(full))
    except SqlError:
        raise NotLiteral from None
    return tuple(folded)


def _converter(column: Column) -> Any:
    kind = column.type
    target = ScalarType(
        kind, True, column.precision if kind is ColumnType.DECIMAL else 0, column.scale
    )
    nullable = column.nullable

    def convert(cell: Cell) -> Any:
        cell_kind = cell.kind
        if cell_kind == "string":
            return parse_text(cell.text, target, cell.position)
        if cell_kind == "null" or cell_kind == "default":
            if not nullable:
                raise NotLiteral
            return None
        if cell_kind == "number":
            return _number(cell.text, kind, target, cell.position)
        if cell_kind in ("true", "false") and kind is ColumnType.BOOL:
            return cell_kind == "true"
        if cell_kind == "date" and kind in (ColumnType.DATE, ColumnType.TIMESTAMP):
            day = parse_text(cell.text, ScalarType(ColumnType.DATE, True), cell.position)
            if kind is ColumnType.DATE:
                return day
            return datetime.datetime(day.year, day.month, day.day)
        if cell_kind == "timestamp" and kind is ColumnType.TIMESTAMP:
            return parse_text(cell.text, target, cell.position)
        raise NotLiteral

    return convert


def _number(text: str, kind: ColumnType, target: ScalarType, position: int) -> Any:
    value, _ = number_literal(text)
    if kind is ColumnType.INT64:
        if isinstance(value, int):
            return value
        rounded = int(round_decimal(value, ScalarType(ColumnType.DECIMAL, True, 38, 0), position))
        if not INT64_MIN <= rounded <= INT64_MAX:
            raise NotLiteral
        return rounded
    if kind is ColumnType.DECIMAL:
        return round_decimal(Decimal(value), target, position)
    if kind is ColumnType.FLOAT64:
        return float(value)
    raise NotLiteral
