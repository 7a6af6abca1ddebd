"""A small interpreter for the catalog queries clients send (psql's ``\\d`` family, drivers'
type lookups, SQLAlchemy's reflection): SELECT with joins, WHERE, correlated subqueries,
ORDER BY, LIMIT and UNION over ``catalog_tables``, evaluated row by row on sqlglot's syntax
tree. Catalog relations are small, so nested loops are fine.

What it does not know evaluates to NULL (an unknown function, a column of a relation nobody
has) rather than failing: clients ask for many details Tidemark has no notion of (policies,
publications, collations) and expect NULL or no rows.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import sqlglot
from sqlglot import exp

from services.adapter.pgwire.catalog_tables import (
    OWNER,
    REGTYPE_NAMES,
    CatalogTables,
    Row,
)

Env = list[tuple[str, Row | None]]
_NORMALIZE = [
    (re.compile(r"OPERATOR\s*\(\s*pg_catalog\.([~!=<>]+)\s*\)", re.I), r"\1"),
    (re.compile(r"COLLATE\s+pg_catalog\.\w+", re.I), ""),
    (re.compile(r"COLLATE\s+\"[^\"]+\"", re.I), ""),
]


class Unsupported(Exception):
    pass


def normalize(sql: str) -> str:
    for pattern, replacement in _NORMALIZE:
        sql = pattern.sub(replacement, sql)
    return sql


class Interpreter:
    def __init__(self, tables: CatalogTables, context: dict[str, Any]) -> None:
        self.tables = tables
        self.context = context

    def run(self, sql: str) -> tuple[list[str], list[list[Any]]]:
        tree = sqlglot.parse_one(normalize(sql), read="postgres")
        return self.query(tree, [])

    # -- queries --------------------------------------------------------------------------

    def query(self, node: exp.Expr, outer: Env) -> tuple[list[str], list[list[Any]]]:
        if isinstance(node, exp.Union):
            union_names, left = self.query(node.left, outer)
            _, right = self.query(node.right, outer)
            combined = left + right
            if node.args.get("distinct"):
                combined = _distinct(combined)
            return union_names, self._order_limit(node, union_names, [(r, []) for r in combined])
        if isinstance(node, exp.Subquery):
            return self.query(node.this, outer)
        if not isinstance(node, exp.Select):
            raise Unsupported(type(node).__name__)
        envs = self._from(node, outer)
        where = node.args.get("where")
        if where is not None:
            envs = [e for e in envs if _truthy(self.eval(where.this, e + outer))]
        names: list[str] = []
        expressions: list[exp.Expr] = []
        for index, selected in enumerate(node.expressions):
            if isinstance(selected, exp.Star):
                for alias, source_row in envs[0] if envs else []:
                    for column_name in source_row or {}:
                        if not column_name.startswith("_"):
                            names.append(column_name)
                            expressions.append(exp.column(column_name, table=alias))
                continue
            names.append(selected.alias_or_name or f"?column?{index}")
            expressions.append(selected)
        group = node.args.get("group")
        aggregate = any(_has_aggregate(e) for e in expressions)
        results: list[tuple[list[Any], Env]] = []
        if group is not None or aggregate:
            groups: dict[tuple[Any, ...], list[Env]] = {}
            for env in envs:
                key = tuple(
                    _hashable(self.eval(g, env + outer))
                    for g in (group.expressions if group else [])
                )
                groups.setdefault(key, []).append(env)
            if not groups and group is None:
                groups[()] = []
            for members in groups.values():
                context = members[0] if members else []
                values = [self._aggregate(e, members, outer, context) for e in expressions]
                results.append((values, context))
        else:
            for env in envs:
                results.append(([self.eval(e, env + outer) for e in expressions], env))
        if node.args.get("distinct"):
            seen: set[tuple[Any, ...]] = set()
            unique = []
            for values, env in results:
                marker = tuple(_hashable(v) for v in values)
                if marker not in seen:
                    seen.add(marker)
                    unique.append((values, env))
            results = unique
        return names, self._order_limit(node, names, results, outer)

    def _order_limit(
        self,
        node: exp.Expr,
        names: list[str],
        results: list[tuple[list[Any], Env]],
        outer: Env | None = None,
    ) -> list[list[Any]]:
        order = node.args.get("order")
        if order is not None:
            for ordered in reversed(order.expressions):
                descending = bool(ordered.args.get("desc"))

                def key(item: tuple[list[Any], Env], ordered: exp.Ordered = ordered) -> Any:
                    value = self._order_value(ordered.this, names, item, outer or [])
                    return (value is None, _sort_key(value))

                results.sort(key=key, reverse=descending)
        rows = [row for row, _ in results]
        limit = node.args.get("limit")
        if limit is not None:
            count = self.eval(limit.expression, [])
            if count is not None:
                rows = rows[: int(count)]
        return rows

    def _order_value(
        self, node: exp.Expr, names: list[str], item: tuple[list[Any], Env], outer: Env
    ) -> Any:
        row, env = item
        if isinstance(node, exp.Literal) and not node.is_string:
            return row[int(node.this) - 1]
        if isinstance(node, exp.Column) and not node.table and node.name in names:
            return row[names.index(node.name)]
        return self.eval(node, env + outer)

    def _from(self, node: exp.Select, outer: Env) -> list[Env]:
        source = node.args.get("from_") or node.args.get("from")
        if source is None:
            return [[]]
        envs = [[(alias, row)] for alias, row in self._relation(source.this, outer)]
        for join in node.args.get("joins") or []:
            rows = self._relation(join.this, outer)
            condition = join.args.get("on")
            side = (join.args.get("side") or "").upper()
            joined: list[Env] = []
            for env in envs:
                matched = False
                for alias, row in rows:
                    candidate = [*env, (alias, row)]
                    if condition is None or _truthy(self.eval(condition, candidate + outer)):
                        joined.append(candidate)
                        matched = True
                if not matched and side == "LEFT":
                    alias = rows[0][0] if rows else _alias(join.this)
                    joined.append([*env, (alias, None)])
            envs = joined
        return envs

    def _relation(self, node: exp.Expr, outer: Env) -> list[tuple[str, Row | None]]:
        if isinstance(node, exp.Table):
            # A relation Tidemark has no rows for (or a set-returning function) is empty.
            rows = self.tables.rows(node.name) or []
            alias = _alias(node)
            return [(alias, row) for row in rows]
        if isinstance(node, exp.Subquery):
            names, results = self.query(node.this, outer)
            alias = node.alias_or_name
            return [(alias, dict(zip(names, result, strict=True))) for result in results]
        raise Unsupported(type(node).__name__)

    def _aggregate(self, node: exp.Expr, members: list[Env], outer: Env, context: Env) -> Any:
        if isinstance(node, exp.Alias):
            return self._aggregate(node.this, members, outer, context)
        if isinstance(node, exp.Count):
            if isinstance(node.this, exp.Star):
                return len(members)
            return sum(1 for m in members if self.eval(node.this, m + outer) is not None)
        if isinstance(node, exp.ArrayAgg):
            return [self.eval(node.this, m + outer) for m in members]
        if isinstance(node, exp.Max | exp.Min):
            values = [v for m in members if (v := self.eval(node.this, m + outer)) is not None]
            if not values:
                return None
            return max(values) if isinstance(node, exp.Max) else min(values)
        return self.eval(node, context + outer)

    # -- expressions ----------------------------------------------------------------------

    def eval(self, node: exp.Expr, env: Env) -> Any:
        try:
            return self._eval(node, env)
        except Unsupported:
            raise
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, re.error):
            return None

    def _eval(self, node: exp.Expr, env: Env) -> Any:
        e = self.eval
        if isinstance(node, exp.Alias | exp.Paren):
            return e(node.this, env)
        if isinstance(node, exp.Literal):
            if node.is_string:
                return node.this
            text = node.this
            return float(text) if any(c in text for c in ".eE") else int(text)
        if isinstance(node, exp.Boolean):
            return bool(node.this)
        if isinstance(node, exp.Null):
            return None
        if isinstance(node, exp.Column):
            return self._column(node, env)
        if isinstance(node, exp.Dot):
            return e(node.expression, env)
        if isinstance(node, exp.And):
            left = e(node.this, env)
            if left is False:
                return False
            right = e(node.expression, env)
            if right is False:
                return False
            return None if left is None or right is None else True
        if isinstance(node, exp.Or):
            left, right = e(node.this, env), e(node.expression, env)
            if left is True or right is True:
                return True
            return None if left is None or right is None else False
        if isinstance(node, exp.Not):
            value = e(node.this, env)
            return None if value is None else not _truthy(value)
        if isinstance(node, exp.EQ | exp.NEQ | exp.GT | exp.GTE | exp.LT | exp.LTE):
            right_node = node.expression
            if isinstance(right_node, exp.Any):
                values = _as_list(e(right_node.this, env))
                left = e(node.this, env)
                return any(_compare(node, left, v) for v in values)
            return _compare(node, e(node.this, env), e(right_node, env))
        if isinstance(node, exp.Is):
            value = e(node.this, env)
            return (
                value is None
                if isinstance(node.expression, exp.Null)
                else value is e(node.expression, env)
            )
        if isinstance(node, exp.In):
            left = e(node.this, env)
            query = node.args.get("query")
            if query is not None:
                _, rows = self.query(query.this if isinstance(query, exp.Subquery) else query, env)
                values = [r[0] for r in rows]
            else:
                values = [e(v, env) for v in node.expressions]
            found = any(_equal(left, v) for v in values)
            return not found if node.args.get("is_not") else found
        if isinstance(node, exp.RegexpLike):
            value, pattern = e(node.this, env), e(node.expression, env)
            if value is None or pattern is None:
                return None
            return re.search(str(pattern), str(value)) is not None
        if isinstance(node, exp.Like | exp.ILike):
            value, pattern = e(node.this, env), e(node.expression, env)
            if value is None or pattern is None:
                return None
            regex = "".join(
                ".*" if c == "%" else "." if c == "_" else re.escape(c) for c in str(pattern)
            )
            flags = re.I if isinstance(node, exp.ILike) else 0
            return re.fullmatch(regex, str(value), flags) is not None
        if isinstance(node, exp.Case):
            subject = node.this
            base = e(subject, env) if subject is not None else None
            for branch in node.args.get("ifs") or []:
                test = e(branch.this, env)
                if (subject is not None and _equal(base, test)) or (
                    subject is None and _truthy(test)
                ):
                    return e(branch.args["true"], env)
            default = node.args.get("default")
            return e(default, env) if default is not None else None
        if isinstance(node, exp.If):
            return (
                e(node.args["true"], env)
                if _truthy(e(node.this, env))
                else (e(node.args["false"], env) if node.args.get("false") else None)
            )
        if isinstance(node, exp.Cast):
            return self._cast(e(node.this, env), node.to.sql(dialect="postgres").lower())
        if isinstance(node, exp.Coalesce):
            for candidate in [node.this, *node.expressions]:
                value = e(candidate, env)
                if value is not None:
                    return value
            return None
        if isinstance(node, exp.Subquery):
            _, rows = self.query(node.this, env)
            return rows[0][0] if rows else None
        if isinstance(node, exp.Exists):
            _, rows = self.query(node.this, env)
            return bool(rows)
        if isinstance(node, exp.Array):
            items = node.expressions
            if len(items) == 1 and isinstance(items[0], exp.Select):
                _, rows = self.query(items[0], env)
                return [r[0] for r in rows]
            return [e(v, env) for v in items]
        if isinstance(node, exp.DPipe):
            left, right = e(node.this, env), e(node.expression, env)
            if isinstance(left, list) or isinstance(right, list):
                return _as_list(left) + _as_list(right)
            return None if left is None or right is None else f"{left}{right}"
        if isinstance(node, exp.CurrentUser):  # a Func to sqlglot
            return self.context.get("user") or OWNER
        if isinstance(node, exp.Func):
            return self._function(node, env)
        if isinstance(node, exp.ByteString | exp.National | exp.RawString):
            return node.this
        if isinstance(node, exp.Neg):
            value = e(node.this, env)
            return None if value is None else -value
        if isinstance(node, exp.Star):
            return None
        return None

    def _column(self, node: exp.Column, env: Env) -> Any:
        name = node.name
        table = node.table
        if not table and name.lower() in ("current_user", "session_user", "user"):
            return self.context.get("user") or OWNER
        if not table and name.lower() == "current_schema":
            return self.context.get("current_schema")
        for alias, row in reversed(env):
            if table and alias != table:
                continue
            if row is None:
                if table:
                    return None
                continue
            if name in row:
                return row[name]
            if table:
                return None
        return None

    def _cast(self, value: Any, target: str) -> Any:
        if value is None:
            return None
        if target in ("regclass", "pg_catalog.regclass"):
            if isinstance(value, int):
                row = self.tables.class_by_oid.get(value)
                return row["relname"] if row else str(value)
            return self.tables.class_by_name.get(str(value).replace('"', ""))
        if target in ("regtype", "pg_catalog.regtype"):
            if isinstance(value, int):
                return self._type_name(value)
            return self._type_oid(str(value))
        if target in ("oid", "int", "integer", "bigint", "smallint", "int2", "int4", "int8"):
            if isinstance(value, str) and not value.strip().lstrip("-").isdigit():
                return self.tables.class_by_name.get(value.replace('"', ""))
            return int(value)
        if target in ("text", "varchar", "pg_catalog.text", "name", "character varying"):
            if isinstance(value, bool):
                return "true" if value else "false"
            return str(value)
        return value

    def _type_name(self, oid: int) -> str | None:
        if oid in REGTYPE_NAMES:
            return REGTYPE_NAMES[oid]
        for row in self.tables.tables["pg_type"]:
            if row["oid"] == oid:
                return str(row["typname"])
        return None

    def _type_oid(self, name: str) -> int | None:
        wanted = name.strip().lower().removeprefix("pg_catalog.")
        for oid, known in REGTYPE_NAMES.items():
            if known == wanted:
                return oid
        for row in self.tables.tables["pg_type"]:
            if row["typname"] == wanted:
                return int(row["oid"])
        return None

    def _function(self, node: exp.Func, env: Env) -> Any:
        name = (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()
        args = [self.eval(a, env) for a in _arguments(node)]
        handler = self.functions().get(name)
        if handler is None:
            return None
        return handler(*args)

    def functions(self) -> dict[str, Callable[..., Any]]:
        tables = self.tables

        def format_type(oid: Any, modifier: Any = None) -> str | None:
            if oid is None:
                return None
            for row in tables.tables["pg_attribute"]:
                if row["atttypid"] == oid and row["atttypmod"] == modifier:
                    return str(row["_format"])
            name = self._type_name(int(oid))
            if name == "timestamp":
                return "timestamp without time zone"
            return name

        def index_definition(oid: Any, column: Any = 0, *_: Any) -> str | None:
            if column:
                keys = tables.index_keys.get(oid, [])
                return keys[column - 1] if 0 < column <= len(keys) else None
            return tables.index_definitions.get(oid)

        return {
            "format_type": format_type,
            "pg_get_userbyid": lambda oid, *_: tables.role_names.get(oid, OWNER),
            "pg_table_is_visible": lambda oid: (
                oid in tables.class_by_oid
                and tables.namespace_names.get(tables.class_by_oid[oid]["relnamespace"])
                in self.context.get("search_path", ["public"])
            ),
            "pg_type_is_visible": lambda *_: True,
            "pg_encoding_to_char": lambda *_: "UTF8",
            "array_to_string": lambda values, sep, *_: (
                None
                if values is None
                else sep.join(str(v) for v in _as_list(values) if v is not None)
            ),
            "pg_get_indexdef": index_definition,
            "pg_get_expr": lambda *_: None,
            "pg_get_constraintdef": lambda *_: None,
            "obj_description": lambda *_: None,
            "col_description": lambda *_: None,
            "shobj_description": lambda *_: None,
            "pg_relation_size": lambda *_: 0,
            "pg_total_relation_size": lambda *_: 0,
            "pg_table_size": lambda *_: 0,
            "pg_size_pretty": lambda *_: "0 bytes",
            "current_schema": lambda *_: self.context.get("current_schema"),
            "current_schemas": lambda *_: self.context.get("search_path", ["public"]),
            "current_database": lambda *_: tables.database,
            "version": lambda *_: self.context.get("version"),
            "to_regtype": lambda name: None if name is None else self._type_oid(str(name)),
            "to_regclass": lambda name: (
                None if name is None else tables.class_by_name.get(str(name).replace('"', ""))
            ),
            "has_table_privilege": lambda *_: True,
            "has_schema_privilege": lambda *_: True,
            "has_database_privilege": lambda *_: True,
            "pg_has_role": lambda *_: True,
            "pg_backend_pid": lambda *_: self.context.get("pid"),
            "lower": lambda v: None if v is None else str(v).lower(),
            "upper": lambda v: None if v is None else str(v).upper(),
            "length": lambda v: None if v is None else len(v),
            "concat": lambda *vs: "".join(str(v) for v in vs if v is not None),
            "quote_ident": lambda v: v,
        }


def _has_aggregate(node: exp.Expr) -> bool:
    """An aggregate of this query level (not one inside a subquery)."""
    if isinstance(node, exp.AggFunc):
        return True
    if isinstance(node, exp.Select | exp.Subquery):
        return False
    return any(_has_aggregate(child) for child in node.iter_expressions())


def _arguments(node: exp.Func) -> list[exp.Expr]:
    if isinstance(node, exp.Anonymous):
        return list(node.expressions)
    out: list[exp.Expr] = []
    for key in node.arg_types:
        value = node.args.get(key)
        if isinstance(value, list):
            out.extend(v for v in value if isinstance(v, exp.Expr))
        elif isinstance(value, exp.Expr):
            out.append(value)
    return out


def _alias(node: exp.Expr) -> str:
    return node.alias_or_name


def _truthy(value: Any) -> bool:
    return value is True or (value not in (None, False, 0, "") and not isinstance(value, bool))


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, list):
        return value
    if isinstance(value, str) and value.startswith("{") and value.endswith("}"):
        return [v.strip('"') for v in value[1:-1].split(",") if v]
    return [value]


def _coerce(left: Any, right: Any) -> tuple[Any, Any]:
    if isinstance(left, int) and isinstance(right, str) and right.lstrip("-").isdigit():
        return left, int(right)
    if isinstance(right, int) and isinstance(left, str) and left.lstrip("-").isdigit():
        return int(left), right
    if isinstance(left, bool) and isinstance(right, str):
        return left, right.lower() in ("t", "true")
    if isinstance(right, bool) and isinstance(left, str):
        return left.lower() in ("t", "true"), right
    return left, right


def _equal(left: Any, right: Any) -> bool:
    if left is None or right is None:
        return False
    left, right = _coerce(left, right)
    return bool(left == right)


def _compare(node: exp.Expr, left: Any, right: Any) -> bool | None:
    if left is None or right is None:
        return None
    left, right = _coerce(left, right)
    if isinstance(node, exp.EQ):
        return bool(left == right)
    if isinstance(node, exp.NEQ):
        return bool(left != right)
    try:
        if isinstance(node, exp.GT):
            return bool(left > right)
        if isinstance(node, exp.GTE):
            return bool(left >= right)
        if isinstance(node, exp.LT):
            return bool(left < right)
        return bool(left <= right)
    except TypeError:
        return None


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _sort_key(value: Any) -> Any:
    if isinstance(value, bool):
        return (0, int(value))
    if isinstance(value, int | float):
        return (0, value)
    return (1, str(value))


def _distinct(rows: list[list[Any]]) -> list[list[Any]]:
    seen: set[tuple[Any, ...]] = set()
    out = []
    for row in rows:
        key = tuple(_hashable(v) for v in row)
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out
