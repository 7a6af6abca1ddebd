"""Where SQL statements end, without parsing them.

The shell needs two things from the text it collects: whether the input so far ends a
statement (a ``;`` outside quotes and comments), and which statements are ``SUBSCRIBE``s, which
go to their own streaming call. A small scanner that knows quoting ('...', "...", E'...',
$tag$...$tag$) and comments (``--``, ``/* */``) answers both; the adapter parses the SQL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DOLLAR_TAG = re.compile(r"\$([A-Za-z_][A-Za-z_0-9]*)?\$")
_LEADING_NOISE = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*", re.DOTALL)
_SUBSCRIBE = re.compile(r"subscribe\b", re.IGNORECASE)


@dataclass(frozen=True)
class Statement:
    text: str
    """The statement as written, without its terminating ``;``."""
    complete: bool
    """Whether a ``;`` ended it (the last statement of some input may lack one)."""
    end: int
    """Where it ends in the input: just after its ``;``, or the input's length."""


def _skip_quoted(sql: str, start: int, quote: str, backslash_escapes: bool) -> int:
    """The index after the quoted run opened at ``start`` (len(sql) if it never closes)."""
    i = start + 1
    while i < len(sql):
        char = sql[i]
        if backslash_escapes and char == "\\":
            i += 2
            continue
        if char == quote:
            # A doubled quote is an escaped quote, not the end.
            if i + 1 < len(sql) and sql[i + 1] == quote:
                i += 2
                continue
            return i + 1
        i += 1
    return len(sql)


def _skip_block_comment(sql: str, start: int) -> int:
    depth = 0
    i = start
    while i < len(sql):
        if sql.startswith("/*", i):
            depth += 1
            i += 2
        elif sql.startswith("*/", i):
            depth -= 1
            i += 2
            if depth == 0:
                return i
        else:
            i += 1
    return len(sql)


def split_statements(sql: str) -> list[Statement]:
    """The statements of ``sql`` in order; blank ones (only whitespace and comments) are left
    out. An unterminated quote or comment runs to the end of the input."""
    statements: list[Statement] = []
    start = 0
    i = 0
    while i < len(sql):
        char = sql[i]
        if char == "'":
            escaped = i > 0 and sql[i - 1] in "eE" and (i < 2 or not sql[i - 2].isalnum())
            i = _skip_quoted(sql, i, "'", escaped)
        elif char == '"':
            i = _skip_quoted(sql, i, '"', False)
        elif sql.startswith("--", i):
            newline = sql.find("\n", i)
            i = len(sql) if newline < 0 else newline + 1
        elif sql.startswith("/*", i):
            i = _skip_block_comment(sql, i)
        elif char == "$" and (match := _DOLLAR_TAG.match(sql, i)):
            end = sql.find(match.group(0), match.end())
            i = len(sql) if end < 0 else end + len(match.group(0))
        elif char == ";":
            i += 1
            _add(statements, sql[start : i - 1], complete=True, end=i)
            start = i
        else:
            i += 1
    _add(statements, sql[start:], complete=False, end=len(sql))
    return statements


def _add(statements: list[Statement], text: str, *, complete: bool, end: int) -> None:
    if strip_leading_noise(text):
        statements.append(Statement(text, complete, end))


def strip_leading_noise(text: str) -> str:
    """``text`` without the whitespace and comments it starts with."""
    match = _LEADING_NOISE.match(text)
    return text[match.end() if match else 0 :].rstrip()


def split_complete(buffer: str) -> tuple[str, str]:
    """``buffer`` as the part that ends with its last terminated statement (ready to run) and
    the rest (still being typed)."""
    ends = [s.end for s in split_statements(buffer) if s.complete]
    cut = ends[-1] if ends else 0
    return buffer[:cut], buffer[cut:]


def is_complete(buffer: str) -> bool:
    """Whether the input collected so far ends with a terminated statement (or is blank), so
    the shell runs it instead of reading another line."""
    statements = split_statements(buffer)
    return not statements or statements[-1].complete


def is_subscribe(statement: str) -> bool:
    return _SUBSCRIBE.match(strip_leading_noise(statement)) is not None
