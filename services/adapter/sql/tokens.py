"""Tokens of a request and a cursor over one statement's tokens.

The whole request is tokenized once with sqlglot's PostgreSQL tokenizer, so every token (and
every tree sqlglot later builds from a slice of them) knows its offset in the request. The
stock tokenizer swallows the rest of a statement after SHOW or EXPLAIN into one string; ours
does not, since Tidemark parses those statements itself.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar

from sqlglot import exp
from sqlglot.dialects.postgres import Postgres
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType  # type: ignore[attr-defined]

from services.adapter.sql.errors import SYNTAX_ERROR, SqlError

_DIALECT = Postgres()
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
# Tokens that are values or quoted names, never keywords.
_NOT_WORDS = {
    TokenType.IDENTIFIER,
    TokenType.STRING,
    TokenType.NUMBER,
    TokenType.HEREDOC_STRING,
    TokenType.NATIONAL_STRING,
    TokenType.BIT_STRING,
    TokenType.HEX_STRING,
    TokenType.BYTE_STRING,
}


class _Tokenizer(Postgres.Tokenizer):  # type: ignore[misc]
    COMMANDS: ClassVar[set[TokenType]] = set()


def tokenize(sql: str) -> list[Token]:
    tokenizer = _Tokenizer(dialect=_DIALECT)
    try:
        return list(tokenizer.tokenize(sql))
    except TokenError as exc:
        # The failure is in the first thing after the last token read (an unterminated
        # string or quoted name, typically).
        done = tokenizer.tokens[-1].end + 1 if tokenizer.tokens else 0
        rest = sql[done:]
        where = done + (len(rest) - len(rest.lstrip())) + 1
        cause = str(exc.__cause__ or exc)
        raise SqlError(SYNTAX_ERROR, f"syntax error: {cause}", min(where, len(sql))) from None


def line_col_offset(sql: str, line: int, col: int) -> int:
    """The 1-based offset of 1-based ``line``/``col`` in ``sql``."""
    offset = 0
    for _ in range(line - 1):
        newline = sql.find("\n", offset)
        if newline < 0:
            break
        offset = newline + 1
    return min(offset + col, len(sql)) if sql else 0


def split_statements(tokens: Sequence[Token]) -> list[list[Token]]:
    """The tokens of each statement; empty statements (``;;``) are dropped."""
    statements: list[list[Token]] = []
    current: list[Token] = []
    for token in tokens:
        if token.token_type is TokenType.SEMICOLON:
            if current:
                statements.append(current)
            current = []
        else:
            current.append(token)
    if current:
        statements.append(current)
    return statements


def is_word(token: Token | None, *words: str) -> bool:
    """Whether ``token`` is an unquoted word (or a keyword of several, like "PRIMARY KEY"),
    and one of ``words`` if any are given."""
    if token is None or token.token_type in _NOT_WORDS:
        return False
    parts = token.text.upper().split()
    if not parts or not all(_WORD.fullmatch(part) for part in parts):
        return False
    return not words or " ".join(parts) in words


def is_name(token: Token | None) -> bool:
    """Whether ``token`` can be an unquoted name: one word."""
    return is_word(token) and token is not None and _WORD.fullmatch(token.text) is not None


def parse_expressions(sql: str, tokens: Sequence[Token]) -> exp.Expr:
    """One sqlglot tree from a slice of a request's tokens (SqlError 42601 when they are not
    one valid statement or expression)."""
    if not tokens:
        raise SqlError(SYNTAX_ERROR, "syntax error at end of input", len(sql))
    try:
        trees = _DIALECT.parser().parse(list(tokens), sql)
    except ParseError as exc:
        raise SqlError(
            SYNTAX_ERROR, _parse_error_message(exc), _parse_error_position(sql, exc, tokens)
        ) from None
    found = [tree for tree in trees if tree is not None]
    if len(found) != 1 or isinstance(found[0], exp.Command):
        raise SqlError(
            SYNTAX_ERROR, f'syntax error at or near "{tokens[0].text}"', tokens[0].start + 1
        )
    return found[0]


_TOKEN_REPR = re.compile(r"<Token token_type: TokenType\.(\w+), text: (.*?), line: [^>]*>")


def _parse_error_message(exc: ParseError) -> str:
    if exc.errors:
        first = exc.errors[0]
        near = first.get("highlight") or ""
        description = str(first.get("description") or "syntax error")
    else:
        near, description = "", str(exc).splitlines()[0]
    description = _TOKEN_REPR.sub(
        lambda m: "end of input" if m.group(1) == "SENTINEL" else f'"{m.group(2)}"', description
    )
    return f'syntax error at or near "{near}": {description}' if near else description


def _parse_error_position(sql: str, exc: ParseError, tokens: Sequence[Token]) -> int:
    if not exc.errors:
        return tokens[0].start + 1
    line, col = exc.errors[0].get("line"), exc.errors[0].get("col")
    if not isinstance(line, int) or not isinstance(col, int):
        return tokens[0].start + 1
    # sqlglot reports the line and column of the last character of the offending token.
    for token in tokens:
        if token.line == line and token.col == col:
            return token.start + 1
    return line_col_offset(sql, line, col)


class Cursor:
    """Reads one statement's tokens front to back."""

    def __init__(self, sql: str, tokens: Sequence[Token]) -> None:
        self.sql = sql
        self.tokens = list(tokens)
        self.index = 0

    def peek(self, ahead: int = 0) -> Token | None:
        at = self.index + ahead
        return self.tokens[at] if at < len(self.tokens) else None

    @property
    def at_end(self) -> bool:
        return self.index >= len(self.tokens)

    def next(self) -> Token:
        token = self.peek()
        if token is None:
            raise self.error("syntax error at end of input")
        self.index += 1
        return token

    def position(self) -> int:
        token = self.peek()
        if token is None:
            return len(self.sql) + 1 if not self.tokens else self.tokens[-1].end + 2
        return token.start + 1

    def error(self, message: str | None = None) -> SqlError:
        token = self.peek()
        if message is None:
            message = (
                "syntax error at end of input"
                if token is None
                else f'syntax error at or near "{token.text}"'
            )
        return SqlError(SYNTAX_ERROR, message, self.position())

    def at_words(self, *words: str) -> bool:
        """Whether the next tokens are these words, in order."""
        return all(is_word(self.peek(i), word) for i, word in enumerate(words))

    def accept(self, *words: str) -> bool:
        """Consumes the words if the next tokens are exactly them."""
        if self.at_words(*words):
            self.index += len(words)
            return True
        return False

    def expect(self, *words: str) -> None:
        if not self.accept(*words):
            raise self.error(f"syntax error at or near {self._near()}: expected {' '.join(words)}")

    def accept_type(self, token_type: TokenType) -> Token | None:
        token = self.peek()
        if token is not None and token.token_type is token_type:
            self.index += 1
            return token
        return None

    def expect_type(self, token_type: TokenType, what: str) -> Token:
        token = self.accept_type(token_type)
        if token is None:
            raise self.error(f"syntax error at or near {self._near()}: expected {what}")
        return token

    def _near(self) -> str:
        token = self.peek()
        return "end of input" if token is None else f'"{token.text}"'

    def identifier(self, what: str = "a name") -> str:
        token = self.peek()
        if token is not None and token.token_type is TokenType.IDENTIFIER:
            self.index += 1
            return str(token.text)
        if is_name(token):
            assert token is not None
            self.index += 1
            return str(token.text).lower()
        raise self.error(f"syntax error at or near {self._near()}: expected {what}")

    def qualified_name(self, what: str = "a name") -> tuple[str, ...]:
        parts = [self.identifier(what)]
        while self.accept_type(TokenType.DOT):
            parts.append(self.identifier(what))
        if len(parts) > 3:
            raise SqlError(
                SYNTAX_ERROR, f"improper qualified name (too many dotted names): {'.'.join(parts)}"
            )
        return tuple(parts)

    def rest(self) -> list[Token]:
        """The tokens not read yet (and moves to the end)."""
        remaining = self.tokens[self.index :]
        self.index = len(self.tokens)
        return remaining

    def expect_end(self) -> None:
        if not self.at_end:
            raise self.error()

    def text_between(self, first: Token, last: Token) -> str:
        return self.sql[first.start : last.end + 1]

    def parenthesized(self) -> list[Token]:
        """The tokens inside a balanced ``( ... )`` that starts here (the parentheses read)."""
        self.expect_type(TokenType.L_PAREN, '"("')
        depth = 1
        inside: list[Token] = []
        while True:
            token = self.next()
            if token.token_type is TokenType.L_PAREN:
                depth += 1
            elif token.token_type is TokenType.R_PAREN:
                depth -= 1
                if depth == 0:
                    return inside
            inside.append(token)


def split_top_level(
    tokens: Sequence[Token], separator: TokenType = TokenType.COMMA
) -> list[list[Token]]:
    """``tokens`` cut at separators outside parentheses."""
    parts: list[list[Token]] = [[]]
    depth = 0
    for token in tokens:
        if token.token_type is TokenType.L_PAREN:
            depth += 1
        elif token.token_type is TokenType.R_PAREN:
            depth -= 1
        if token.token_type is separator and depth == 0:
            parts.append([])
        else:
            parts[-1].append(token)
    return parts
