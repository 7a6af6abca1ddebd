"""Parsing GRANT, REVOKE and ALTER ... OWNER TO, as PostgreSQL writes them:

GRANT { privilege [, ...] | ALL [PRIVILEGES] }
    ON { [TABLE | VIEW | MATERIALIZED VIEW | SOURCE] name [, ...]
       | CLUSTER name [, ...] | DATABASE name [, ...] | SCHEMA name [, ...]
       | ALL TABLES IN SCHEMA name [, ...] }
    TO { role | PUBLIC } [, ...]
REVOKE (the same) FROM { role | PUBLIC } [, ...]
GRANT role [, ...] TO role [, ...]          REVOKE role [, ...] FROM role [, ...]
ALTER <kind> name OWNER TO role
"""

from __future__ import annotations

from sqlglot.tokens import TokenType  # type: ignore[attr-defined]

from services.adapter.sql import statements as st
from services.adapter.sql.errors import SYNTAX_ERROR, SqlError
from services.adapter.sql.names import QualifiedName
from services.adapter.sql.tokens import Cursor, is_word

PUBLIC = "PUBLIC"
PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "USAGE", "CREATE")
_RELATION_WORDS = (("MATERIALIZED", "VIEW"), ("TABLE",), ("VIEW",), ("SOURCE",))
_GLOBAL_KINDS: tuple[tuple[str, st.GrantKind], ...] = (
    ("CLUSTER", "cluster"),
    ("DATABASE", "database"),
    ("SCHEMA", "schema"),
)


def grant(cursor: Cursor, text: str, where: int) -> st.Grant | st.GrantRole:
    """``GRANT ...`` or ``REVOKE ...`` (the cursor at its first word)."""
    revoke = is_word(cursor.peek(), "REVOKE")
    cursor.next()
    into = "FROM" if revoke else "TO"
    if cursor.accept("ALL"):
        cursor.accept("PRIVILEGES")
        privileges: tuple[str, ...] = ()
    else:
        words = _words(cursor)
        if cursor.accept(into):
            roles = tuple(w.lower() for w in words)
            members = _roles(cursor, allow_public=False)
            return st.GrantRole(
                text=text, position=where, revoke=revoke, roles=roles, members=members
            )
        for word in words:
            if word not in PRIVILEGES:
                raise SqlError(
                    SYNTAX_ERROR,
                    f'unrecognized privilege "{word}"; the privileges are '
                    f"{', '.join(PRIVILEGES)} and ALL",
                    where,
                )
        privileges = tuple(dict.fromkeys(words))
    cursor.expect("ON")
    kind, names = _target(cursor)
    cursor.expect(into)
    grantees = _roles(cursor, allow_public=True)
    return st.Grant(
        text=text,
        position=where,
        revoke=revoke,
        privileges=privileges,
        kind=kind,
        names=names,
        grantees=grantees,
    )


def _words(cursor: Cursor) -> list[str]:
    """``a, b, c``: privileges (upper-cased) or role names."""
    words: list[str] = []
    while True:
        token = cursor.peek()
        if token is None:
            raise cursor.error()
        if token.token_type is TokenType.IDENTIFIER:
            words.append(str(token.text))
            cursor.next()
        else:
            words.append(str(cursor.next().text).upper())
        if not cursor.accept_type(TokenType.COMMA):
            return words


def _target(cursor: Cursor) -> tuple[st.GrantKind, tuple[QualifiedName, ...]]:
    if cursor.accept("ALL", "TABLES", "IN", "SCHEMA"):
        return "all tables in schema", _names(cursor, "a schema name")
    for word, kind in _GLOBAL_KINDS:
        if cursor.accept(word):
            names = _names(cursor, f"a {kind} name")
            limit = 2 if kind == "schema" else 1
            for name in names:
                if len(name) > limit:
                    raise SqlError(SYNTAX_ERROR, f"improper {kind} name: {'.'.join(name)}")
            return kind, names
    for words in _RELATION_WORDS:
        if cursor.accept(*words):
            break
    return "relation", _names(cursor, "a relation name")


def _names(cursor: Cursor, what: str) -> tuple[QualifiedName, ...]:
    names = [cursor.qualified_name(what)]
    while cursor.accept_type(TokenType.COMMA):
        names.append(cursor.qualified_name(what))
    return tuple(names)


def _roles(cursor: Cursor, *, allow_public: bool) -> tuple[str, ...]:
    roles: list[str] = []
    while True:
        if allow_public and cursor.accept("PUBLIC"):
            roles.append(PUBLIC)
        else:
            cursor.accept("GROUP")
            roles.append(cursor.identifier("a role name"))
        if not cursor.accept_type(TokenType.COMMA):
            break
    cursor.expect_end()
    return tuple(roles)
