"""Parsing the statements that reach upstream systems, after Materialize's syntax:

    CREATE SECRET [IF NOT EXISTS] name AS 'value'
    CREATE CONNECTION [IF NOT EXISTS] name TO POSTGRES (HOST 'h', PORT 5432, USER 'u',
        PASSWORD SECRET s, DATABASE 'd')
    CREATE SOURCE [IF NOT EXISTS] name [IN CLUSTER c] FROM POSTGRES CONNECTION conn
        (PUBLICATION 'p' [, TEXT COLUMNS (t.c, schema.t.c)])
        FOR ALL TABLES | FOR TABLES (t1, schema.t2 AS alias) | FOR SCHEMAS (s1, s2)
        [EXPOSE PROGRESS AS progress_name]

A secret's value never reaches a statement's ``text``: it is masked there, so neither logs nor
errors that quote the statement show it.
"""

from __future__ import annotations

from sqlglot.tokens import Token, TokenType  # type: ignore[attr-defined]

from services.adapter.sql import statements as st
from services.adapter.sql.errors import SYNTAX_ERROR, SqlError, not_supported
from services.adapter.sql.names import QualifiedName
from services.adapter.sql.tokens import Cursor, split_top_level

_MASK = "'********'"
_POSTGRES_OPTIONS = ("host", "port", "user", "password", "database")


def _string(cursor: Cursor, what: str) -> Token:
    return cursor.expect_type(TokenType.STRING, what)


def create_secret(cursor: Cursor, text: str, where: int, if_not_exists: bool) -> st.CreateSecret:
    """After ``CREATE SECRET [IF NOT EXISTS]``."""
    name = cursor.qualified_name("a secret name")
    # Errors here never quote the tokens: one of them may be the secret.
    if not cursor.accept("AS"):
        raise SqlError(SYNTAX_ERROR, "CREATE SECRET name needs AS 'value'", where)
    value = cursor.accept_type(TokenType.STRING)
    if value is None or not cursor.at_end:
        raise SqlError(SYNTAX_ERROR, "CREATE SECRET takes one string literal after AS", where)
    exists = " IF NOT EXISTS" if if_not_exists else ""
    return st.CreateSecret(
        text=f"CREATE SECRET{exists} {'.'.join(name)} AS {_MASK}",
        position=where,
        name=name,
        value=str(value.text).encode(),
        if_not_exists=if_not_exists,
    )


def create_connection(
    cursor: Cursor, text: str, where: int, if_not_exists: bool
) -> st.CreateConnection:
    """After ``CREATE CONNECTION [IF NOT EXISTS]``."""
    name = cursor.qualified_name("a connection name")
    cursor.expect("TO")
    kind_at = cursor.position()
    kind = cursor.identifier("a connection type").upper()
    if kind != "POSTGRES":
        raise not_supported(f"CONNECTION TO {kind}", kind_at, hint="use TO POSTGRES")
    options: dict[str, str | QualifiedName] = {}
    for part in split_top_level(cursor.parenthesized()):
        option_cursor = Cursor(cursor.sql, part)
        at = option_cursor.position()
        option = option_cursor.identifier("a connection option").lower()
        option_cursor.accept_type(TokenType.EQ)
        value: str | QualifiedName
        if option == "password":
            option_cursor.expect("SECRET")
            value = option_cursor.qualified_name("a secret name")
        elif option == "port":
            number = option_cursor.expect_type(TokenType.NUMBER, "a port number")
            value = str(number.text)
        elif option in _POSTGRES_OPTIONS:
            value = str(_string(option_cursor, f"{option.upper()} as a string").text)
        else:
            raise SqlError(
                SYNTAX_ERROR,
                f"unknown POSTGRES connection option {option.upper()}; the options are "
                f"HOST, PORT, USER, PASSWORD SECRET, DATABASE",
                at,
            )
        option_cursor.expect_end()
        if option in options:
            raise SqlError(SYNTAX_ERROR, f"option {option.upper()} given twice", at)
        options[option] = value
    cursor.expect_end()
    for needed in ("host", "user", "database"):
        if needed not in options:
            raise SqlError(SYNTAX_ERROR, f"a POSTGRES connection needs {needed.upper()}", where)
    return st.CreateConnection(
        text=text,
        position=where,
        name=name,
        kind="postgres",
        options=tuple(options.items()),
        if_not_exists=if_not_exists,
    )


def postgres_source(
    cursor: Cursor,
    text: str,
    where: int,
    name: QualifiedName,
    in_cluster: str | None,
    if_not_exists: bool,
) -> st.CreatePostgresSource:
    """After ``CREATE SOURCE [IF NOT EXISTS] name [IN CLUSTER c] FROM POSTGRES``."""
    cursor.expect("CONNECTION")
    connection = cursor.qualified_name("a connection name")
    publication: str | None = None
    text_columns: list[QualifiedName] = []
    for part in split_top_level(cursor.parenthesized()):
        option_cursor = Cursor(cursor.sql, part)
        at = option_cursor.position()
        option = option_cursor.identifier("a source option").upper()
        if option == "TEXT" and option_cursor.accept("COLUMNS"):
            option_cursor.accept_type(TokenType.EQ)
            for column in split_top_level(option_cursor.parenthesized()):
                column_cursor = Cursor(cursor.sql, column)
                reference = column_cursor.qualified_name("a column as table.column")
                column_cursor.expect_end()
                if len(reference) < 2:
                    raise SqlError(
                        SYNTAX_ERROR,
                        f"TEXT COLUMNS names each column with its table: {reference[0]} "
                        f"needs table.{reference[0]}",
                        at,
                    )
                text_columns.append(reference)
            option_cursor.expect_end()
            continue
        option_cursor.accept_type(TokenType.EQ)
        if option != "PUBLICATION":
            raise not_supported(f"POSTGRES source option {option}", at)
        publication = str(_string(option_cursor, "the publication as a string").text)
        option_cursor.expect_end()
    if publication is None:
        raise SqlError(SYNTAX_ERROR, "a POSTGRES source needs (PUBLICATION '...')", where)
    tables: tuple[st.PostgresTableRef, ...] | None
    schemas: tuple[str, ...] | None = None
    if cursor.accept("FOR", "ALL", "TABLES"):
        tables = None
    elif cursor.accept("FOR", "SCHEMAS"):
        tables = None
        schemas = tuple(
            Cursor(cursor.sql, part).identifier("a schema name")
            for part in split_top_level(cursor.parenthesized())
        )
    elif cursor.accept("FOR", "TABLES"):
        refs = []
        for part in split_top_level(cursor.parenthesized()):
            table_cursor = Cursor(cursor.sql, part)
            upstream = table_cursor.qualified_name("an upstream table")
            if len(upstream) > 2:
                upstream = upstream[-2:]
            alias = (
                table_cursor.identifier("a subsource name") if table_cursor.accept("AS") else None
            )
            table_cursor.expect_end()
            refs.append(st.PostgresTableRef(upstream, alias))
        if not refs:
            raise SqlError(SYNTAX_ERROR, "FOR TABLES needs at least one table", where)
        tables = tuple(refs)
    else:
        token = cursor.peek()
        near = f'"{token.text}"' if token is not None else "end of input"
        raise cursor.error(
            f"syntax error at or near {near}: expected FOR ALL TABLES, FOR TABLES (...) or "
            "FOR SCHEMAS (...)"
        )
    progress = None
    if cursor.accept("EXPOSE", "PROGRESS", "AS"):
        progress = cursor.identifier("a progress subsource name")
    cursor.expect_end()
    return st.CreatePostgresSource(
        text=text,
        position=where,
        name=name,
        connection=connection,
        publication=publication,
        tables=tables,
        in_cluster=in_cluster,
        if_not_exists=if_not_exists,
        progress_name=progress,
        schemas=schemas,
        text_columns=tuple(text_columns),
    )
