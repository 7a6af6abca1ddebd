"""``parse(sql)``: a request's SQL text to typed statements.

Statement heads Tidemark adds or reads differently from PostgreSQL (CREATE ... IN CLUSTER,
CREATE CLUSTER, CREATE SOURCE ... FROM CDCV2 | LOAD GENERATOR, SUBSCRIBE, AS OF, SHOW, SET) are
read here token by token; queries, expressions and standard DML are handed to sqlglot's
PostgreSQL parser.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlglot import exp
from sqlglot.tokens import Token, TokenType  # type: ignore[attr-defined]

from services.adapter.sql import connections, grants, roles
from services.adapter.sql import statements as st
from services.adapter.sql.errors import SYNTAX_ERROR, SqlError, not_supported
from services.adapter.sql.literal_insert import scan_literal_inserts
from services.adapter.sql.names import QualifiedName, identifier, position, table_name
from services.adapter.sql.tokens import (
    Cursor,
    is_word,
    parse_expressions,
    split_statements,
    split_top_level,
    tokenize,
)
from services.adapter.sql.types import parse_type_name

_QUERY_STARTS = ("SELECT", "WITH", "VALUES", "TABLE")
# Words that end a column's type in a column definition.
_CONSTRAINT_WORDS = (
    "NOT",
    "NULL",
    "DEFAULT",
    "PRIMARY",
    "PRIMARY KEY",
    "UNIQUE",
    "CHECK",
    "REFERENCES",
    "CONSTRAINT",
    "COLLATE",
    "GENERATED",
)
_SHOW_KINDS: dict[str, st.ShowKind] = {
    "TABLES": "tables",
    "VIEWS": "views",
    "INDEXES": "indexes",
    "INDICES": "indexes",
    "CLUSTERS": "clusters",
    "SOURCES": "sources",
    "SECRETS": "secrets",
    "CONNECTIONS": "connections",
    "SUBSOURCES": "subsources",
    "DATABASES": "databases",
    "SCHEMAS": "schemas",
}


def parse(sql: str) -> list[st.AnyStatement]:
    """The statements of ``sql`` in order. Raises SqlError (42601 for syntax, 0A000 for
    syntax Tidemark does not support) for the first statement that is not valid."""
    scanned = scan_literal_inserts(sql)
    if scanned is not None:
        return [
            st.Insert(
                text=s.text,
                position=s.position,
                table=s.table,
                columns=s.columns,
                source=None,
                literal_rows=s.values,
            )
            for s in scanned
        ]
    return parse_tokens(sql)


def parse_tokens(sql: str) -> list[st.AnyStatement]:
    """:func:`parse` without the shortcut for literal INSERTs: every statement as a tree."""
    tokens = tokenize(sql)
    return [_statement(sql, part) for part in split_statements(tokens)]


def _statement(sql: str, tokens: list[Token]) -> st.AnyStatement:
    cursor = Cursor(sql, tokens)
    text = sql[tokens[0].start : tokens[-1].end + 1]
    where = tokens[0].start + 1
    first = tokens[0]
    if first.token_type is TokenType.L_PAREN or is_word(first, *_QUERY_STARTS):
        query, as_of = _query_with_as_of(sql, tokens)
        return st.Select(text=text, position=where, query=query, as_of=as_of)
    if not is_word(first):
        raise cursor.error()
    handler = _HANDLERS.get(first.text.upper())
    if handler is None:
        raise cursor.error()
    return handler(cursor, text, where)


# Queries ----------------------------------------------------------------------------------


def query_from(sql: str, tokens: Sequence[Token]) -> st.Query:
    """A query from its tokens; 42601 when they are not one."""
    tree = parse_expressions(sql, tokens)
    if isinstance(tree, exp.Subquery):
        inner = tree
        while isinstance(inner, exp.Subquery) and not inner.args.get("alias"):
            inner = inner.this
        tree = inner if isinstance(inner, exp.Query) else tree
    if not isinstance(tree, exp.Query | exp.Values | exp.Subquery):
        raise SqlError(
            SYNTAX_ERROR,
            f'syntax error at or near "{tokens[0].text}": expected a query',
            tokens[0].start + 1,
        )
    text = sql[tokens[0].start : tokens[-1].end + 1]
    return st.Query(ast=tree, text=text, position=tokens[0].start + 1)


def _query_with_as_of(sql: str, tokens: list[Token]) -> tuple[st.Query, int | None]:
    """A query optionally followed by ``AS OF <integer>`` at its top level."""
    depth = 0
    for index, token in enumerate(tokens):
        if token.token_type is TokenType.L_PAREN:
            depth += 1
        elif token.token_type is TokenType.R_PAREN:
            depth -= 1
        elif depth == 0 and is_word(token, "AS") and is_word(_at(tokens, index + 1), "OF"):
            if index + 2 >= len(tokens):
                raise SqlError(SYNTAX_ERROR, "AS OF needs a timestamp", token.start + 1)
            return query_from(sql, tokens[:index]), _as_of(tokens[index + 2 :], sql)
    return query_from(sql, tokens), None


def _at(tokens: Sequence[Token], index: int) -> Token | None:
    return tokens[index] if index < len(tokens) else None


def _as_of(tokens: Sequence[Token], sql: str) -> int:
    value = tokens[0]
    if len(tokens) != 1 or value.token_type is not TokenType.NUMBER or not value.text.isdigit():
        raise SqlError(
            SYNTAX_ERROR,
            "AS OF takes a timestamp: a non-negative integer (milliseconds)",
            value.start + 1,
        )
    number = int(value.text)
    if number >= 2**64:
        raise SqlError("22023", f"AS OF {number} is beyond the u64 timeline", value.start + 1)
    return number


# CREATE -----------------------------------------------------------------------------------


def _create(cursor: Cursor, text: str, where: int) -> st.AnyStatement:
    cursor.expect("CREATE")
    if cursor.at_words("OR", "REPLACE"):
        raise not_supported("CREATE OR REPLACE", cursor.position())
    if cursor.at_words("TEMP") or cursor.at_words("TEMPORARY") or cursor.at_words("UNLOGGED"):
        raise not_supported(f"CREATE {cursor.peek().text.upper()}", cursor.position())  # type: ignore[union-attr]
    if cursor.accept("TABLE"):
        exists = _if_not_exists(cursor)
        name = cursor.qualified_name("a table name")
        if cursor.at_words("AS"):
            raise not_supported("CREATE TABLE ... AS", cursor.position())
        columns = _column_defs(cursor)
        cursor.expect_end()
        return st.CreateTable(
            text=text, position=where, name=name, columns=columns, if_not_exists=exists
        )
    if cursor.accept("SOURCE"):
        return _create_source(cursor, text, where)
    if cursor.accept("SECRET"):
        return connections.create_secret(cursor, text, where, _if_not_exists(cursor))
    if cursor.at_words("ROLE") or cursor.at_words("USER"):
        return roles.create_role(cursor, where, user=cursor.next().text.upper() == "USER")
    if cursor.accept("CONNECTION"):
        return connections.create_connection(cursor, text, where, _if_not_exists(cursor))
    materialized = cursor.accept("MATERIALIZED")
    if cursor.accept("VIEW"):
        return _create_view(cursor, text, where, materialized)
    if materialized:
        raise cursor.error()
    if cursor.accept("INDEX"):
        return _create_index(cursor, text, where)
    if cursor.accept("CLUSTER"):
        return _create_cluster(cursor, text, where)
    if cursor.accept("DATABASE"):
        exists = _if_not_exists(cursor)
        database = cursor.identifier("a database name")
        cursor.expect_end()
        return st.CreateDatabase(text=text, position=where, name=database, if_not_exists=exists)
    if cursor.accept("SCHEMA"):
        exists = _if_not_exists(cursor)
        schema = cursor.qualified_name("a schema name")
        if len(schema) > 2:
            raise SqlError(SYNTAX_ERROR, f"improper schema name: {'.'.join(schema)}", where)
        cursor.expect_end()
        return st.CreateSchema(text=text, position=where, name=schema, if_not_exists=exists)
    token = cursor.peek()
    if token is not None and is_word(token):
        raise not_supported(f"CREATE {token.text.upper()}", token.start + 1)
    raise cursor.error()


def _if_not_exists(cursor: Cursor) -> bool:
    return cursor.accept("IF", "NOT", "EXISTS")


def _column_defs(cursor: Cursor) -> tuple[st.ColumnDef, ...]:
    opening = cursor.position()
    inside = cursor.parenthesized()
    if not inside:
        raise SqlError(SYNTAX_ERROR, "a relation needs at least one column", opening)
    return tuple(_column_def(cursor.sql, part) for part in split_top_level(inside))


def _column_def(sql: str, tokens: list[Token]) -> st.ColumnDef:
    cursor = Cursor(sql, tokens)
    if cursor.at_end:
        raise SqlError(SYNTAX_ERROR, "empty column definition", 0)
    if is_word(
        cursor.peek(),
        "PRIMARY",
        "PRIMARY KEY",
        "UNIQUE",
        "CHECK",
        "CONSTRAINT",
        "FOREIGN",
        "FOREIGN KEY",
        "EXCLUDE",
    ):
        raise not_supported("table constraints", cursor.position())
    start = cursor.position()
    name = cursor.identifier("a column name")
    type_tokens: list[Token] = []
    depth = 0
    while not cursor.at_end:
        token = cursor.peek()
        assert token is not None
        if depth == 0 and is_word(token, *_CONSTRAINT_WORDS):
            break
        depth += token.token_type is TokenType.L_PAREN
        depth -= token.token_type is TokenType.R_PAREN
        type_tokens.append(cursor.next())
    if not type_tokens:
        raise cursor.error(f'column "{name}" needs a type')
    type_text = cursor.text_between(type_tokens[0], type_tokens[-1])
    sql_type = parse_type_name(type_text, type_tokens[0].start + 1)
    not_null = False
    while not cursor.at_end:
        if cursor.accept("NOT", "NULL"):
            not_null = True
        elif cursor.accept("NULL"):
            continue
        else:
            token = cursor.peek()
            assert token is not None
            raise not_supported(f"column constraint {token.text.upper()}", token.start + 1)
    return st.ColumnDef(
        name=name, type=sql_type, type_text=type_text, not_null=not_null, position=start
    )


def _create_source(
    cursor: Cursor, text: str, where: int
) -> st.CreateSource | st.CreatePostgresSource:
    exists = _if_not_exists(cursor)
    name = cursor.qualified_name("a source name")
    if cursor.peek() is not None and cursor.peek().token_type is TokenType.L_PAREN:  # type: ignore[union-attr]
        columns = _column_defs(cursor)
    else:
        columns = ()
    in_cluster = _in_cluster(cursor)
    if not columns and cursor.accept("FROM", "POSTGRES"):
        return connections.postgres_source(cursor, text, where, name, in_cluster, exists)
    if not (cursor.accept("FROM") or cursor.accept("FORMAT")):
        raise cursor.error("CREATE SOURCE needs FROM CDCV2 or FROM LOAD GENERATOR")
    format_at = cursor.position()
    if cursor.accept("LOAD", "GENERATOR"):
        if columns:
            raise SqlError(SYNTAX_ERROR, "a load generator source takes no column list", format_at)
        options = _load_generator(cursor)
        for_all = cursor.accept("FOR", "ALL", "TABLES")
        progress = None
        if cursor.accept("EXPOSE", "PROGRESS", "AS"):
            progress = cursor.identifier("a progress subsource name")
        cursor.expect_end()
        return st.CreateSource(
            text=text,
            position=where,
            name=name,
            columns=(),
            format="LOAD GENERATOR",
            if_not_exists=exists,
            load_generator=options,
            for_all_tables=for_all,
            progress_name=progress,
            in_cluster=in_cluster,
        )
    format_name = cursor.identifier("a source format").upper()
    if format_name != "CDCV2":
        raise not_supported(
            f"source format {format_name}", format_at, hint="use FROM CDCV2 or FROM LOAD GENERATOR"
        )
    if not columns:
        raise SqlError(SYNTAX_ERROR, "a CDCV2 source needs a column list", format_at)
    cursor.expect_end()
    return st.CreateSource(
        text=text,
        position=where,
        name=name,
        columns=columns,
        format=format_name,
        if_not_exists=exists,
        in_cluster=in_cluster,
    )


_GENERATORS = ("COUNTER", "AUCTION", "TPCH")


def _load_generator(cursor: Cursor) -> st.LoadGeneratorOptions:
    at = cursor.position()
    generator = cursor.identifier("a load generator").upper()
    if generator not in _GENERATORS:
        raise not_supported(
            f"load generator {generator}", at, hint=f"use one of {', '.join(_GENERATORS)}"
        )
    values: dict[str, object] = {}
    if cursor.peek() is not None and cursor.peek().token_type is TokenType.L_PAREN:  # type: ignore[union-attr]
        inside = cursor.parenthesized()
        for part in split_top_level(inside):
            option = Cursor(cursor.sql, part)
            _load_generator_option(option, values)
    return st.LoadGeneratorOptions(generator=generator, **values)  # type: ignore[arg-type]


def _load_generator_option(cursor: Cursor, values: dict[str, object]) -> None:
    at = cursor.position()
    value: float | int
    if cursor.accept("TICK", "INTERVAL"):
        key, value = "tick_interval_ms", _interval_ms(cursor)
    elif cursor.accept("MAX", "CARDINALITY"):
        key, value = "max_cardinality", _option_number(cursor, "MAX CARDINALITY", integer=True)
    elif cursor.accept("SCALE", "FACTOR"):
        key, value = "scale_factor", _option_number(cursor, "SCALE FACTOR", integer=False)
    elif cursor.accept("UP", "TO"):
        key, value = "up_to", _option_number(cursor, "UP TO", integer=True)
    else:
        token = cursor.peek()
        near = "end of input" if token is None else token.text.upper()
        raise not_supported(
            f"load generator option {near}",
            at,
            hint="the options are TICK INTERVAL, MAX CARDINALITY, SCALE FACTOR and UP TO",
        )
    cursor.accept_type(TokenType.EQ)
    cursor.expect_end()
    if key in values:
        raise SqlError(SYNTAX_ERROR, "a load generator option is given twice", at)
    values[key] = value


def _option_value(cursor: Cursor, what: str) -> Token:
    cursor.accept_type(TokenType.EQ)
    token = cursor.peek()
    if token is None:
        raise cursor.error(f"{what} needs a value")
    return cursor.next()


def _option_number(cursor: Cursor, what: str, *, integer: bool) -> float | int:
    token = _option_value(cursor, what)
    text = str(token.text)
    try:
        number: float | int = int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise SqlError(
            SYNTAX_ERROR, f"{what} must be {kind}, got {text!r}", token.start + 1
        ) from None
    if number < 0 or (not integer and number <= 0):
        raise SqlError(SYNTAX_ERROR, f"{what} must be positive, got {text}", token.start + 1)
    return number


_INTERVAL_UNITS = {
    "ms": 1, "msec": 1, "msecs": 1, "millisecond": 1, "milliseconds": 1,
    "s": 1000, "sec": 1000, "secs": 1000, "second": 1000, "seconds": 1000,
    "m": 60_000, "min": 60_000, "mins": 60_000, "minute": 60_000, "minutes": 60_000,
    "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
}  # fmt: skip


def _interval_ms(cursor: Cursor) -> int:
    """``'1s'``, ``'500 ms'``, ``'2 seconds'``: milliseconds (at least 1)."""
    token = _option_value(cursor, "TICK INTERVAL")
    text = str(token.text).strip().lower()
    digits = text.rstrip("abcdefghijklmnopqrstuvwxyz ").strip()
    unit = text[len(digits) :].strip() or "s"
    try:
        amount = float(digits)
    except ValueError:
        amount = -1.0
    factor = _INTERVAL_UNITS.get(unit)
    if factor is None or amount <= 0 or token.token_type is not TokenType.STRING:
        raise SqlError(
            SYNTAX_ERROR,
            "TICK INTERVAL must be a positive interval such as '1s' or '100ms', "
            f"got {token.text!r}",
            token.start + 1,
        )
    return max(1, round(amount * factor))


def _in_cluster(cursor: Cursor) -> str | None:
    if cursor.accept("IN", "CLUSTER"):
        return cursor.identifier("a cluster name")
    return None


def _create_view(cursor: Cursor, text: str, where: int, materialized: bool) -> st.CreateView:
    exists = _if_not_exists(cursor)
    name = cursor.qualified_name("a view name")
    column_names: tuple[str, ...] | None = None
    if cursor.peek() is not None and cursor.peek().token_type is TokenType.L_PAREN:  # type: ignore[union-attr]
        inside = cursor.parenthesized()
        column_names = tuple(
            _single_identifier(cursor.sql, part) for part in split_top_level(inside)
        )
    in_cluster = _in_cluster(cursor)
    if in_cluster is not None and not materialized:
        raise SqlError(SYNTAX_ERROR, "only a materialized view is IN CLUSTER", where)
    cursor.expect("AS")
    query = query_from(cursor.sql, cursor.rest())
    return st.CreateView(
        text=text,
        position=where,
        name=name,
        query=query,
        materialized=materialized,
        in_cluster=in_cluster,
        if_not_exists=exists,
        column_names=column_names,
    )


def _single_identifier(sql: str, tokens: list[Token]) -> str:
    cursor = Cursor(sql, tokens)
    name = cursor.identifier("a column name")
    if not cursor.at_end:
        token = cursor.peek()
        assert token is not None
        if is_word(token, "ASC", "DESC", "NULLS"):
            raise not_supported("index key ordering", token.start + 1)
        if token.token_type is TokenType.L_PAREN or not is_word(token):
            raise not_supported("an expression here (only column names)", token.start + 1)
        raise cursor.error()
    return name


def _create_index(cursor: Cursor, text: str, where: int) -> st.CreateIndex:
    exists = _if_not_exists(cursor)
    name: str | None = None
    if not cursor.at_words("ON") and not cursor.at_words("IN", "CLUSTER"):
        name = cursor.identifier("an index name")
    in_cluster = _in_cluster(cursor)
    cursor.expect("ON")
    on = cursor.qualified_name("a relation name")
    if cursor.at_words("USING"):
        raise not_supported("index methods (USING)", cursor.position())
    inside = cursor.parenthesized()
    if not inside:
        raise SqlError(SYNTAX_ERROR, "an index needs at least one column", where)
    columns = tuple(_single_identifier(cursor.sql, part) for part in split_top_level(inside))
    later = _in_cluster(cursor)
    if later is not None:
        if in_cluster is not None:
            raise SqlError(SYNTAX_ERROR, "IN CLUSTER given twice", where)
        in_cluster = later
    cursor.expect_end()
    return st.CreateIndex(
        text=text,
        position=where,
        name=name,
        on=on,
        columns=columns,
        in_cluster=in_cluster,
        if_not_exists=exists,
    )


def _create_cluster(cursor: Cursor, text: str, where: int) -> st.CreateCluster:
    exists = _if_not_exists(cursor)
    name = cursor.identifier("a cluster name")
    options: list[tuple[str, str]] = []
    if cursor.peek() is not None and cursor.peek().token_type is TokenType.L_PAREN:  # type: ignore[union-attr]
        inside = cursor.parenthesized()
        for part in split_top_level(inside):
            options.append(_cluster_option(Cursor(cursor.sql, part), whole=True))
        cursor.expect_end()
    else:
        while not cursor.at_end:
            options.append(_cluster_option(cursor, whole=False))
            cursor.accept_type(TokenType.COMMA)
    return st.CreateCluster(
        text=text, position=where, name=name, options=tuple(options), if_not_exists=exists
    )


def _cluster_option(cursor: Cursor, *, whole: bool) -> tuple[str, str]:
    words = [cursor.identifier("an option name")]
    # The one two-word option: REPLICATION FACTOR.
    if words[0] == "replication" and cursor.accept("FACTOR"):
        words.append("factor")
    cursor.accept_type(TokenType.EQ)
    token = cursor.next()
    if token.token_type in (TokenType.STRING, TokenType.NUMBER, TokenType.IDENTIFIER):
        value = str(token.text)
    elif is_word(token):
        value = str(token.text).lower()
    else:
        raise SqlError(
            SYNTAX_ERROR,
            "cluster option values are strings, numbers or words",
            token.start + 1,
        )
    if whole:
        cursor.expect_end()
    return "_".join(words), value


# DROP -------------------------------------------------------------------------------------

_DROP_KINDS: tuple[tuple[tuple[str, ...], st.ObjectKind], ...] = (
    (("MATERIALIZED", "VIEW"), "materialized view"),
    (("DATABASE",), "database"),
    (("SCHEMA",), "schema"),
    (("TABLE",), "table"),
    (("VIEW",), "view"),
    (("INDEX",), "index"),
    (("CLUSTER",), "cluster"),
    (("SOURCE",), "source"),
    (("SECRET",), "secret"),
    (("CONNECTION",), "connection"),
    (("ROLE",), "role"),
    (("USER",), "role"),
)


def _drop(cursor: Cursor, text: str, where: int) -> st.Drop:
    cursor.expect("DROP")
    found = next((kind for words, kind in _DROP_KINDS if cursor.accept(*words)), None)
    if found is None:
        token = cursor.peek()
        if token is not None and is_word(token):
            raise not_supported(f"DROP {token.text.upper()}", token.start + 1)
        raise cursor.error()
    kind: st.ObjectKind = found
    exists = cursor.accept("IF", "EXISTS")
    names = [cursor.qualified_name(f"a {kind} name")]
    while cursor.accept_type(TokenType.COMMA):
        names.append(cursor.qualified_name(f"a {kind} name"))
    cascade = False
    if cursor.accept("CASCADE"):
        cascade = True
    else:
        cursor.accept("RESTRICT")
    cursor.expect_end()
    single = kind in ("database", "cluster")
    for name in names:
        if (single and len(name) > 1) or (kind == "schema" and len(name) > 2):
            raise SqlError(SYNTAX_ERROR, f"improper {kind} name: {'.'.join(name)}", where)
    return st.Drop(
        text=text, position=where, kind=kind, names=tuple(names), if_exists=exists, cascade=cascade
    )


def _alter(
    cursor: Cursor, text: str, where: int
) -> st.RebuildMaterializedView | st.AlterRole | st.AlterOwner:
    cursor.expect("ALTER")
    if cursor.accept("ROLE") or cursor.accept("USER"):
        return roles.alter_role(cursor, where)
    found = next((kind for words, kind in _DROP_KINDS if cursor.accept(*words)), None)
    if found is None:
        token = cursor.peek()
        if token is not None and is_word(token):
            raise not_supported(f"ALTER {token.text.upper()}", token.start + 1)
        raise cursor.error()
    name = cursor.qualified_name(f"a {found} name")
    if cursor.accept("OWNER", "TO"):
        owner = cursor.identifier("a role name")
        cursor.expect_end()
        return st.AlterOwner(text=text, position=where, kind=found, name=name, owner=owner)
    if found != "materialized view" or not cursor.accept("REBUILD"):
        token = cursor.peek()
        if token is not None and is_word(token):
            raise not_supported(f"ALTER {found.upper()} ... {token.text.upper()}", token.start + 1)
        raise cursor.error()
    cursor.expect_end()
    return st.RebuildMaterializedView(text=text, position=where, name=name)


# DML --------------------------------------------------------------------------------------


def _unsupported_args(tree: exp.Expr, what: str, names: Sequence[str]) -> None:
    for name in names:
        value = tree.args.get(name)
        if value:
            node = value if isinstance(value, exp.Expr) else None
            raise not_supported(f"{what} with {name.upper()}", position(node) or position(tree))


def _dml_table(table: exp.Expr) -> tuple[QualifiedName, str | None]:
    if not isinstance(table, exp.Table) or not table.this:
        raise SqlError(SYNTAX_ERROR, "expected a table name", position(table))
    alias = table.args.get("alias")
    return table_name(table), identifier(alias.this) if alias is not None else None


def _insert(cursor: Cursor, text: str, where: int) -> st.Insert:
    tree = parse_expressions(cursor.sql, cursor.tokens)
    if not isinstance(tree, exp.Insert):
        raise cursor.error()
    _unsupported_args(tree, "INSERT", ("returning", "conflict", "with", "overwrite", "where"))
    target = tree.this
    columns: tuple[str, ...] | None = None
    if isinstance(target, exp.Schema):
        columns = tuple(identifier(c) for c in target.expressions)
        target = target.this
    table, _ = _dml_table(target)
    source_tree = tree.args.get("expression")
    source: st.Query | None = None
    if source_tree is None:
        if not tree.args.get("default"):
            raise SqlError(SYNTAX_ERROR, "INSERT needs VALUES, a query or DEFAULT VALUES", where)
    else:
        if not isinstance(source_tree, exp.Query | exp.Values | exp.Subquery):
            raise SqlError(SYNTAX_ERROR, "INSERT needs VALUES or a query", position(source_tree))
        source_text = source_tree.sql(dialect="postgres")
        source = st.Query(ast=source_tree, text=source_text, position=position(source_tree))
    return st.Insert(text=text, position=where, table=table, columns=columns, source=source)


# COPY -------------------------------------------------------------------------------------

# The options COPY takes, and the words of PostgreSQL's older option syntax (COPY ... CSV
# HEADER DELIMITER ',') that stand for them.
_COPY_OLD_WORDS = {"CSV": ("format", "csv"), "BINARY": ("format", "binary")}
_COPY_OLD_VALUED = ("DELIMITER", "NULL", "QUOTE", "ESCAPE", "ENCODING")


def _copy(cursor: Cursor, text: str, where: int) -> st.CopyFrom | st.CopyTo:
    cursor.expect("COPY")
    first = cursor.peek()
    if first is None:
        raise cursor.error()
    if first.token_type is TokenType.L_PAREN:
        inside = cursor.parenthesized()
        if not inside:
            raise SqlError(SYNTAX_ERROR, "COPY (query) needs a query", first.start + 1)
        query = query_from(cursor.sql, inside)
        if not cursor.accept("TO"):
            raise cursor.error("COPY (query) takes TO STDOUT; only a table can be copied FROM")
        _copy_stdout(cursor)
        return st.CopyTo(text=text, position=where, query=query, options=_copy_options(cursor))
    name = cursor.qualified_name("a table name or a query")
    columns: tuple[str, ...] | None = None
    if cursor.peek() is not None and cursor.peek().token_type is TokenType.L_PAREN:  # type: ignore[union-attr]
        inner = Cursor(cursor.sql, cursor.parenthesized())
        names = [inner.identifier("a column name")]
        while inner.accept_type(TokenType.COMMA):
            names.append(inner.identifier("a column name"))
        inner.expect_end()
        columns = tuple(names)
    if cursor.accept("TO"):
        _copy_stdout(cursor)
        listed = "*" if columns is None else ", ".join(_quoted(c) for c in columns)
        relation = ".".join(_quoted(p) for p in name)
        select = exp.select(*_column_nodes(columns, first)).from_(
            exp.Table(**_table_parts(name, first))
        )
        query = st.Query(
            ast=select, text=f"SELECT {listed} FROM {relation}", position=first.start + 1
        )
        return st.CopyTo(text=text, position=where, query=query, options=_copy_options(cursor))
    cursor.expect("FROM")
    source = cursor.next()
    location: str | None
    if source.token_type is TokenType.STRING:
        location = str(source.text)
    elif is_word(source, "STDIN"):
        location = None
    elif is_word(source, "PROGRAM"):
        raise not_supported("COPY FROM PROGRAM", source.start + 1)
    else:
        raise SqlError(
            SYNTAX_ERROR,
            f'syntax error at or near "{source.text}": expected STDIN or a quoted file name or URL',
            source.start + 1,
        )
    return st.CopyFrom(
        text=text,
        position=where,
        table=name,
        columns=columns,
        location=location,
        options=_copy_options(cursor),
    )


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _column_nodes(columns: tuple[str, ...] | None, first: Token) -> list[exp.Expr]:
    if columns is None:
        return [exp.Star()]
    nodes: list[exp.Expr] = []
    for column in columns:
        ident = exp.Identifier(this=column, quoted=True)
        ident.meta["start"] = first.start
        nodes.append(exp.Column(this=ident))
    return nodes


def _copy_stdout(cursor: Cursor) -> None:
    target = cursor.next()
    if is_word(target, "STDOUT"):
        return
    raise SqlError(
        "0A000" if target.token_type is TokenType.STRING else SYNTAX_ERROR,
        "COPY ... TO writes to STDOUT only (the client saves it: \\copy ... TO 'file' in "
        "tidemark sql)",
        target.start + 1,
    )


def _copy_options(cursor: Cursor) -> tuple[st.CopyOption, ...]:
    cursor.accept("WITH")
    if cursor.peek() is not None and cursor.peek().token_type is TokenType.L_PAREN:  # type: ignore[union-attr]
        options = []
        for part in split_top_level(cursor.parenthesized()):
            if not part:
                raise cursor.error("COPY options are name [value], separated by commas")
            options.append(_copy_option(cursor.sql, part))
        cursor.expect_end()
        return tuple(options)
    old: list[st.CopyOption] = []
    while not cursor.at_end:
        token = cursor.next()
        word = str(token.text).upper() if is_word(token) else ""
        if word in _COPY_OLD_WORDS:
            name, value = _COPY_OLD_WORDS[word]
            old.append(st.CopyOption(name, value, token.start + 1))
        elif word == "HEADER":
            old.append(st.CopyOption("header", None, token.start + 1))
        elif word in _COPY_OLD_VALUED:
            cursor.accept("AS")
            given = cursor.next()
            if given.token_type not in (TokenType.STRING, TokenType.BYTE_STRING):
                raise SqlError(SYNTAX_ERROR, f"{word} takes a quoted string", given.start + 1)
            old.append(st.CopyOption(word.lower(), str(given.text), token.start + 1))
        else:
            raise SqlError(SYNTAX_ERROR, f'syntax error at or near "{token.text}"', token.start + 1)
    return tuple(old)


def _copy_option(sql: str, tokens: list[Token]) -> st.CopyOption:
    name_token = tokens[0]
    if not is_word(name_token):
        raise SqlError(SYNTAX_ERROR, "expected an option name", name_token.start + 1)
    name = str(name_token.text).lower()
    if len(tokens) == 1:
        return st.CopyOption(name, None, name_token.start + 1)
    if len(tokens) > 2:
        raise SqlError(
            SYNTAX_ERROR, f'syntax error at or near "{tokens[2].text}"', tokens[2].start + 1
        )
    value_token = tokens[1]
    if value_token.token_type in (TokenType.STRING, TokenType.BYTE_STRING, TokenType.NUMBER):
        value = str(value_token.text)
    elif is_word(value_token):
        value = str(value_token.text).lower()
    else:
        raise SqlError(
            SYNTAX_ERROR,
            f"option {name} takes a string, a number or a word",
            value_token.start + 1,
        )
    return st.CopyOption(name, value, name_token.start + 1)


def _update(cursor: Cursor, text: str, where: int) -> st.Update:
    tree = parse_expressions(cursor.sql, cursor.tokens)
    if not isinstance(tree, exp.Update):
        raise cursor.error()
    _unsupported_args(tree, "UPDATE", ("from", "from_", "returning", "with", "order", "limit"))
    table, alias = _dml_table(tree.this)
    assignments = []
    for item in tree.expressions:
        if not isinstance(item, exp.EQ) or not isinstance(item.this, exp.Column):
            raise SqlError(SYNTAX_ERROR, "SET takes column = value", position(item))
        column = item.this
        if column.table:
            raise not_supported("qualified columns in SET", position(column))
        assignments.append(
            st.Assignment(
                column=identifier(column.this), value=item.expression, position=position(item)
            )
        )
    condition = tree.args.get("where")
    return st.Update(
        text=text,
        position=where,
        table=table,
        alias=alias,
        assignments=tuple(assignments),
        where=condition.this if condition is not None else None,
    )


def _delete(cursor: Cursor, text: str, where: int) -> st.Delete:
    tree = parse_expressions(cursor.sql, cursor.tokens)
    if not isinstance(tree, exp.Delete):
        raise cursor.error()
    _unsupported_args(tree, "DELETE", ("using", "returning", "with", "order", "limit", "tables"))
    table, alias = _dml_table(tree.this)
    condition = tree.args.get("where")
    return st.Delete(
        text=text,
        position=where,
        table=table,
        alias=alias,
        where=condition.this if condition is not None else None,
    )


# SUBSCRIBE, EXPLAIN, SHOW -----------------------------------------------------------------


def _subscribe(cursor: Cursor, text: str, where: int) -> st.Subscribe:
    cursor.expect("SUBSCRIBE")
    cursor.accept("TO")
    first = cursor.peek()
    if first is None:
        raise cursor.error()
    if first.token_type is TokenType.L_PAREN or is_word(first, *_QUERY_STARTS):
        query, as_of = _query_with_as_of(cursor.sql, cursor.rest())
        return st.Subscribe(text=text, position=where, query=query, as_of=as_of)
    name = cursor.qualified_name("a relation name or a query")
    as_of = None
    if cursor.accept("AS", "OF"):
        as_of = _as_of(cursor.rest(), cursor.sql)
    cursor.expect_end()
    select = exp.select("*").from_(exp.Table(**_table_parts(name, first)))
    query = st.Query(ast=select, text=f"SELECT * FROM {'.'.join(name)}", position=first.start + 1)
    return st.Subscribe(text=text, position=where, query=query, as_of=as_of, target=name)


def _table_parts(name: QualifiedName, first: Token) -> dict[str, exp.Expr]:
    """exp.Table arguments for ``name``, quoted so the names stay as already folded, and
    placed at ``first`` for error positions."""
    keys = ("catalog", "db", "this")[3 - len(name) :]
    parts: dict[str, exp.Expr] = {}
    for key, part in zip(keys, name, strict=True):
        ident = exp.Identifier(this=part, quoted=True)
        ident.meta["start"] = first.start
        parts[key] = ident
    return parts


def _explain(cursor: Cursor, text: str, where: int) -> st.Explain:
    cursor.expect("EXPLAIN")
    if cursor.peek() is not None and cursor.peek().token_type is TokenType.L_PAREN:  # type: ignore[union-attr]
        raise not_supported("EXPLAIN options", cursor.position())
    raw = False
    if cursor.accept("RAW"):
        raw = True
        cursor.expect("PLAN")
        cursor.accept("FOR")
    elif cursor.accept("OPTIMIZED"):
        cursor.expect("PLAN")
        cursor.accept("FOR")
    elif cursor.accept("PLAN"):
        cursor.accept("FOR")
    first = cursor.peek()
    if first is None or not (
        first.token_type is TokenType.L_PAREN or is_word(first, *_QUERY_STARTS)
    ):
        if first is not None and is_word(first):
            raise not_supported(f"EXPLAIN {first.text.upper()}", first.start + 1)
        raise cursor.error()
    query, _ = _query_with_as_of(cursor.sql, cursor.rest())
    return st.Explain(text=text, position=where, query=query, raw=raw)


def _show(cursor: Cursor, text: str, where: int) -> st.AnyStatement:
    cursor.expect("SHOW")
    if cursor.accept("MATERIALIZED", "VIEWS"):
        return _show_objects(cursor, text, where, "materialized views")
    token = cursor.peek()
    if token is not None and is_word(token) and token.text.upper() in _SHOW_KINDS:
        cursor.next()
        return _show_objects(cursor, text, where, _SHOW_KINDS[token.text.upper()])
    if cursor.accept("COLUMNS"):
        if not (cursor.accept("FROM") or cursor.accept("IN")):
            raise cursor.error("SHOW COLUMNS needs FROM <relation>")
        relation = cursor.qualified_name("a relation name")
        cursor.expect_end()
        return st.ShowColumns(text=text, position=where, relation=relation)
    if cursor.accept("TRANSACTION", "ISOLATION", "LEVEL"):
        cursor.expect_end()
        return st.ShowSetting(text=text, position=where, name="transaction_isolation")
    if cursor.accept("TIME", "ZONE"):
        cursor.expect_end()
        return st.ShowSetting(text=text, position=where, name="timezone")
    name = cursor.identifier("a setting name")
    cursor.expect_end()
    return st.ShowSetting(text=text, position=where, name=name)


def _show_objects(cursor: Cursor, text: str, where: int, kind: st.ShowKind) -> st.ShowObjects:
    within: QualifiedName | None = None
    on: QualifiedName | None = None
    in_cluster: str | None = None
    while not cursor.at_end:
        if cursor.at_words("IN", "CLUSTER"):
            in_cluster = _in_cluster(cursor)
        elif cursor.accept("FROM") or cursor.accept("IN"):
            within = cursor.qualified_name("a schema name")
        elif kind in ("indexes", "subsources") and cursor.accept("ON"):
            on = cursor.qualified_name("a relation name")
        else:
            raise cursor.error()
    return st.ShowObjects(
        text=text, position=where, kind=kind, within=within, on=on, in_cluster=in_cluster
    )


# SET, transactions ------------------------------------------------------------------------


def _set(cursor: Cursor, text: str, where: int) -> st.SetVariable:
    cursor.expect("SET")
    local = cursor.accept("LOCAL")
    if not local:
        cursor.accept("SESSION")
    if cursor.accept("TRANSACTION", "ISOLATION", "LEVEL") or cursor.accept(
        "SESSION", "CHARACTERISTICS", "AS", "TRANSACTION", "ISOLATION", "LEVEL"
    ):
        level = " ".join(cursor.identifier("an isolation level") for _ in range(_remaining(cursor)))
        return st.SetVariable(
            text=text, position=where, name="transaction_isolation", value=level, local=local
        )
    if cursor.accept("TIME", "ZONE"):
        name = "timezone"
    else:
        name = cursor.identifier("a setting name")
    # SET TIME ZONE takes its value directly.
    if not (cursor.accept("TO") or cursor.accept_type(TokenType.EQ)) and name != "timezone":
        raise cursor.error()
    if cursor.at_end:
        raise cursor.error()
    if cursor.accept("DEFAULT"):
        cursor.expect_end()
        return st.SetVariable(text=text, position=where, name=name, value=None, local=local)
    values = []
    while True:
        values.append(_setting_value(cursor))
        if not cursor.accept_type(TokenType.COMMA):
            break
    cursor.expect_end()
    return st.SetVariable(
        text=text, position=where, name=name, value=", ".join(values), local=local
    )


def _remaining(cursor: Cursor) -> int:
    return len(cursor.tokens) - cursor.index


def _setting_value(cursor: Cursor) -> str:
    token = cursor.next()
    if token.token_type is TokenType.STRING:
        return str(token.text)
    if token.token_type is TokenType.NUMBER:
        return str(token.text)
    if token.token_type is TokenType.DASH:
        number = cursor.expect_type(TokenType.NUMBER, "a number")
        return "-" + str(number.text)
    if token.token_type is TokenType.IDENTIFIER:
        return str(token.text)
    if is_word(token):
        return str(token.text).lower()
    raise SqlError(SYNTAX_ERROR, f'syntax error at or near "{token.text}"', token.start + 1)


def _reset(cursor: Cursor, text: str, where: int) -> st.SetVariable:
    cursor.expect("RESET")
    name = cursor.identifier("a setting name")
    cursor.expect_end()
    return st.SetVariable(text=text, position=where, name=name, value=None)


def _transaction_modes(cursor: Cursor) -> tuple[str, ...]:
    modes: list[str] = []
    remaining = cursor.rest()
    if not remaining:
        return ()
    for part in split_top_level(remaining):
        words = [token.text.lower() for token in part]
        if not words or not all(is_word(token) for token in part):
            raise SqlError(
                SYNTAX_ERROR,
                "syntax error in transaction mode",
                part[0].start + 1 if part else cursor.position(),
            )
        modes.append(" ".join(words))
    return tuple(modes)


def _begin(cursor: Cursor, text: str, where: int) -> st.Begin:
    if cursor.accept("START"):
        cursor.expect("TRANSACTION")
    else:
        cursor.expect("BEGIN")
        if not cursor.accept("TRANSACTION"):
            cursor.accept("WORK")
    return st.Begin(text=text, position=where, modes=_transaction_modes(cursor))


def _commit(cursor: Cursor, text: str, where: int) -> st.Commit:
    if not cursor.accept("END"):
        cursor.expect("COMMIT")
    if not cursor.accept("TRANSACTION"):
        cursor.accept("WORK")
    cursor.expect_end()
    return st.Commit(text=text, position=where)


def _rollback(cursor: Cursor, text: str, where: int) -> st.Rollback:
    if not cursor.accept("ABORT"):
        cursor.expect("ROLLBACK")
    if not cursor.accept("TRANSACTION"):
        cursor.accept("WORK")
    cursor.expect_end()
    return st.Rollback(text=text, position=where)


_HANDLERS: dict[str, Callable[[Cursor, str, int], st.AnyStatement]] = {
    "CREATE": _create,
    "DROP": _drop,
    "ALTER": _alter,
    "GRANT": grants.grant,
    "REVOKE": grants.grant,
    "INSERT": _insert,
    "COPY": _copy,
    "UPDATE": _update,
    "DELETE": _delete,
    "SUBSCRIBE": _subscribe,
    "EXPLAIN": _explain,
    "SHOW": _show,
    "SET": _set,
    "RESET": _reset,
    "BEGIN": _begin,
    "START": _begin,
    "COMMIT": _commit,
    "END": _commit,
    "ROLLBACK": _rollback,
    "ABORT": _rollback,
}
