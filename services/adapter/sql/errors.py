"""SQL errors as a client sees them: an SQLSTATE code, a message, a position and a hint.

Everything in :mod:`services.adapter.sql` reports a problem with a statement by raising
:class:`SqlError`; the adapter copies it into ``StatementResult.error`` (``adapter.proto``).
"""

from __future__ import annotations

SYNTAX_ERROR = "42601"
UNDEFINED_TABLE = "42P01"
UNDEFINED_COLUMN = "42703"
AMBIGUOUS_COLUMN = "42702"
DUPLICATE_COLUMN = "42701"
GROUPING_ERROR = "42803"
DATATYPE_MISMATCH = "42804"
UNDEFINED_FUNCTION = "42883"
UNDEFINED_OBJECT = "42704"
RESERVED_NAME = "42939"
INSUFFICIENT_PRIVILEGE = "42501"
WRONG_OBJECT_TYPE = "42809"
INVALID_TEXT_REPRESENTATION = "22P02"
NUMERIC_VALUE_OUT_OF_RANGE = "22003"
NOT_NULL_VIOLATION = "23502"
NOT_SUPPORTED = "0A000"
DUPLICATE_OBJECT = "42P07"
UNDEFINED_DATABASE = "3D000"
UNDEFINED_SCHEMA = "3F000"
INVALID_PARAMETER = "22023"


class SqlError(Exception):
    """A statement the adapter rejects. ``position`` is the 1-based character offset in the
    request's SQL (0 when unknown)."""

    def __init__(self, code: str, message: str, position: int = 0, hint: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.position = position
        self.hint = hint

    def __str__(self) -> str:
        where = f" at position {self.position}" if self.position else ""
        return f"{self.code}: {self.message}{where}"

    def at(self, position: int) -> SqlError:
        """This error, given ``position`` if it has none yet."""
        if not self.position and position:
            self.position = position
        return self


def not_supported(what: str, position: int = 0, hint: str = "") -> SqlError:
    return SqlError(NOT_SUPPORTED, f"{what} is not supported", position, hint)
