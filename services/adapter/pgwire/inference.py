"""Types of ``$n`` parameters the client left unspecified (OID 0), for ParameterDescription:
taken from where the parameter stands, as far as the text shows it without planning.

- ``$n::type`` / ``CAST($n AS type)``: that type;
- ``column <op> $n`` or ``$n <op> column`` with the column of a relation the statement names
  (FROM, JOIN, UPDATE, INSERT INTO, DELETE FROM): the column's type;
- ``INSERT INTO t [(columns)] VALUES (..., $n, ...)``: the type of the column it fills.

Anything else stays ``text`` (a quoted literal, which PostgreSQL and Tidemark read as the type
its context needs).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from services.adapter.pgwire import pgtypes
from services.adapter.results import sql_type_name
from services.adapter.sql.catalog_view import CatalogView
from services.adapter.sql.errors import SqlError

_NAME = r'(?:"[^"]+"|[A-Za-z_][A-Za-z_0-9]*)'
_QUALIFIED = rf"{_NAME}(?:\s*\.\s*{_NAME}){{0,2}}"
_RELATIONS = re.compile(rf"\b(?:FROM|JOIN|UPDATE|INTO)\s+({_QUALIFIED})", re.IGNORECASE)
_OPERATOR = r"(?:=|<>|!=|<=|>=|<|>)"
_LEFT = re.compile(rf"({_QUALIFIED})\s*{_OPERATOR}\s*\$(\d+)\b")
_RIGHT = re.compile(rf"\$(\d+)\s*{_OPERATOR}\s*({_QUALIFIED})")
_CAST = re.compile(
    r"\$(\d+)\s*::\s*([A-Za-z ]+?)(?=[\s,)]|$)|CAST\s*\(\s*\$(\d+)\s+AS\s+([A-Za-z ]+?)\s*\)",
    re.IGNORECASE,
)
_INSERT = re.compile(
    rf"^\s*INSERT\s+INTO\s+({_QUALIFIED})\s*(?:\(([^)]*)\))?\s*VALUES\s*\((.*)\)\s*;?\s*$",
    re.IGNORECASE | re.DOTALL,
)
_CAST_OIDS = {
    "bigint": pgtypes.INT8,
    "int8": pgtypes.INT8,
    "integer": pgtypes.INT4,
    "int": pgtypes.INT4,
    "int4": pgtypes.INT4,
    "smallint": pgtypes.INT2,
    "boolean": pgtypes.BOOL,
    "bool": pgtypes.BOOL,
    "text": pgtypes.TEXT,
    "varchar": pgtypes.VARCHAR,
    "double precision": pgtypes.FLOAT8,
    "float8": pgtypes.FLOAT8,
    "real": pgtypes.FLOAT4,
    "numeric": pgtypes.NUMERIC,
    "decimal": pgtypes.NUMERIC,
    "date": pgtypes.DATE,
    "timestamp": pgtypes.TIMESTAMP,
    "jsonb": pgtypes.JSONB,
    "json": pgtypes.JSON,
    "bytea": pgtypes.BYTEA,
}


def _parts(name: str) -> tuple[str, ...]:
    return tuple(
        p.strip()[1:-1] if p.strip().startswith('"') else p.strip().lower() for p in name.split(".")
    )


def infer(sql: str, given: list[int], view: CatalogView, settings: Mapping[str, str]) -> list[int]:
    """The parameter OIDs: the given ones, the unspecified ones inferred (else text)."""
    if all(given):
        return list(given)
    columns: dict[str, int] = {}
    ordered: dict[tuple[str, ...], list[tuple[str, int]]] = {}
    for match in _RELATIONS.finditer(sql):
        name = _parts(match[1])
        try:
            relation = view.resolve(name, settings)
        except SqlError:
            continue
        typed = [(c.name, pgtypes.pg_type(sql_type_name(c)).oid) for c in relation.schema.columns]
        ordered[name] = typed
        for column, column_oid in typed:
            columns.setdefault(column, column_oid)
    found: dict[int, int] = {}
    for match in _CAST.finditer(sql):
        number, type_name = (match[1], match[2]) if match[1] else (match[3], match[4])
        cast_oid = _CAST_OIDS.get(" ".join(type_name.lower().split()))
        if cast_oid:
            found.setdefault(int(number), cast_oid)
    for match in _LEFT.finditer(sql):
        _note(found, int(match[2]), columns.get(_parts(match[1])[-1]))
    for match in _RIGHT.finditer(sql):
        _note(found, int(match[1]), columns.get(_parts(match[2])[-1]))
    insert = _INSERT.match(sql)
    if insert is not None:
        target = ordered.get(_parts(insert[1]), [])
        names = [_parts(c)[-1] for c in insert[2].split(",")] if insert[2] else None
        by_name = dict(target)
        values = [v.strip() for v in insert[3].split(",")]
        for index, value in enumerate(values):
            placeholder = re.fullmatch(r"\$(\d+)", value)
            if placeholder is None:
                continue
            filled: int | None
            if names is not None:
                filled = by_name.get(names[index]) if index < len(names) else None
            else:
                filled = target[index][1] if index < len(target) else None
            _note(found, int(placeholder[1]), filled)
    return [oid or found.get(index + 1, pgtypes.TEXT) for index, oid in enumerate(given)]


def _note(found: dict[int, int], number: int, oid: int | None) -> None:
    if oid is not None:
        found.setdefault(number, oid)
