"""Hypothesis strategies for random well-typed plans and random input histories.

For the compute engine's main property: for random plans over random histories, the output
at every time equals ``reference_eval.evaluate(plan, inputs_at(history, t))``.

- :func:`input_schemas`: 1-3 input collections (``u1``..``u3``) with 1-3 INT64/TEXT columns,
  some nullable.
- :func:`plans`: a random plan over given schemas, well typed by construction, covering
  every relation node and every function (nested), with ``output_schema`` set.
- :func:`histories`: per input, ``(row, time, diff)`` updates at times ``0..max_time``
  (inserts, deletes, updates as retraction plus insertion, unconsolidated repeats), keeping
  every multiplicity non-negative at every time, plus batch boundaries that put several
  times in one batch.
- :func:`scenarios`: all three together.
- :func:`inputs_at` / :func:`versions`: the input multisets at a time / at every time, to
  compare ``evaluate(plan, inputs_at(history, t))`` with an engine's output at ``t``;
  :func:`batches`: the updates split at ``batch_uppers``, as an engine would receive them.

Values come from small skewed domains (plus NULLs and a few extremes for overflow), so joins
match and groups collide. Reduce, TopK, Window and outer joins only ever see non-negative inputs
(the contract leaves them undefined otherwise): such inputs are wrapped in Threshold.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, TypeAlias

from hypothesis import strategies as st

from tidemark.columnar import Column, ColumnType, RelationSchema
from tidemark.plan import builders as pb
from tidemark.plan import derive_schema, scalar_type
from tidemark.plan.derive import aggregate_type
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import plan_pb2

T = ColumnType
Row: TypeAlias = tuple[Any, ...]
RowUpdate: TypeAlias = tuple[Row, int, int]
"""``(row, time, diff)``."""

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# Skewed small domains: early entries are drawn most often (sampled_from shrinks towards
# them too), the tail reaches edge cases.
SMALL_INTS = [1, 0, 2, 1, 3, -1, 2, 10, -7]
EXTREME_INTS = [INT64_MAX, INT64_MIN, 2**62, -(2**62)]
SHORT_TEXTS = ["a", "b", "", "ab", "a", "B", " a ", "ba", "é", "ß", "a_b", "%"]
PATTERNS = ["a%", "%b", "_", "%", "a", "a_", "%a%", "", "__%"]
TEXTS_TO_PARSE = ["1", " 2 ", "-3", "x", "1.5", "2020-01-02", "true", "1e3", "", "NaN"]
DATES = [datetime.date(2020, 1, 1), datetime.date(2020, 2, 29), datetime.date(1999, 12, 31)]
TIMESTAMPS = [
    datetime.datetime(2020, 1, 1, 12, 30),
    datetime.datetime(2020, 2, 29, 23, 59, 59, 999999),
    datetime.datetime(1999, 12, 31, 0, 0, 0, 1),
]
FLOATS = [0.5, 1.0, -2.25, 0.1, 1e308, float("inf"), float("nan"), -0.0]
DECIMALS = [Decimal("1.50"), Decimal("0.01"), Decimal("-2.5"), Decimal("100")]
DECIMAL_TYPE = ScalarType.decimal(10, 2)
WINDOW_KINDS = [
    "row_number",
    "rank",
    "dense_rank",
    "lag",
    "lead",
    "first_value",
    "last_value",
    "count",
    "sum",
    "min",
    "max",
    "avg",
]


@dataclass(frozen=True)
class History:
    """Updates per input collection, and the batch boundaries an engine should use."""

    updates: dict[str, list[RowUpdate]]
    max_time: int
    # Strictly increasing; batch i holds the updates with times in
    # [batch_uppers[i-1], batch_uppers[i]) (the first from 0); the last is max_time + 1.
    batch_uppers: list[int]


@dataclass(frozen=True)
class Scenario:
    schemas: dict[str, RelationSchema]
    plan: plan_pb2.Plan
    history: History


def inputs_at(history: History, time: int) -> dict[str, dict[Row, int]]:
    """Each input's multiset as of ``time``: all updates at times <= ``time``, summed."""
    result: dict[str, dict[Row, int]] = {}
    for name, updates in history.updates.items():
        version: dict[Row, int] = {}
        for row, at, diff in updates:
            if at <= time:
                version[row] = version.get(row, 0) + diff
        result[name] = {row: count for row, count in version.items() if count != 0}
    return result


def versions(history: History) -> Iterator[tuple[int, dict[str, dict[Row, int]]]]:
    """``(time, inputs_at(history, time))`` for every time ``0..max_time``."""
    for time in range(history.max_time + 1):
        yield time, inputs_at(history, time)


def batches(history: History) -> Iterator[tuple[int, int, dict[str, list[RowUpdate]]]]:
    """``(lower, upper, updates by input)`` for each batch, in time order."""
    lower = 0
    for upper in history.batch_uppers:
        chosen = {
            name: [u for u in updates if lower <= u[1] < upper]
            for name, updates in history.updates.items()
        }
        yield lower, upper, chosen
        lower = upper


# Inputs and histories ---------------------------------------------------------------------


def value_strategy(column: Column) -> st.SearchStrategy[Any]:
    """Skewed values for an input column (INT64 or TEXT), NULL where allowed."""
    if column.type is T.INT64:
        # Mostly the first few, so keys collide; one draw in ten is an extreme (overflow).
        choices: list[Any] = SMALL_INTS[:5] * 3 + SMALL_INTS + EXTREME_INTS[:3]
    else:
        choices = SHORT_TEXTS[:4] * 3 + SHORT_TEXTS
    base = st.sampled_from(choices)
    if column.nullable:
        return st.one_of(base, st.none())
    return base


@st.composite
def input_schemas(draw: st.DrawFn, max_inputs: int = 3) -> dict[str, RelationSchema]:
    count = draw(st.integers(1, max_inputs))
    schemas = {}
    for index in range(1, count + 1):
        width = draw(st.integers(1, 3))
        columns = []
        for position in range(width):
            # The first column is usually INT64, so inputs share a join-friendly key.
            kinds = [T.INT64, T.INT64, T.INT64, T.TEXT] if position == 0 else [T.INT64, T.TEXT]
            kind = draw(st.sampled_from(kinds))
            nullable = draw(st.booleans())
            columns.append(Column("abc"[position], kind, nullable))
        schemas[f"u{index}"] = RelationSchema(columns)
    return schemas


@st.composite
def collection_history(draw: st.DrawFn, schema: RelationSchema, max_time: int) -> list[RowUpdate]:
    rows = st.tuples(*(value_strategy(c) for c in schema.columns))
    current: dict[Row, int] = {}
    updates: list[RowUpdate] = []

    def change(row: Row, time: int, diff: int) -> None:
        updates.append((row, time, diff))
        current[row] = current.get(row, 0) + diff
        if current[row] == 0:
            del current[row]

    for time in range(max_time + 1):
        for _ in range(draw(st.sampled_from([2, 1, 3, 0, 4]))):
            op = draw(st.sampled_from(["insert", "insert", "delete", "update", "churn"]))
            present = sorted(current, key=repr)
            if op == "insert" or not present:
                change(draw(rows), time, draw(st.sampled_from([1, 1, 2, 3])))
            elif op == "delete":
                row = draw(st.sampled_from(present))
                change(row, time, -draw(st.integers(1, current[row])))
            elif op == "update":
                row = draw(st.sampled_from(present))
                change(row, time, -1)
                change(draw(rows), time, 1)
            else:  # the same row up and down at one time: unconsolidated updates
                row = draw(rows)
                change(row, time, 2)
                change(row, time, -1)
    return updates


@st.composite
def histories(draw: st.DrawFn, schemas: Mapping[str, RelationSchema], max_time: int = 5) -> History:
    updates = {name: draw(collection_history(schema, max_time)) for name, schema in schemas.items()}
    inner = draw(st.sets(st.integers(1, max_time), max_size=max_time))
    uppers = sorted(inner | {max_time + 1})
    return History(updates, max_time, uppers)


# Scalars ----------------------------------------------------------------------------------

# Kinds a Map expression or a cast may produce.
EXPRESSION_KINDS = [T.INT64, T.TEXT, T.BOOL, T.INT64, T.DECIMAL, T.FLOAT64, T.DATE, T.TIMESTAMP]


@dataclass
class _ScalarMaker:
    draw: st.DrawFn
    columns: list[ScalarType]

    def choice(self, options: Sequence[Any]) -> Any:
        return self.draw(st.sampled_from(options))

    def columns_of(self, *kinds: ColumnType) -> list[int]:
        return [i for i, t in enumerate(self.columns) if t.kind in kinds]

    def literal(self, kind: ColumnType) -> plan_pb2.Scalar:
        if self.draw(st.integers(0, 9)) == 9:
            return pb.literal(None, DECIMAL_TYPE if kind is T.DECIMAL else kind)
        if kind is T.INT64:
            return pb.literal(self.choice(SMALL_INTS + EXTREME_INTS[:1]), kind)
        if kind is T.TEXT:
            return pb.literal(self.choice(SHORT_TEXTS), kind)
        if kind is T.BOOL:
            return pb.literal(self.draw(st.booleans()), kind)
        if kind is T.DECIMAL:
            return pb.literal(self.choice(DECIMALS), T.DECIMAL)
        if kind is T.FLOAT64:
            return pb.literal(self.choice(FLOATS), kind)
        if kind is T.DATE:
            return pb.literal(self.choice(DATES), kind)
        return pb.literal(self.choice(TIMESTAMPS), T.TIMESTAMP)

    def leaf(self, kind: ColumnType) -> plan_pb2.Scalar:
        positions = self.columns_of(kind)
        if positions and self.draw(st.integers(0, 3)) < 3:
            return pb.column(self.choice(positions))
        return self.literal(kind)

    def expr(self, kind: ColumnType, depth: int = 2, leaf_ok: bool = True) -> plan_pb2.Scalar:
        """A random expression producing ``kind`` (any decimal type for DECIMAL); a function
        application, cast or case when not ``leaf_ok``."""
        if depth <= 0 or (leaf_ok and self.draw(st.integers(0, 3)) == 0):
            return self.leaf(kind)
        make = getattr(self, f"_{kind.name.lower()}")
        result: plan_pb2.Scalar = make(depth - 1)
        return result

    def simple_predicate(self) -> plan_pb2.Scalar:
        """A column compared with a value from its domain: selective, but rarely empty."""
        positions = self.columns_of(T.INT64, T.TEXT)
        if not positions:
            return self.expr(T.BOOL, leaf_ok=False)
        position = self.choice(positions)
        column = pb.column(position)
        shape = self.choice(["compare", "compare", "compare", "is_not_null", "and", "or"])
        if shape == "is_not_null":
            return pb.call(shape, column)
        if shape in ("and", "or"):
            return pb.call(shape, self.simple_predicate(), self.simple_predicate())
        name = self.choice(["le", "ge", "ne", "eq", "lt", "gt"])
        if self.columns[position].kind is T.INT64:
            return pb.call(name, column, pb.literal(self.choice(SMALL_INTS[:5]), T.INT64))
        return pb.call(name, column, pb.literal(self.choice(SHORT_TEXTS[:4]), T.TEXT))

    def any_expr(self, depth: int, leaf_ok: bool = True) -> plan_pb2.Scalar:
        return self.expr(self.choice(EXPRESSION_KINDS), depth, leaf_ok)

    def _comparable_pair(self, depth: int) -> tuple[plan_pb2.Scalar, plan_pb2.Scalar]:
        kind = self.choice([T.INT64, T.INT64, T.TEXT, T.DECIMAL, T.FLOAT64, T.DATE, T.BOOL])
        left = self.expr(kind, depth)
        # Numbers compare across numeric kinds.
        if kind in (T.INT64, T.DECIMAL, T.FLOAT64) and self.draw(st.booleans()):
            kind = self.choice([T.INT64, T.DECIMAL, T.FLOAT64])
        return left, self.expr(kind, depth)

    def _bool(self, depth: int) -> plan_pb2.Scalar:
        shape = self.choice(["compare", "compare", "null", "and", "or", "not", "like", "case"])
        if shape == "compare":
            left, right = self._comparable_pair(depth)
            return pb.call(self.choice(["eq", "ne", "lt", "le", "gt", "ge"]), left, right)
        if shape == "null":
            return pb.call(self.choice(["is_null", "is_not_null"]), self.any_expr(depth))
        if shape in ("and", "or"):
            args = [self.expr(T.BOOL, depth) for _ in range(self.draw(st.integers(2, 3)))]
            return pb.call(shape, *args)
        if shape == "not":
            return pb.call("not", self.expr(T.BOOL, depth))
        if shape == "like":
            pattern = self.choice([pb.literal(p, T.TEXT) for p in PATTERNS])
            return pb.call("like", self.expr(T.TEXT, depth), pattern)
        return self._case(T.BOOL, depth)

    def _case(self, kind: ColumnType, depth: int) -> plan_pb2.Scalar:
        return pb.case(self.expr(T.BOOL, depth), self.expr(kind, depth), self.expr(kind, depth))

    def _coalesce(self, kind: ColumnType, depth: int) -> plan_pb2.Scalar:
        args = [self.expr(kind, depth) for _ in range(self.draw(st.integers(1, 3)))]
        return pb.call("coalesce", *args)

    def _numeric(self, kind: ColumnType, depth: int) -> plan_pb2.Scalar:
        """Arithmetic whose promoted kind is ``kind``."""
        # The other operand may be of any kind that promotes to ``kind``.
        lower = {
            T.INT64: [T.INT64],
            T.DECIMAL: [T.INT64, T.DECIMAL],
            T.FLOAT64: [T.INT64, T.DECIMAL, T.FLOAT64],
        }[kind]
        name = self.choice(["add", "sub", "mul", "div", "mod", "neg", "abs"])
        if name in ("neg", "abs"):
            return pb.call(name, self.expr(kind, depth))
        left, right = self.expr(kind, depth), self.expr(self.choice(lower), depth)
        if self.draw(st.booleans()):
            left, right = right, left
        return pb.call(name, left, right)

    def _int64(self, depth: int) -> plan_pb2.Scalar:
        extracts = ["extract_year", "extract_month", "extract_day"]
        shape = self.choice(
            ["arith", "arith", "arith", "length", *extracts, "days", "coalesce", "case", "cast"]
        )
        if shape == "arith":
            return self._numeric(T.INT64, depth)
        if shape == "days":
            return pb.call("days_between", self.expr(T.DATE, depth), self.expr(T.DATE, depth))
        if shape == "length":
            return pb.call("length", self.expr(T.TEXT, depth))
        if shape in extracts:
            return pb.call(shape, self.expr(self.choice([T.DATE, T.TIMESTAMP]), depth))
        if shape == "coalesce":
            return self._coalesce(T.INT64, depth)
        if shape == "case":
            return self._case(T.INT64, depth)
        return pb.cast(self.expr(self.choice([T.TEXT, T.DECIMAL, T.FLOAT64]), depth), T.INT64)

    def _text(self, depth: int) -> plan_pb2.Scalar:
        shape = self.choice(
            ["lower", "upper", "trim", "substr", "substr", "concat", "coalesce", "case", "cast"]
        )
        if shape in ("lower", "upper", "trim"):
            return pb.call(shape, self.expr(T.TEXT, depth))
        if shape == "substr":
            args = [self.expr(T.TEXT, depth), self.expr(T.INT64, depth)]
            if self.draw(st.booleans()):
                args.append(self.expr(T.INT64, depth))
            return pb.call("substr", *args)
        if shape == "concat":
            args = [self.expr(T.TEXT, depth) for _ in range(self.draw(st.integers(1, 3)))]
            return pb.call("concat", *args)
        if shape == "coalesce":
            return self._coalesce(T.TEXT, depth)
        if shape == "case":
            return self._case(T.TEXT, depth)
        return pb.cast(self.any_expr(depth), T.TEXT)

    def _decimal(self, depth: int) -> plan_pb2.Scalar:
        shape = self.choice(["arith", "arith", "cast", "cast_text", "coalesce", "case"])
        if shape == "arith":
            return self._numeric(T.DECIMAL, depth)
        if shape == "cast":
            source = self.expr(self.choice([T.INT64, T.FLOAT64, T.DECIMAL]), depth)
            return pb.cast(source, self.choice([DECIMAL_TYPE, ScalarType.decimal(4, 1)]))
        if shape == "cast_text":
            text = self.choice([pb.literal(t, T.TEXT) for t in TEXTS_TO_PARSE])
            return pb.cast(text, DECIMAL_TYPE)
        if shape == "coalesce":
            return self._coalesce(T.DECIMAL, depth)
        return self._case(T.DECIMAL, depth)

    def _float64(self, depth: int) -> plan_pb2.Scalar:
        shape = self.choice(["arith", "arith", "cast", "coalesce", "case"])
        if shape == "arith":
            return self._numeric(T.FLOAT64, depth)
        if shape == "cast":
            return pb.cast(self.expr(self.choice([T.INT64, T.DECIMAL, T.TEXT]), depth), T.FLOAT64)
        if shape == "coalesce":
            return self._coalesce(T.FLOAT64, depth)
        return self._case(T.FLOAT64, depth)

    def _date(self, depth: int) -> plan_pb2.Scalar:
        shape = self.choice(["from_text", "from_timestamp", "add_days", "coalesce", "case"])
        if shape == "add_days":
            return pb.call("add_days", self.expr(T.DATE, depth), self.expr(T.INT64, depth))
        if shape == "from_text":
            text = self.choice([pb.literal(t, T.TEXT) for t in TEXTS_TO_PARSE])
            return pb.cast(text, T.DATE)
        if shape == "from_timestamp":
            return pb.cast(self.expr(T.TIMESTAMP, depth), T.DATE)
        if shape == "coalesce":
            return self._coalesce(T.DATE, depth)
        return self._case(T.DATE, depth)

    def _timestamp(self, depth: int) -> plan_pb2.Scalar:
        shape = self.choice(["trunc", "from_date", "add_months", "add_microseconds", "case"])
        if shape in ("add_months", "add_microseconds"):
            return pb.call(shape, self.expr(T.TIMESTAMP, depth), self.expr(T.INT64, depth))
        if shape == "trunc":
            return pb.call("date_trunc_day", self.expr(T.TIMESTAMP, depth))
        if shape == "from_date":
            return pb.cast(self.expr(T.DATE, depth), T.TIMESTAMP)
        return self._case(T.TIMESTAMP, depth)


# Relations --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Node:
    relation: plan_pb2.Relation
    types: list[ScalarType]
    # No negative multiplicity can appear (so Reduce, TopK and outer joins are defined).
    nonneg: bool


@dataclass
class _PlanMaker:
    draw: st.DrawFn
    schemas: Mapping[str, RelationSchema]
    # Let bindings in force, outermost first; a LocalGet refers to the last one with its id.
    scope: list[tuple[int, _Node]] = field(default_factory=list)

    def choice(self, options: Sequence[Any]) -> Any:
        return self.draw(st.sampled_from(options))

    def scalars(self, node: _Node) -> _ScalarMaker:
        return _ScalarMaker(self.draw, node.types)

    def node(self, relation: plan_pb2.Relation, nonneg: bool) -> _Node:
        schema = self._derive(relation)
        return _Node(relation, [ScalarType.of_column(c) for c in schema.columns], nonneg)

    def _derive(self, relation: plan_pb2.Relation) -> RelationSchema:
        # LocalGets need their bindings: wrap the node in the Lets in scope.
        wrapped = relation
        for let_id, bound in reversed(self.scope):
            wrapped = pb.let(let_id, bound.relation, wrapped)
        return derive_schema(wrapped)

    def sql_relation(self, node: _Node) -> _Node:
        """``node`` with negative multiplicities removed if it may have any."""
        if node.nonneg:
            return node
        relation = node.relation
        if relation.WhichOneof("kind") == "negate":
            # Threshold(Negate(x)) is always empty: keep x's positive part instead.
            relation = relation.negate.input
        return _Node(pb.threshold(relation), node.types, True)

    def leaf(self) -> _Node:
        options = ["get", "get", "get", "constant"] + ["local_get"] * (2 if self.scope else 0)
        shape = self.choice(options)
        if shape == "local_get":
            visible = dict(self.scope)  # later bindings shadow earlier ones
            let_id = self.choice(sorted(visible))
            bound = visible[let_id]
            return _Node(pb.local_get(let_id), bound.types, bound.nonneg)
        if shape == "constant":
            return self.constant()
        name = self.choice(sorted(self.schemas))
        return self.node(pb.get(name, self.schemas[name]), nonneg=True)

    def constant(self) -> _Node:
        name = self.choice(sorted(self.schemas))
        schema = self.schemas[name]
        rows = []
        for _ in range(self.draw(st.integers(1, 3))):
            values = tuple(self.draw(value_strategy(c)) for c in schema.columns)
            rows.append((values, self.choice([1, 1, 2, -1])))
        return self.node(pb.constant(schema, rows), nonneg=all(d > 0 for _, d in rows))

    def relation(self, depth: int, leaf_ok: bool = True) -> _Node:
        if depth <= 0 or (leaf_ok and self.draw(st.integers(0, 4)) == 0):
            return self.leaf()
        shape = self.choice(
            [
                "filter",
                "filter",
                "map",
                "map",
                "project",
                "union",
                "negate",
                "threshold",
                "distinct",
                "join",
                "join",
                "reduce",
                "reduce",
                "top_k",
                "window",
                "let",
            ]
        )
        result: _Node = getattr(self, f"_{shape}")(depth - 1)
        return result

    def _filter(self, depth: int) -> _Node:
        child = self.relation(depth)
        maker = self.scalars(child)
        predicates = [
            maker.simple_predicate()
            if self.draw(st.integers(0, 2))
            else maker.expr(T.BOOL, 2, False)
            for _ in range(self.draw(st.integers(1, 2)))
        ]
        return self.node(pb.filter(child.relation, *predicates), child.nonneg)

    def _map(self, depth: int) -> _Node:
        child = self.relation(depth)
        types = list(child.types)
        expressions = []
        for _ in range(self.draw(st.integers(1, 3))):
            expr = _ScalarMaker(self.draw, types).any_expr(2, leaf_ok=False)
            types.append(scalar_type(expr, types))  # later expressions see earlier ones
            expressions.append(expr)
        return self.node(pb.map(child.relation, *expressions), child.nonneg)

    def _project(self, depth: int) -> _Node:
        child = self.relation(depth)
        width = len(child.types)
        positions = self.draw(st.lists(st.integers(0, width - 1), min_size=1, max_size=3))
        return self.node(pb.project(child.relation, *positions), child.nonneg)

    def _same_shape(self, like: _Node, depth: int) -> _Node:
        """A relation with ``like``'s column types: another one projected to match, or
        ``like`` itself filtered."""
        other = self.relation(depth)
        picks = []
        for wanted in like.types:
            fits = [i for i, t in enumerate(other.types) if t.same_type(wanted)]
            if not fits:
                break
            picks.append(self.choice(fits))
        else:
            return self.node(pb.project(other.relation, *picks), other.nonneg)
        predicate = self.scalars(like).expr(T.BOOL)
        return self.node(pb.filter(like.relation, predicate), like.nonneg)

    def _union(self, depth: int) -> _Node:
        first = self.relation(depth)
        second = self._same_shape(first, depth)
        if self.draw(st.booleans()):  # EXCEPT ALL shape: first - second, then Threshold
            negated = pb.negate(second.relation)
            return self.node(pb.threshold(pb.union(first.relation, negated)), nonneg=True)
        return self.node(pb.union(first.relation, second.relation), first.nonneg and second.nonneg)

    def _negate(self, depth: int) -> _Node:
        child = self.relation(depth)
        return self.node(pb.negate(child.relation), nonneg=False)

    def _threshold(self, depth: int) -> _Node:
        return self.node(pb.threshold(self.relation(depth).relation), nonneg=True)

    def _distinct(self, depth: int) -> _Node:
        return self.node(pb.distinct(self.relation(depth).relation), nonneg=True)

    def _join(self, depth: int) -> _Node:
        kind = self.choice(["inner", "inner", "left_outer", "right_outer", "full_outer"])
        left, right = self.relation(depth), self.relation(depth)
        if kind != "inner":
            left, right = self.sql_relation(left), self.sql_relation(right)
        pairs = [
            (i, j)
            for i, lt in enumerate(left.types)
            for j, rt in enumerate(right.types)
            if (lt.is_numeric and rt.is_numeric) or lt.kind is rt.kind
        ]
        # Mostly equi-joins; sometimes a cross product.
        count = 0
        if pairs and self.draw(st.integers(0, 4)) < 4:
            count = self.draw(st.integers(1, 2))
        chosen = [self.choice(pairs) for _ in range(count)]
        left_keys: list[plan_pb2.Scalar] = []
        right_keys: list[plan_pb2.Scalar] = []
        for i, j in chosen:
            left_keys.append(pb.column(i))
            right_keys.append(pb.column(j))
            # Sometimes a computed key: both sides through the same text function.
            if left.types[i].kind is T.TEXT and self.draw(st.integers(0, 3)) == 0:
                function = self.choice(["lower", "upper", "trim"])
                left_keys[-1] = pb.call(function, left_keys[-1])
                right_keys[-1] = pb.call(function, right_keys[-1])
        relation = pb.join(left.relation, right.relation, left_keys, right_keys, kind)
        return self.node(relation, left.nonneg and right.nonneg)

    def _aggregate(self, maker: _ScalarMaker) -> plan_pb2.Aggregate:
        # One draw for the pair: separate draws came out correlated under hypothesis.
        func, distinct = self.choice(
            [(f, d) for f in ("count", "sum", "min", "max", "avg") for d in (False, True)]
        )
        if func == "count" and not distinct and self.draw(st.booleans()):
            return pb.aggregate("count")
        if func in ("sum", "avg"):
            kind = self.choice([T.INT64, T.INT64, T.DECIMAL, T.FLOAT64])
        else:
            kind = self.choice([T.INT64, T.TEXT, T.INT64, T.DECIMAL, T.FLOAT64, T.BOOL, T.DATE])
        expr = maker.expr(kind, 1)
        return pb.aggregate(func, expr, distinct=distinct)

    def _reduce(self, depth: int) -> _Node:
        child = self.sql_relation(self.relation(depth))
        width = len(child.types)
        key = self.draw(st.lists(st.integers(0, width - 1), max_size=2, unique=True))
        maker = self.scalars(child)
        count = self.draw(st.integers(0 if key else 1, 3))
        aggregates = [self._aggregate(maker) for _ in range(count)]
        for aggregate in aggregates:
            aggregate_type(aggregate, child.types)  # fail here, not later, if ill-typed
        return self.node(pb.reduce(child.relation, key, aggregates), nonneg=True)

    def _top_k(self, depth: int) -> _Node:
        child = self.sql_relation(self.relation(depth))
        width = len(child.types)
        key = self.draw(st.lists(st.integers(0, width - 1), max_size=1, unique=True))
        order = [
            pb.sort_key(
                self.draw(st.integers(0, width - 1)),
                descending=self.draw(st.booleans()),
                nulls_flipped=self.draw(st.booleans()),
            )
            for _ in range(self.draw(st.integers(0, 2)))
        ]
        limit = self.draw(st.one_of(st.none(), st.integers(0, 3)))
        offset = self.draw(st.sampled_from([0, 0, 1, 2]))
        return self.node(pb.top_k(child.relation, key, order, limit, offset), nonneg=True)

    def _window(self, depth: int) -> _Node:
        child = self.sql_relation(self.relation(depth))
        width = len(child.types)
        key = self.draw(st.lists(st.integers(0, width - 1), max_size=2, unique=True))
        order = [
            pb.sort_key(
                self.draw(st.integers(0, width - 1)),
                descending=self.draw(st.booleans()),
                nulls_flipped=self.draw(st.booleans()),
            )
            for _ in range(self.draw(st.integers(0, 2)))
        ]
        maker = self.scalars(child)
        functions = [self._window_function(maker) for _ in range(self.draw(st.integers(1, 3)))]
        return self.node(pb.window(child.relation, key, order, functions), nonneg=True)

    def _window_function(self, maker: _ScalarMaker) -> plan_pb2.WindowFunction:
        kind = self.choice(WINDOW_KINDS)
        if kind in ("row_number", "rank", "dense_rank"):
            return pb.window_function(kind)
        frame = self._frame() if self.draw(st.integers(0, 3)) else None
        if kind in ("lag", "lead"):
            argument = self._window_argument(maker, EXPRESSION_KINDS)
            argument_type = scalar_type(argument, maker.columns)
            offset = self.choice([None, 1, 2, 0, 3])
            default = None
            if self.draw(st.booleans()):
                default = maker.expr(argument_type.kind, 1)
                if not scalar_type(default, maker.columns).same_type(argument_type):
                    default = pb.cast(default, argument_type)
            return pb.window_function(kind, argument, offset=offset, default=default)
        if kind in ("first_value", "last_value"):
            argument = self._window_argument(maker, EXPRESSION_KINDS)
            return pb.window_function(kind, argument, frame=frame)
        if kind == "count" and self.draw(st.booleans()):
            return pb.window_function("count", frame=frame)
        if kind in ("sum", "avg"):
            kinds = [T.INT64, T.INT64, T.DECIMAL, T.FLOAT64]
        else:
            kinds = [T.INT64, T.TEXT, T.INT64, T.DECIMAL, T.FLOAT64, T.DATE]
        return pb.window_function(kind, self._window_argument(maker, kinds), frame=frame)

    def _window_argument(self, maker: _ScalarMaker, kinds: Sequence[ColumnType]) -> plan_pb2.Scalar:
        """Mostly a column (so values differ along the partition), else any expression."""
        columns = maker.columns_of(*kinds)
        if columns and self.draw(st.integers(0, 3)):
            return pb.column(self.choice(columns))
        return maker.expr(self.choice(kinds), 1)

    def _frame(self) -> plan_pb2.WindowFrame:
        if self.draw(st.booleans()):
            start = self.choice(["unbounded_preceding", "current_row"])
            end = self.choice(["current_row", "unbounded_following"])
            return pb.frame("range", start, end)
        offsets = st.integers(0, 2)
        starts: list[Any] = ["unbounded_preceding", "current_row"]
        starts += [("preceding", self.draw(offsets)), ("following", self.draw(offsets))]
        ends: list[Any] = ["unbounded_following", "current_row"]
        ends += [("preceding", self.draw(offsets)), ("following", self.draw(offsets))]
        start, end = self.choice(starts), self.choice(ends)
        start_kind = start if isinstance(start, str) else start[0]
        end_kind = end if isinstance(end, str) else end[0]
        if (start_kind, end_kind) in (
            ("current_row", "preceding"),
            ("following", "preceding"),
            ("following", "current_row"),
        ):
            end = "unbounded_following"  # SQL forbids frames that end before they start
        return pb.frame("rows", start, end)

    def _let(self, depth: int) -> _Node:
        value = self.relation(depth)
        let_id = self.draw(st.integers(0, 2))
        self.scope.append((let_id, value))
        try:
            body = self.relation(depth)
            # Make the body use the binding at least once, often twice.
            if not _uses_local(body.relation, let_id):
                local = _Node(pb.local_get(let_id), value.types, value.nonneg)
                body = self._combine(body, local)
        finally:
            self.scope.pop()
        return _Node(pb.let(let_id, value.relation, body.relation), body.types, body.nonneg)

    def _combine(self, body: _Node, local: _Node) -> _Node:
        """A node using both ``body`` and ``local``: a join on a shared column type, or a
        cross join."""
        pairs = [
            (i, j)
            for i, lt in enumerate(body.types)
            for j, rt in enumerate(local.types)
            if lt.kind is rt.kind
        ]
        keys: tuple[list[int], list[int]] = ([], [])
        if pairs:
            i, j = self.choice(pairs)
            keys = ([i], [j])
        relation = pb.join(body.relation, local.relation, keys[0], keys[1])
        return self.node(relation, body.nonneg and local.nonneg)


def children(relation: plan_pb2.Relation) -> list[plan_pb2.Relation]:
    """The relations a node reads, in field order."""
    kind = relation.WhichOneof("kind")
    if kind is None:
        return []
    node = getattr(relation, kind)
    if kind == "union":
        return list(node.inputs)
    if kind == "join":
        return [node.left, node.right]
    if kind == "let":
        return [node.value, node.body]
    if kind in ("get", "constant", "local_get"):
        return []
    return [node.input]


def _uses_local(relation: plan_pb2.Relation, let_id: int) -> bool:
    kind = relation.WhichOneof("kind")
    if kind == "local_get":
        return relation.local_get.id == let_id
    if kind == "let" and relation.let.id == let_id:
        return _uses_local(relation.let.value, let_id)  # the body sees the inner binding
    return any(_uses_local(child, let_id) for child in children(relation))


@st.composite
def plans(
    draw: st.DrawFn, schemas: Mapping[str, RelationSchema], max_depth: int = 3
) -> plan_pb2.Plan:
    """A random plan over ``schemas`` with ``output_schema`` set to its derived schema."""
    maker = _PlanMaker(draw, schemas)
    root = maker.relation(max_depth, leaf_ok=False).relation
    return pb.plan(root, derive_schema(root))


@st.composite
def window_plans(draw: st.DrawFn, schemas: Mapping[str, RelationSchema]) -> plan_pb2.Plan:
    """A Window straight over one input, with at most one partition column, so partitions
    are large enough for sliding frames to drop rows as well as take them in."""
    maker = _PlanMaker(draw, schemas)
    name = draw(st.sampled_from(sorted(schemas)))
    child = maker.node(pb.get(name, schemas[name]), nonneg=True)
    width = len(child.types)
    key = draw(st.lists(st.integers(0, width - 1), max_size=1, unique=True))
    order = [
        pb.sort_key(
            draw(st.integers(0, width - 1)),
            descending=draw(st.booleans()),
            nulls_flipped=draw(st.booleans()),
        )
        for _ in range(draw(st.integers(0, 2)))
    ]
    scalars = maker.scalars(child)
    functions = [maker._window_function(scalars) for _ in range(draw(st.integers(1, 4)))]
    root = pb.window(child.relation, key, order, functions)
    return pb.plan(root, derive_schema(root))


@st.composite
def scenarios(draw: st.DrawFn, max_depth: int = 3, max_time: int = 5) -> Scenario:
    schemas = draw(input_schemas())
    plan = draw(plans(schemas, max_depth))
    history = draw(histories(schemas, max_time))
    return Scenario(schemas, plan, history)


@st.composite
def expression_plans(draw: st.DrawFn, schemas: Mapping[str, RelationSchema]) -> plan_pb2.Plan:
    """A Map of 1-3 deep random expressions over one input, sometimes grouped by a Reduce with
    random aggregates over the new columns: many functions, casts and aggregates per plan,
    for engines whose cost is per plan rather than per row."""
    maker = _PlanMaker(draw, schemas)
    name = draw(st.sampled_from(sorted(schemas)))
    child = maker.node(pb.get(name, schemas[name]), nonneg=True)
    types = list(child.types)
    expressions = []
    for _ in range(draw(st.integers(1, 3))):
        expr = _ScalarMaker(draw, types).any_expr(3, leaf_ok=False)
        types.append(scalar_type(expr, types))
        expressions.append(expr)
    mapped = maker.node(pb.map(child.relation, *expressions), nonneg=True)
    root = mapped.relation
    if draw(st.booleans()):
        key = draw(st.lists(st.integers(0, len(types) - 1), max_size=1, unique=True))
        scalars = _ScalarMaker(draw, types)
        aggregates = [maker._aggregate(scalars) for _ in range(draw(st.integers(1, 3)))]
        root = pb.reduce(root, key, aggregates)
    return pb.plan(root, derive_schema(root))
