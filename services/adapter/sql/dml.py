"""INSERT, UPDATE and DELETE planned against a table.

INSERT ... VALUES with constant rows is folded to typed Python rows now (PostgreSQL's
assignment rules: quoted literals read as the column's type, numbers rounded into numeric
columns, NULL checked against NOT NULL). Anything else becomes a plan producing the rows.

UPDATE and DELETE are read-then-write: :class:`ChangePlan` holds a plan of the rows to
retract and (UPDATE) one of the rows to insert instead, both over the table as read at one
timestamp; the adapter runs them and appends -old/+new at its write time. Rows produced by a
plan are in the table's column order; the adapter rejects NULLs in NOT NULL columns among
them, which only running the plan can show.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from services.adapter.sql import relations as r
from services.adapter.sql import typed as t
from services.adapter.sql.catalog_view import BoundRelation, CatalogView
from services.adapter.sql.errors import (
    DATATYPE_MISMATCH,
    DUPLICATE_COLUMN,
    NOT_NULL_VIOLATION,
    SYNTAX_ERROR,
    UNDEFINED_COLUMN,
    WRONG_OBJECT_TYPE,
    SqlError,
)
from services.adapter.sql.expressions import Lowerer, round_half_away, text_of
from services.adapter.sql.literal_insert import NotLiteral, fold_literal_rows
from services.adapter.sql.names import dotted, identifier, position
from services.adapter.sql.parser import parse_tokens
from services.adapter.sql.planned import Planned, PlannedQuery
from services.adapter.sql.query import plan_with
from services.adapter.sql.scope import Frame, Scope, ScopeColumn
from services.adapter.sql.select import QueryPlanner, project_values
from services.adapter.sql.statements import Delete, Insert, Update
from services.adapter.sql.typed import Typed
from services.adapter.sql.types import type_name
from tidemark.columnar import Column, ColumnType
from tidemark.plan.scalar_types import ScalarType

Row = tuple[Any, ...]


@dataclass(frozen=True)
class InsertPlan:
    """Rows to insert into ``table``, in its column order: ``rows`` when known now,
    otherwise ``query`` computes them."""

    table: BoundRelation
    rows: tuple[Row, ...] | None
    query: PlannedQuery | None

    @property
    def depends_on(self) -> frozenset[str]:
        extra = self.query.depends_on if self.query is not None else frozenset()
        return frozenset({self.table.id}) | extra


@dataclass(frozen=True)
class ChangePlan:
    """UPDATE/DELETE: ``retract`` yields the rows to remove, ``insert`` (UPDATE only) the
    rows replacing them; both read the table (and anything else named) at one time."""

    table: BoundRelation
    retract: PlannedQuery
    insert: PlannedQuery | None

    @property
    def depends_on(self) -> frozenset[str]:
        return self.retract.depends_on


def target_table(
    name: tuple[str, ...], catalog: CatalogView, settings: Mapping[str, str], where: int, verb: str
) -> BoundRelation:
    table = catalog.resolve(name, settings, where)
    if table.kind != "table":
        kind = table.kind.replace("_", " ")
        raise SqlError(WRONG_OBJECT_TYPE, f'cannot {verb} {kind} "{dotted(table.name)}"', where)
    return table


def assign(value: Typed, column: Column, table: str, where: int) -> Typed:
    """``value`` stored into ``column``: PostgreSQL's assignment conversions, 42804 for
    types that do not convert, 23502 for a NULL constant in a NOT NULL column."""
    target = ScalarType(
        column.type,
        True,
        column.precision if column.type is ColumnType.DECIMAL else 0,
        column.scale,
    )
    value = t.coerce(value, target, where)
    if t.is_literal(value) and t.literal_value(value) is None and not column.nullable:
        raise SqlError(
            NOT_NULL_VIOLATION,
            f'null value in column "{column.name}" of relation "{table}" violates not-null '
            "constraint",
            where,
        )
    source = value.type
    if source.same_type(target):
        return value
    folded = t.fold(value, target, where)
    if folded is not None:
        return folded
    kind, from_kind = target.kind, source.kind
    if source.is_numeric and target.is_numeric:
        if from_kind is ColumnType.DECIMAL and kind in (ColumnType.INT64, ColumnType.DECIMAL):
            scale = target.scale if kind is ColumnType.DECIMAL else 0
            return t.cast(round_half_away(value, scale), target, where)
        return t.cast(value, target, where)
    if {from_kind, kind} == {ColumnType.DATE, ColumnType.TIMESTAMP}:
        return t.cast(value, target, where)
    if kind is ColumnType.TEXT:
        return text_of(value, where)
    raise SqlError(
        DATATYPE_MISMATCH,
        f'column "{column.name}" is of type {type_name(target)} but expression is of type '
        f"{type_name(source)}",
        where,
        hint="You will need to rewrite or cast the expression.",
    )


def _is_default(node: exp.Expr) -> bool:
    return isinstance(node, exp.Var) and node.name.upper() == "DEFAULT"


def target_columns(table: BoundRelation, names: Sequence[str] | None, where: int) -> list[int]:
    all_names = table.schema.names
    if names is None:
        return list(range(len(all_names)))
    positions: list[int] = []
    for name in names:
        if name not in all_names:
            raise SqlError(
                UNDEFINED_COLUMN,
                f'column "{name}" of relation "{dotted(table.name)}" does not exist',
                where,
            )
        index = all_names.index(name)
        if index in positions:
            raise SqlError(DUPLICATE_COLUMN, f'column "{name}" specified more than once', where)
        positions.append(index)
    return positions


def _null_for(column: Column, table: str, where: int) -> Typed:
    """The value of a column an INSERT leaves out (there are no defaults but NULL)."""
    if not column.nullable:
        raise SqlError(
            NOT_NULL_VIOLATION,
            f'null value in column "{column.name}" of relation "{table}" violates not-null '
            "constraint",
            where,
        )
    return t.null(ScalarType.of_column(column))


def plan_insert(statement: Insert, catalog: CatalogView, settings: Mapping[str, str]) -> InsertPlan:
    try:
        return _plan_insert(statement, catalog, settings)
    except SqlError as exc:
        raise exc.at(statement.position) from None


def _plan_insert(
    statement: Insert, catalog: CatalogView, settings: Mapping[str, str]
) -> InsertPlan:
    where = statement.position
    table = target_table(statement.table, catalog, settings, where, "insert into")
    label = table.name[-1]
    columns = table.schema.columns
    targets = target_columns(table, statement.columns, where)
    if statement.literal_rows is not None:
        try:
            rows = fold_literal_rows(statement.literal_rows, columns, targets)
        except NotLiteral:
            return _plan_insert(_as_parsed(statement), catalog, settings)
        return InsertPlan(table, rows, None)
    planner = QueryPlanner(catalog, settings)
    source = statement.source
    if source is None:
        row = [_null_for(c, label, where) for c in columns]
        return InsertPlan(table, (tuple(None for _ in row),), None)
    ast = source.ast
    if isinstance(ast, exp.Values) and not any(ast.args.get(k) for k in ("order", "limit")):
        return _insert_values(planner, table, targets, ast)
    planned = planner.finish_inner(planner.plan_node(ast, None))
    if planned.visible > len(targets):
        raise SqlError(SYNTAX_ERROR, "INSERT has more expressions than target columns", where)
    if planned.visible < len(targets):
        raise SqlError(SYNTAX_ERROR, "INSERT has more target columns than expressions", where)
    values = [
        planned.unknowns[i] or t.column(i, planned.rel.types[i]) for i in range(planned.visible)
    ]
    frame = Frame(planned.rel, Scope([ScopeColumn("") for _ in planned.rel.types]))
    rel = _table_row(frame, table, targets, values, where)
    query = plan_with(
        planner, Planned(rel, table.schema.names, len(columns), [None] * len(columns), [])
    )
    return InsertPlan(table, None, query)


def _as_parsed(statement: Insert) -> Insert:
    """The INSERT parsed the ordinary way, at the same offsets in the request."""
    (parsed,) = parse_tokens(" " * (statement.position - 1) + statement.text)
    assert isinstance(parsed, Insert)
    return parsed


def _table_row(
    frame: Frame, table: BoundRelation, targets: Sequence[int], values: Sequence[Typed], where: int
) -> r.Rel:
    """``frame``'s rows as rows of the table: values assigned to their target columns, NULL
    for the rest."""
    label = table.name[-1]
    by_column = dict(zip(targets, values, strict=True))
    row = []
    for index, column in enumerate(table.schema.columns):
        value = by_column.get(index)
        if value is None:
            row.append(_null_for(column, label, where))
        else:
            row.append(assign(value, column, label, value.position or where))
    return project_values(frame, row)


def _insert_values(
    planner: QueryPlanner, table: BoundRelation, targets: list[int], ast: exp.Values
) -> InsertPlan:
    label = table.name[-1]
    columns = table.schema.columns
    statement_position = position(ast)
    rows = [row.expressions if isinstance(row, exp.Tuple) else [row] for row in ast.expressions]
    defaults: list[list[bool]] = []
    for row_node, row in zip(ast.expressions, rows, strict=True):
        if len(row) > len(targets):
            raise SqlError(
                SYNTAX_ERROR, "INSERT has more expressions than target columns", position(row_node)
            )
        if len(row) < len(targets):
            raise SqlError(
                SYNTAX_ERROR, "INSERT has more target columns than expressions", position(row_node)
            )
        defaults.append([_is_default(cell) for cell in row])
        for index, cell in enumerate(row):
            if _is_default(cell):
                row[index] = exp.Null()
    frames: list[Frame] = []
    assigned: list[list[Typed]] = []
    for row, flags in zip(rows, defaults, strict=True):
        frame = Frame(r.one_row(), Scope([ScopeColumn("")]))
        lowerer = Lowerer(frame, planner, "VALUES")
        values = []
        for cell, target, is_default in zip(row, targets, flags, strict=True):
            where = position(cell)
            if is_default:
                values.append(_null_for(columns[target], label, where))
            else:
                values.append(assign(lowerer.lower(cell), columns[target], label, where))
        by_column = dict(zip(targets, values, strict=True))
        full = [
            by_column[i] if i in by_column else _null_for(c, label, statement_position)
            for i, c in enumerate(columns)
        ]
        frames.append(frame)
        assigned.append(full)
    if all(f.rel.arity == 1 for f in frames) and all(
        t.is_literal(v) for row in assigned for v in row
    ):
        folded = tuple(tuple(t.literal_value(v) for v in row) for row in assigned)
        return InsertPlan(table, folded, None)
    parts = [project_values(f, row) for f, row in zip(frames, assigned, strict=True)]
    rel = r.union(parts)
    planned = Planned(rel, table.schema.names, len(columns), [None] * len(columns), [])
    return InsertPlan(table, None, plan_with(planner, planned))


def _table_frame(
    planner: QueryPlanner,
    table: BoundRelation,
    alias: str | None,
    where: int,
) -> Frame:
    rel, names = planner.table(table.name, where)
    qualifier = alias or table.name[-1]
    scope = Scope([ScopeColumn(name, qualifier) for name in names], tables={qualifier})
    return Frame(rel, scope)


def _filtered(planner: QueryPlanner, frame: Frame, condition: exp.Expr | None) -> None:
    if condition is not None:
        value = Lowerer(frame, planner, "WHERE").condition(condition, "WHERE")
        frame.rel = r.filter_(frame.rel, [value])


def _as_query(planner: QueryPlanner, rel: r.Rel, table: BoundRelation) -> PlannedQuery:
    width = len(table.schema.columns)
    return plan_with(planner, Planned(rel, table.schema.names, width, [None] * width, []))


def plan_update(statement: Update, catalog: CatalogView, settings: Mapping[str, str]) -> ChangePlan:
    try:
        return _plan_update(statement, catalog, settings)
    except SqlError as exc:
        raise exc.at(statement.position) from None


def _plan_update(
    statement: Update, catalog: CatalogView, settings: Mapping[str, str]
) -> ChangePlan:
    where = statement.position
    table = target_table(statement.table, catalog, settings, where, "update")
    planner = QueryPlanner(catalog, settings)
    frame = _table_frame(planner, table, statement.alias, where)
    _filtered(planner, frame, statement.where)
    names = table.schema.names
    columns = table.schema.columns
    label = table.name[-1]
    new_values: dict[int, Typed] = {}
    lowerer = Lowerer(frame, planner, "UPDATE")
    for assignment in statement.assignments:
        if assignment.column not in names:
            raise SqlError(
                UNDEFINED_COLUMN,
                f'column "{assignment.column}" of relation "{dotted(table.name)}" does not exist',
                assignment.position,
            )
        index = names.index(assignment.column)
        if index in new_values:
            raise SqlError(
                SYNTAX_ERROR,
                f'multiple assignments to same column "{assignment.column}"',
                assignment.position,
            )
        node = assignment.value
        if isinstance(node, exp.Column) and identifier(node.this) == "default" and not node.table:
            value = _null_for(columns[index], label, assignment.position)
        else:
            value = lowerer.lower(node)
        new_values[index] = assign(
            value, columns[index], label, position(node) or assignment.position
        )
    width = len(columns)
    old_rows = r.project(frame.rel, range(width))
    row = [new_values.get(i) or frame.column(i) for i in range(width)]
    new_rows = project_values(frame, row)
    return ChangePlan(
        table, _as_query(planner, old_rows, table), _as_query(planner, new_rows, table)
    )


def plan_delete(statement: Delete, catalog: CatalogView, settings: Mapping[str, str]) -> ChangePlan:
    try:
        return _plan_delete(statement, catalog, settings)
    except SqlError as exc:
        raise exc.at(statement.position) from None


def _plan_delete(
    statement: Delete, catalog: CatalogView, settings: Mapping[str, str]
) -> ChangePlan:
    where = statement.position
    table = target_table(statement.table, catalog, settings, where, "delete from")
    planner = QueryPlanner(catalog, settings)
    frame = _table_frame(planner, table, statement.alias, where)
    _filtered(planner, frame, statement.where)
    old_rows = r.project(frame.rel, range(len(table.schema.columns)))
    return ChangePlan(table, _as_query(planner, old_rows, table), None)
