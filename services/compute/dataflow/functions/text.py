"""Text functions. Strings are indexed by code point, which is what Python's ``str`` does."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable


def lower(s: str) -> str:
    return s.lower()


def upper(s: str) -> str:
    return s.upper()


def trim(s: str) -> str:
    return s.strip(" ")


def length(s: str) -> int:
    return len(s)


def substr(s: str, start: int, count: int | None = None) -> str | None:
    """Code points ``start .. start+count-1`` counting from 1, clipped to ``s``: positions before
    the first still use up ``count`` (PostgreSQL's rule)."""
    begin = start - 1
    if count is None:
        return s[max(begin, 0) :]
    if count < 0:
        return None
    end = begin + count
    if end <= 0:
        return ""
    return s[max(begin, 0) : end]


def concat(*parts: str) -> str:
    return "".join(parts)


@functools.lru_cache(maxsize=256)
def like_matcher(pattern: str) -> Callable[[str], bool]:
    """A test of whether a whole string matches ``pattern`` (``%`` any run, ``_`` one code
    point, everything else itself; no escape character)."""
    pieces = []
    for ch in pattern:
        if ch == "%":
            pieces.append(".*")
        elif ch == "_":
            pieces.append(".")
        else:
            pieces.append(re.escape(ch))
    compiled = re.compile("".join(pieces), re.DOTALL)

    def matches(s: str) -> bool:
        return compiled.fullmatch(s) is not None

    return matches


def like(s: str, pattern: str) -> bool:
    return like_matcher(pattern)(s)
