"""``$n`` placeholders of an extended-protocol statement, found outside string literals, quoted
identifiers, comments and dollar-quoted strings, and replaced by literals.

The adapter parses SQL text, so a bound statement is its text with each ``$n`` replaced by the
parameter's SQL literal (``pgtypes.sql_literal``: quotes doubled, typed where the client gave a
type). Errors the adapter reports point into that text; ``PositionMap`` moves them back into
the text the client sent.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

_DOLLAR_TAG = re.compile(r"\$([A-Za-z_][A-Za-z_0-9]*)?\$")
_PLACEHOLDER = re.compile(r"\$([0-9]+)")


def placeholders(sql: str) -> list[tuple[int, int, int]]:
    """``(start, end, n)`` of each ``$n`` in ``sql``, in order."""
    return [token for token in _scan(sql) if token[2] > 0]


def split_statements(sql: str) -> list[tuple[int, str]]:
    """The statements of ``sql`` at its top-level semicolons: ``(offset, text)`` of each one
    that is not blank."""
    pieces: list[tuple[int, str]] = []
    start = 0
    for position, _, n in _scan(sql):
        if n == 0:
            pieces.append((start, sql[start:position]))
            start = position + 1
    pieces.append((start, sql[start:]))
    return [(offset, text) for offset, text in pieces if text.strip()]


def _scan(sql: str) -> list[tuple[int, int, int]]:
    """``$n`` placeholders (n > 0) and semicolons (n = 0) outside quotes and comments."""
    found: list[tuple[int, int, int]] = []
    i, size = 0, len(sql)
    while i < size:
        ch = sql[i]
        if ch == "'":
            escapes = i > 0 and sql[i - 1] in "eE" and (i < 2 or not sql[i - 2].isalnum())
            i = _skip_string(sql, i + 1, escapes)
        elif ch == '"':
            end = sql.find('"', i + 1)
            i = size if end < 0 else end + 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            i = size if end < 0 else end + 1
        elif sql.startswith("/*", i):
            i = _skip_block_comment(sql, i)
        elif ch == ";":
            found.append((i, i + 1, 0))
            i += 1
        elif ch == "$":
            number = _PLACEHOLDER.match(sql, i)
            if number and (i == 0 or not (sql[i - 1].isalnum() or sql[i - 1] == "_")):
                found.append((i, number.end(), int(number[1])))
                i = number.end()
                continue
            tag = _DOLLAR_TAG.match(sql, i)
            if tag and (i == 0 or not (sql[i - 1].isalnum() or sql[i - 1] == "_")):
                end = sql.find(tag[0], tag.end())
                i = size if end < 0 else end + len(tag[0])
            else:
                i += 1
        else:
            i += 1
    return found


def _skip_string(sql: str, i: int, escapes: bool) -> int:
    size = len(sql)
    while i < size:
        ch = sql[i]
        if escapes and ch == "\\":
            i += 2
            continue
        if ch == "'":
            if i + 1 < size and sql[i + 1] == "'":
                i += 2
                continue
            return i + 1
        i += 1
    return size


def _skip_block_comment(sql: str, i: int) -> int:
    depth, i, size = 0, i, len(sql)
    while i < size:
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
    return size


def parameter_count(sql: str) -> int:
    """The highest ``$n`` in ``sql`` (the statement's number of parameters)."""
    return max((n for _, _, n in placeholders(sql)), default=0)


@dataclass
class PositionMap:
    """Maps 1-based character positions in substituted text back to the original text."""

    # (start in the new text, end in the new text, start in the original, original length)
    spans: list[tuple[int, int, int, int]] = field(default_factory=list)

    def original(self, position: int) -> int:
        if position <= 0:
            return position
        offset = position - 1
        shift = 0
        for new_start, new_end, old_start, old_len in self.spans:
            if offset < new_start:
                break
            if offset < new_end:
                return old_start + 1
            shift += (new_end - new_start) - old_len
        return offset - shift + 1


def substitute(sql: str, literals: Sequence[str]) -> tuple[str, PositionMap]:
    """``sql`` with ``$n`` replaced by ``literals[n - 1]`` (``IndexError`` past the end)."""
    out: list[str] = []
    mapping = PositionMap()
    last = 0
    length = 0
    for start, end, n in placeholders(sql):
        if n < 1 or n > len(literals):
            raise IndexError(n)
        out.append(sql[last:start])
        length += start - last
        literal = literals[n - 1]
        mapping.spans.append((length, length + len(literal), start, end - start))
        out.append(literal)
        length += len(literal)
        last = end
    out.append(sql[last:])
    return "".join(out), mapping
