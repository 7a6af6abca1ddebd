"""Type derivation and validation of plans: each node's output schema from its inputs.

``check_plan`` is what compute runs when it installs a plan: it walks every node, checks
column positions, expression types, function names and literals, and returns the output
schema. Errors are ``InvalidArgument`` naming the node (a path from the root) and the problem.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tidemark.columnar import Column, ColumnType, RelationSchema
from tidemark.columnar.schema import RESERVED_COLUMNS
from tidemark.errors import InvalidArgument
from tidemark.plan.datum import check_value_fits, datum_type, from_datum
from tidemark.plan.functions import FUNCTIONS, cast_type, result_type
from tidemark.plan.scalar_types import ScalarType, unify
from tidemark.v1 import common_pb2, plan_pb2

AGGREGATE_NAMES = {
    plan_pb2.Aggregate.FUNC_COUNT: "count",
    plan_pb2.Aggregate.FUNC_SUM: "sum",
    plan_pb2.Aggregate.FUNC_MIN: "min",
    plan_pb2.Aggregate.FUNC_MAX: "max",
    plan_pb2.Aggregate.FUNC_AVG: "avg",
}
JOIN_KIND_NAMES = {
    plan_pb2.Join.KIND_INNER: "inner",
    plan_pb2.Join.KIND_LEFT_OUTER: "left_outer",
    plan_pb2.Join.KIND_RIGHT_OUTER: "right_outer",
    plan_pb2.Join.KIND_FULL_OUTER: "full_outer",
}
_Window = plan_pb2.WindowFunction
_Bound = plan_pb2.WindowFrameBound
WINDOW_FUNCTION_NAMES = {
    _Window.KIND_ROW_NUMBER: "row_number",
    _Window.KIND_RANK: "rank",
    _Window.KIND_DENSE_RANK: "dense_rank",
    _Window.KIND_LAG: "lag",
    _Window.KIND_LEAD: "lead",
    _Window.KIND_FIRST_VALUE: "first_value",
    _Window.KIND_LAST_VALUE: "last_value",
    _Window.KIND_COUNT: "count",
    _Window.KIND_SUM: "sum",
    _Window.KIND_MIN: "min",
    _Window.KIND_MAX: "max",
    _Window.KIND_AVG: "avg",
}
# Window aggregates and the Reduce aggregate each stands for.
WINDOW_AGGREGATES = {
    _Window.KIND_COUNT: plan_pb2.Aggregate.FUNC_COUNT,
    _Window.KIND_SUM: plan_pb2.Aggregate.FUNC_SUM,
    _Window.KIND_MIN: plan_pb2.Aggregate.FUNC_MIN,
    _Window.KIND_MAX: plan_pb2.Aggregate.FUNC_MAX,
    _Window.KIND_AVG: plan_pb2.Aggregate.FUNC_AVG,
}
_RANKING = (_Window.KIND_ROW_NUMBER, _Window.KIND_RANK, _Window.KIND_DENSE_RANK)
_OFFSET_KINDS = (_Window.KIND_LAG, _Window.KIND_LEAD)
_FRAMED_VALUES = (_Window.KIND_FIRST_VALUE, _Window.KIND_LAST_VALUE)
BOUND_NAMES = {
    _Bound.KIND_UNBOUNDED_PRECEDING: "unbounded preceding",
    _Bound.KIND_PRECEDING: "preceding",
    _Bound.KIND_CURRENT_ROW: "current row",
    _Bound.KIND_FOLLOWING: "following",
    _Bound.KIND_UNBOUNDED_FOLLOWING: "unbounded following",
}
# Longest base name kept before a "_2"-style suffix, so names stay within 255 characters.
_NAME_ROOM = 240


# Scalars ----------------------------------------------------------------------------------


def scalar_type(expr: plan_pb2.Scalar, columns: Sequence[ScalarType]) -> ScalarType:
    """The type of ``expr`` over a row whose columns have ``columns``' types. Raises
    ``InvalidArgument`` for an ill-typed expression."""
    kind = expr.WhichOneof("kind")
    if kind == "column":
        if expr.column >= len(columns):
            raise InvalidArgument(
                f"column #{expr.column} is out of range (the input has {len(columns)} columns)"
            )
        return columns[expr.column]
    if kind == "literal":
        return datum_type(expr.literal)
    if kind == "call":
        args = [scalar_type(arg, columns) for arg in expr.call.args]
        return result_type(expr.call.function, args)
    if kind == "case":
        case = expr.case
        for part in ("cond", "then", "otherwise"):
            if not case.HasField(part):  # type: ignore[arg-type]
                raise InvalidArgument(f"case has no {part}")
        cond = scalar_type(case.cond, columns)
        if cond.kind is not ColumnType.BOOL:
            raise InvalidArgument(f"case condition is {cond.describe()}, not bool")
        branches = [scalar_type(case.then, columns), scalar_type(case.otherwise, columns)]
        unified = unify(branches, "case branches")
        return unified.type.with_nullable(unified.type.nullable or unified.lossy)
    if kind == "cast":
        if not expr.cast.HasField("input"):
            raise InvalidArgument("cast has no input")
        target = Column.from_proto(_named(expr.cast.to))
        return cast_type(scalar_type(expr.cast.input, columns), ScalarType.of_column(target))
    raise InvalidArgument("scalar expression with no kind set")


def _named(column: common_pb2.Column) -> common_pb2.Column:
    """Cast targets need no name; give them one so Column's checks apply to the rest."""
    named = common_pb2.Column()
    named.CopyFrom(column)
    named.name = "cast"
    return named


def nonnull_columns(expr: plan_pb2.Scalar) -> set[int]:
    """Columns that are not NULL whenever ``expr`` is not NULL."""
    kind = expr.WhichOneof("kind")
    if kind == "column":
        return {expr.column}
    if kind == "cast":
        return nonnull_columns(expr.cast.input)
    if kind == "call":
        spec = FUNCTIONS.get(expr.call.function)
        if spec is not None and spec.strict:
            return set().union(*(nonnull_columns(arg) for arg in expr.call.args))
    return set()


def true_columns(expr: plan_pb2.Scalar) -> set[int]:
    """Columns that are not NULL whenever the predicate ``expr`` is TRUE."""
    found = _true_columns(expr)
    return set() if found is None else found


def _true_columns(expr: plan_pb2.Scalar) -> set[int] | None:
    """As :func:`true_columns`; None when ``expr`` is never TRUE (then every column is)."""
    kind = expr.WhichOneof("kind")
    if kind == "literal":
        value = expr.literal.WhichOneof("value")
        never = value is None or (value == "bool_value" and not expr.literal.bool_value)
        return None if never else set()
    if kind == "case":
        # TRUE through THEN (with the condition TRUE) or through ELSE: SQL's IN and NOT IN
        # over a subquery are such CASEs, TRUE only where the subquery matched.
        cond, then = _true_columns(expr.case.cond), _true_columns(expr.case.then)
        through_then = None if cond is None or then is None else cond | then
        return _either(through_then, _true_columns(expr.case.otherwise))
    if kind == "call":
        call = expr.call
        if call.function == "and":
            parts = [_true_columns(arg) for arg in call.args]
            if any(part is None for part in parts):
                return None
            return set().union(*(part for part in parts if part is not None))
        if call.function == "or" and call.args:
            found: set[int] | None = None
            for arg in call.args:
                found = _either(found, _true_columns(arg))
            return found
        if call.function in ("not", "is_not_null") and len(call.args) == 1:
            return nonnull_columns(call.args[0])
    return nonnull_columns(expr)


def _either(a: set[int] | None, b: set[int] | None) -> set[int] | None:
    """The columns not NULL when one of two predicates is TRUE (None: never TRUE)."""
    if a is None:
        return b
    if b is None:
        return a
    return a & b


# Relations --------------------------------------------------------------------------------


def _unique_names(names: Sequence[str]) -> list[str]:
    """``names`` with repeats (and the reserved time/diff) renamed ``name_2``, ``name_3``..."""
    taken: set[str] = set()
    result = []
    for name in names:
        candidate, suffix = name, 2
        while candidate in taken or candidate in RESERVED_COLUMNS:
            candidate = f"{name[:_NAME_ROOM]}_{suffix}"
            suffix += 1
        taken.add(candidate)
        result.append(candidate)
    return result


def _schema(names: Sequence[str], types: Sequence[ScalarType]) -> list[Column]:
    return [t.column(n) for n, t in zip(_unique_names(names), types, strict=True)]


def _types(columns: Sequence[Column]) -> list[ScalarType]:
    return [ScalarType.of_column(c) for c in columns]


def _expression_name(expr: plan_pb2.Scalar, names: Sequence[str]) -> str:
    kind = expr.WhichOneof("kind")
    if kind == "column" and expr.column < len(names):
        return names[expr.column]
    if kind == "call":
        return expr.call.function
    return kind or "expr"


@dataclass
class _Deriver:
    inputs: Mapping[str, RelationSchema]
    scope: dict[int, list[Column]] = field(default_factory=dict)

    def relation(self, rel: plan_pb2.Relation, path: str) -> list[Column]:
        kind = rel.WhichOneof("kind")
        if kind is None:
            raise InvalidArgument(f"{path}: relation with no kind set")
        here = f"{path}{kind}"
        try:
            columns = getattr(self, f"_{kind}")(getattr(rel, kind), here)
        except InvalidArgument as exc:
            if exc.message.startswith("at "):
                raise
            raise InvalidArgument(f"at {here}: {exc.message}") from None
        if not columns:
            raise InvalidArgument(f"at {here}: a relation needs at least one column")
        return list(columns)

    def _get(self, get: plan_pb2.Get, path: str) -> list[Column]:
        if not get.collection_id:
            raise InvalidArgument("get has no collection_id")
        known = self.inputs.get(get.collection_id)
        if not get.schema.columns:
            if known is None:
                raise InvalidArgument(f"no schema for collection {get.collection_id!r}")
            return list(known.columns)
        schema = RelationSchema.from_proto(get.schema)
        if known is not None and known != schema:
            raise InvalidArgument(
                f"the schema of {get.collection_id!r} in the plan differs from the "
                f"collection's schema"
            )
        return list(schema.columns)

    def _constant(self, constant: plan_pb2.Constant, path: str) -> list[Column]:
        schema = RelationSchema.from_proto(constant.schema)
        for index, row in enumerate(constant.rows):
            if len(row.values) != len(schema.columns):
                raise InvalidArgument(
                    f"row {index} has {len(row.values)} values for {len(schema.columns)} columns"
                )
            for column, datum in zip(schema.columns, row.values, strict=True):
                if datum.type != column.type.value:
                    raise InvalidArgument(
                        f"row {index}: a {ColumnType(datum.type).name if datum.type else '?'} "
                        f"value in {column.type.name} column {column.name!r}"
                    )
                check_value_fits(from_datum(datum), column)
        return list(schema.columns)

    def _filter(self, node: plan_pb2.Filter, path: str) -> list[Column]:
        columns = self.relation(node.input, f"{path} > ")
        types = _types(columns)
        known_nonnull: set[int] = set()
        for index, predicate in enumerate(node.predicates):
            predicate_type = scalar_type(predicate, types)
            if predicate_type.kind is not ColumnType.BOOL:
                raise InvalidArgument(f"predicate {index} is {predicate_type.describe()}, not bool")
            known_nonnull |= true_columns(predicate)
        return [
            ScalarType.of_column(c).with_nullable(False).column(c.name) if i in known_nonnull else c
            for i, c in enumerate(columns)
        ]

    def _map(self, node: plan_pb2.Map, path: str) -> list[Column]:
        columns = self.relation(node.input, f"{path} > ")
        names = [c.name for c in columns]
        types = _types(columns)
        for index, expr in enumerate(node.expressions):
            try:
                types.append(scalar_type(expr, types))
            except InvalidArgument as exc:
                raise InvalidArgument(f"expression {index}: {exc.message}") from None
            names.append(_expression_name(expr, names))
        return _schema(names, types)

    def _project(self, node: plan_pb2.Project, path: str) -> list[Column]:
        columns = self.relation(node.input, f"{path} > ")
        for position in node.columns:
            if position >= len(columns):
                raise InvalidArgument(
                    f"column #{position} is out of range (the input has {len(columns)} columns)"
                )
        picked = [columns[p] for p in node.columns]
        return _schema([c.name for c in picked], _types(picked))

    def _union(self, node: plan_pb2.Union, path: str) -> list[Column]:
        if not node.inputs:
            raise InvalidArgument("union has no inputs")
        branches = [self.relation(r, f"{path}[{i}] > ") for i, r in enumerate(node.inputs)]
        first = branches[0]
        for index, branch in enumerate(branches[1:], start=1):
            shape = [t.describe() for t in _types(branch)]
            if len(branch) != len(first) or not all(
                a.same_type(b) for a, b in zip(_types(first), _types(branch), strict=True)
            ):
                raise InvalidArgument(
                    f"input {index} has column types {shape}, input 0 has "
                    f"{[t.describe() for t in _types(first)]}"
                )
        nullable = [any(branch[i].nullable for branch in branches) for i in range(len(first))]
        return [
            ScalarType.of_column(c).with_nullable(n).column(c.name)
            for c, n in zip(first, nullable, strict=True)
        ]

    def _negate(self, node: plan_pb2.Negate, path: str) -> list[Column]:
        return self.relation(node.input, f"{path} > ")

    def _threshold(self, node: plan_pb2.Threshold, path: str) -> list[Column]:
        return self.relation(node.input, f"{path} > ")

    def _distinct(self, node: plan_pb2.Distinct, path: str) -> list[Column]:
        return self.relation(node.input, f"{path} > ")

    def _join(self, node: plan_pb2.Join, path: str) -> list[Column]:
        if node.kind not in JOIN_KIND_NAMES:
            raise InvalidArgument(f"unknown join kind {node.kind}")
        left = self.relation(node.left, f"{path}.left > ")
        right = self.relation(node.right, f"{path}.right > ")
        if len(node.left_keys) != len(node.right_keys):
            raise InvalidArgument(
                f"{len(node.left_keys)} left keys but {len(node.right_keys)} right keys"
            )
        left_nonnull: set[int] = set()
        right_nonnull: set[int] = set()
        for index, (lk, rk) in enumerate(zip(node.left_keys, node.right_keys, strict=True)):
            try:
                lt = scalar_type(lk, _types(left))
                rt = scalar_type(rk, _types(right))
            except InvalidArgument as exc:
                raise InvalidArgument(f"key {index}: {exc.message}") from None
            if not (lt.is_numeric and rt.is_numeric) and lt.kind is not rt.kind:
                raise InvalidArgument(f"key {index} compares {lt.describe()} with {rt.describe()}")
            left_nonnull |= nonnull_columns(lk)
            right_nonnull |= nonnull_columns(rk)
        # Matched rows have non-NULL keys; padded rows have NULL everywhere on the missing side.
        keep_left = node.kind in (plan_pb2.Join.KIND_LEFT_OUTER, plan_pb2.Join.KIND_FULL_OUTER)
        keep_right = node.kind in (plan_pb2.Join.KIND_RIGHT_OUTER, plan_pb2.Join.KIND_FULL_OUTER)
        left_types = _joined_side(_types(left), left_nonnull, keep_left, keep_right)
        right_types = _joined_side(_types(right), right_nonnull, keep_right, keep_left)
        return _schema([c.name for c in [*left, *right]], [*left_types, *right_types])

    def _reduce(self, node: plan_pb2.Reduce, path: str) -> list[Column]:
        columns = self.relation(node.input, f"{path} > ")
        types = _types(columns)
        names, out = [], []
        for position in node.group_key:
            if position >= len(columns):
                raise InvalidArgument(
                    f"group key column #{position} is out of range "
                    f"(the input has {len(columns)} columns)"
                )
            names.append(columns[position].name)
            out.append(types[position])
        for index, aggregate in enumerate(node.aggregates):
            try:
                out.append(aggregate_type(aggregate, types))
            except InvalidArgument as exc:
                raise InvalidArgument(f"aggregate {index}: {exc.message}") from None
            names.append(AGGREGATE_NAMES.get(aggregate.func, "aggregate"))
        return _schema(names, out)

    def _top_k(self, node: plan_pb2.TopK, path: str) -> list[Column]:
        columns = self.relation(node.input, f"{path} > ")
        for what, positions in (
            ("group key", list(node.group_key)),
            ("order", [key.column for key in node.order]),
        ):
            for position in positions:
                if position >= len(columns):
                    raise InvalidArgument(
                        f"{what} column #{position} is out of range "
                        f"(the input has {len(columns)} columns)"
                    )
        return columns

    def _window(self, node: plan_pb2.Window, path: str) -> list[Column]:
        columns = self.relation(node.input, f"{path} > ")
        for what, positions in (
            ("partition key", list(node.partition_key)),
            ("order", [key.column for key in node.order]),
        ):
            for position in positions:
                if position >= len(columns):
                    raise InvalidArgument(
                        f"{what} column #{position} is out of range "
                        f"(the input has {len(columns)} columns)"
                    )
        types = _types(columns)
        names, out = [c.name for c in columns], list(types)
        for index, function in enumerate(node.functions):
            try:
                out.append(window_function_type(function, types))
            except InvalidArgument as exc:
                raise InvalidArgument(f"function {index}: {exc.message}") from None
            names.append(WINDOW_FUNCTION_NAMES.get(function.kind, "window"))
        return _schema(names, out)

    def _let(self, node: plan_pb2.Let, path: str) -> list[Column]:
        value = self.relation(node.value, f"{path}(l{node.id}).value > ")
        outer = self.scope.get(node.id)
        self.scope[node.id] = value
        try:
            return self.relation(node.body, f"{path}(l{node.id}).body > ")
        finally:
            if outer is None:
                del self.scope[node.id]
            else:
                self.scope[node.id] = outer

    def _local_get(self, node: plan_pb2.LocalGet, path: str) -> list[Column]:
        if node.id not in self.scope:
            raise InvalidArgument(f"local_get l{node.id} is not inside a let binding it")
        return self.scope[node.id]


def _joined_side(
    types: list[ScalarType], key_columns: set[int], kept_unmatched: bool, padded: bool
) -> list[ScalarType]:
    """One join side's output types: all nullable where the side is padded; its key columns
    not NULL when every output row of it is a matched one."""
    result = []
    for index, t in enumerate(types):
        nonnull = index in key_columns and not kept_unmatched
        result.append(t.with_nullable(padded or (t.nullable and not nonnull)))
    return result


def aggregate_type(aggregate: plan_pb2.Aggregate, columns: Sequence[ScalarType]) -> ScalarType:
    """The result type of one aggregate over rows with ``columns``' types."""
    name = AGGREGATE_NAMES.get(aggregate.func)
    if name is None:
        raise InvalidArgument(f"unknown aggregate function {aggregate.func}")
    if not aggregate.HasField("expression"):
        if aggregate.func != plan_pb2.Aggregate.FUNC_COUNT:
            raise InvalidArgument(f"{name} needs an argument")
        if aggregate.distinct:
            raise InvalidArgument("count(*) cannot be distinct")
        return ScalarType(ColumnType.INT64, nullable=False)
    arg = scalar_type(aggregate.expression, columns)
    if aggregate.func == plan_pb2.Aggregate.FUNC_COUNT:
        return ScalarType(ColumnType.INT64, nullable=False)
    if aggregate.func in (plan_pb2.Aggregate.FUNC_MIN, plan_pb2.Aggregate.FUNC_MAX):
        return arg
    if not arg.is_numeric:
        raise InvalidArgument(f"{name} takes a numeric argument, not {arg.describe()}")
    if arg.kind is ColumnType.FLOAT64:
        return arg
    if aggregate.func == plan_pb2.Aggregate.FUNC_AVG:
        if arg.kind is ColumnType.INT64:
            return ScalarType(ColumnType.FLOAT64, arg.nullable)
        return ScalarType.decimal(38, min(38, arg.scale + 6))
    # A decimal sum can pass 38 digits, which makes it NULL.
    return ScalarType.decimal(38, arg.scale)


def window_aggregate(function: plan_pb2.WindowFunction) -> plan_pb2.Aggregate:
    """The Reduce aggregate a window aggregate function computes over its frame."""
    aggregate = plan_pb2.Aggregate(func=WINDOW_AGGREGATES[function.kind])
    if function.HasField("argument"):
        aggregate.expression.CopyFrom(function.argument)
    return aggregate


def check_frame(frame: plan_pb2.WindowFrame) -> None:
    """Rejects the frames plan.proto's Window leaves invalid or unsupported."""
    start, end = frame.start.kind, frame.end.kind
    for bound in (frame.start, frame.end):
        if bound.kind not in BOUND_NAMES:
            raise InvalidArgument(f"unknown frame bound kind {bound.kind}")
        if bound.offset and bound.kind not in (_Bound.KIND_PRECEDING, _Bound.KIND_FOLLOWING):
            raise InvalidArgument(f"a frame bound {BOUND_NAMES[bound.kind]} has no offset")
    if frame.mode not in (plan_pb2.WindowFrame.MODE_RANGE, plan_pb2.WindowFrame.MODE_ROWS):
        raise InvalidArgument(f"unknown frame mode {frame.mode}")
    if frame.mode == plan_pb2.WindowFrame.MODE_RANGE and {start, end} & {
        _Bound.KIND_PRECEDING,
        _Bound.KIND_FOLLOWING,
    }:
        raise InvalidArgument("RANGE frames with an offset are not supported")
    if start == _Bound.KIND_UNBOUNDED_FOLLOWING:
        raise InvalidArgument("a frame cannot start at UNBOUNDED FOLLOWING")
    if end == _Bound.KIND_UNBOUNDED_PRECEDING:
        raise InvalidArgument("a frame cannot end at UNBOUNDED PRECEDING")
    if start == _Bound.KIND_CURRENT_ROW and end == _Bound.KIND_PRECEDING:
        raise InvalidArgument("a frame starting at the current row cannot end before it")
    if start == _Bound.KIND_FOLLOWING and end in (_Bound.KIND_PRECEDING, _Bound.KIND_CURRENT_ROW):
        raise InvalidArgument("a frame starting after the current row cannot end before it")


def window_function_type(
    function: plan_pb2.WindowFunction, columns: Sequence[ScalarType]
) -> ScalarType:
    """The result type of one window function over rows with ``columns``' types."""
    kind = function.kind
    name = WINDOW_FUNCTION_NAMES.get(kind)
    if name is None:
        raise InvalidArgument(f"unknown window function kind {kind}")
    if kind not in _OFFSET_KINDS and (function.HasField("offset") or function.HasField("default")):
        raise InvalidArgument(f"{name} takes no offset or default")
    if function.HasField("frame"):
        check_frame(function.frame)
    if kind in _RANKING:
        if function.HasField("argument"):
            raise InvalidArgument(f"{name} takes no argument")
        return ScalarType(ColumnType.INT64, nullable=False)
    if kind in WINDOW_AGGREGATES:
        result = aggregate_type(window_aggregate(function), columns)
        if kind == _Window.KIND_COUNT:
            return result
        return result.with_nullable(True)
    if not function.HasField("argument"):
        raise InvalidArgument(f"{name} needs an argument")
    argument = scalar_type(function.argument, columns)
    if function.HasField("default"):
        default = scalar_type(function.default, columns)
        if not default.same_type(argument):
            raise InvalidArgument(
                f"{name}'s default is {default.describe()}, its argument {argument.describe()}"
            )
    return argument.with_nullable(True)


def derive_schema(
    relation: plan_pb2.Relation, inputs: Mapping[str, RelationSchema] | None = None
) -> RelationSchema:
    """The output schema of ``relation``, validating every node. ``inputs`` gives collection
    schemas by id, for Get nodes without their own (and checked against those with one).
    Output names come from inputs and are made unique; derived columns are named after their
    function. Raises ``InvalidArgument`` naming the failing node."""
    return RelationSchema(_Deriver(inputs or {}).relation(relation, ""))


def check_plan(
    plan: plan_pb2.Plan, inputs: Mapping[str, RelationSchema] | None = None
) -> RelationSchema:
    """Validates ``plan`` as compute does at install time and returns its output schema: the
    declared ``output_schema`` when set (after checking it matches the derived one), else the
    derived schema."""
    if not plan.HasField("root"):
        raise InvalidArgument("plan has no root")
    derived = derive_schema(plan.root, inputs)
    if not plan.output_schema.columns:
        return derived
    declared = RelationSchema.from_proto(plan.output_schema)
    if len(declared.columns) != len(derived.columns):
        raise InvalidArgument(
            f"output_schema has {len(declared.columns)} columns; the plan produces "
            f"{len(derived.columns)}"
        )
    for want, got in zip(declared.columns, derived.columns, strict=True):
        want_type, got_type = ScalarType.of_column(want), ScalarType.of_column(got)
        if not want_type.same_type(got_type):
            raise InvalidArgument(
                f"output column {want.name!r} is declared {want_type.describe()} but the plan "
                f"produces {got_type.describe()}"
            )
        if got.nullable and not want.nullable:
            raise InvalidArgument(
                f"output column {want.name!r} is declared NOT NULL but the plan may produce NULL"
            )
    return declared
