"""Parsing CREATE ROLE / CREATE USER / ALTER ROLE, as PostgreSQL writes them:

    CREATE ROLE name [WITH] [LOGIN | NOLOGIN] [SUPERUSER | NOSUPERUSER]
        [CREATEROLE | NOCREATEROLE]
        [PASSWORD 'password' | PASSWORD NULL]
    ALTER ROLE name [WITH] (the same options)

A password never reaches a statement's ``text``: it is masked there, so neither logs nor
errors that quote the statement show it.
"""

from __future__ import annotations

from sqlglot.tokens import TokenType  # type: ignore[attr-defined]

from services.adapter.sql import statements as st
from services.adapter.sql.errors import SYNTAX_ERROR, SqlError, not_supported
from services.adapter.sql.tokens import Cursor

_MASK = "'********'"
_FLAGS = {
    "LOGIN": ("login", True),
    "NOLOGIN": ("login", False),
    "SUPERUSER": ("superuser", True),
    "NOSUPERUSER": ("superuser", False),
    "CREATEROLE": ("createrole", True),
    "NOCREATEROLE": ("createrole", False),
}


def role_options(cursor: Cursor, where: int) -> tuple[st.RoleOptions, str]:
    """The options after the role's name, and their text with the password masked."""
    cursor.accept("WITH")
    values: dict[str, bool | str] = {}
    words: list[str] = []
    while not cursor.at_end:
        token = cursor.next()
        word = str(token.text).upper()
        if word in _FLAGS:
            field, value = _FLAGS[word]
            if field in values:
                raise SqlError(SYNTAX_ERROR, "conflicting or redundant options", token.start + 1)
            values[field] = value
            words.append(word)
        elif word == "PASSWORD":
            if "password" in values:
                raise SqlError(SYNTAX_ERROR, "conflicting or redundant options", token.start + 1)
            given = cursor.next()
            # Errors here never quote the token: it may be the password.
            if given.token_type is TokenType.NULL:
                values["password"] = ""
                words.append("PASSWORD NULL")
            elif given.token_type is TokenType.STRING and given.text:
                values["password"] = str(given.text)
                words.append(f"PASSWORD {_MASK}")
            else:
                raise SqlError(
                    SYNTAX_ERROR, "PASSWORD takes a non-empty string or NULL", token.start + 1
                )
        elif word in ("CREATEDB", "INHERIT", "REPLICATION", "BYPASSRLS"):
            raise not_supported(f"role option {word}", token.start + 1)
        else:
            raise SqlError(
                SYNTAX_ERROR,
                f'unrecognized role option "{token.text}"; the options are LOGIN, NOLOGIN, '
                "SUPERUSER, NOSUPERUSER, CREATEROLE, NOCREATEROLE and PASSWORD",
                token.start + 1,
            )
    options = st.RoleOptions(
        login=values.get("login"),  # type: ignore[arg-type]
        superuser=values.get("superuser"),  # type: ignore[arg-type]
        createrole=values.get("createrole"),  # type: ignore[arg-type]
        password=values.get("password"),  # type: ignore[arg-type]
    )
    return options, " ".join(words)


def create_role(cursor: Cursor, where: int, user: bool) -> st.CreateRole:
    """After ``CREATE ROLE`` or ``CREATE USER``."""
    name = cursor.identifier("a role name")
    options, masked = role_options(cursor, where)
    head = "CREATE USER" if user else "CREATE ROLE"
    return st.CreateRole(
        text=f"{head} {name} {masked}".rstrip(),
        position=where,
        name=name,
        options=options,
        user=user,
    )


def alter_role(cursor: Cursor, where: int) -> st.AlterRole:
    """After ``ALTER ROLE`` or ``ALTER USER``."""
    name = cursor.identifier("a role name")
    options, masked = role_options(cursor, where)
    return st.AlterRole(
        text=f"ALTER ROLE {name} {masked}".rstrip(), position=where, name=name, options=options
    )
