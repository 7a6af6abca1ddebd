"""A COPY's options, checked: the format and how it spells delimiters, NULLs and quotes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from services.adapter.sql.errors import SYNTAX_ERROR, SqlError
from services.adapter.sql.statements import CopyOption

FormatKind = Literal["text", "csv", "parquet"]
FEATURE_NOT_SUPPORTED = "0A000"
INVALID_PARAMETER_VALUE = "22023"

_BOOL_WORDS = {"true": True, "on": True, "1": True, "false": False, "off": False, "0": False}


@dataclass(frozen=True)
class CopyFormat:
    kind: FormatKind
    delimiter: str = "\t"
    null: str = "\\N"
    header: bool = False
    quote: str = '"'
    escape: str = '"'


def copy_format(
    options: Sequence[CopyOption], *, location: str | None = None, reading: bool = True
) -> CopyFormat:
    """The format ``options`` ask for (PostgreSQL's defaults otherwise); a file's format
    follows its extension when FORMAT is not given."""
    given: dict[str, CopyOption] = {}
    for option in options:
        if option.name in given:
            raise SqlError(SYNTAX_ERROR, "conflicting or redundant options", option.position)
        given[option.name] = option
    unknown = set(given) - {"format", "delimiter", "null", "header", "quote", "escape", "encoding"}
    for name in sorted(unknown, key=lambda n: given[n].position):
        raise SqlError(SYNTAX_ERROR, f'option "{name}" not recognized', given[name].position)
    kind = _kind(given.get("format"), location)
    if "encoding" in given:
        encoding = (given["encoding"].value or "").lower().replace("-", "").replace("_", "")
        if encoding not in ("utf8", "unicode"):
            raise SqlError(
                FEATURE_NOT_SUPPORTED,
                "COPY reads and writes UTF8 only",
                given["encoding"].position,
            )
    if kind == "parquet":
        for name in ("delimiter", "null", "header", "quote", "escape"):
            if name in given:
                raise SqlError(
                    SYNTAX_ERROR,
                    f"COPY {name.upper()} is not available with FORMAT parquet",
                    given[name].position,
                )
        return CopyFormat("parquet")
    csv = kind == "csv"
    delimiter = _char(given.get("delimiter"), "," if csv else "\t", "delimiter")
    quote = _char(given.get("quote"), '"', "quote")
    escape = _char(given.get("escape"), quote, "escape")
    if not csv:
        for name in ("quote", "escape"):
            if name in given:
                raise SqlError(
                    FEATURE_NOT_SUPPORTED,
                    f"COPY {name} available only in CSV mode",
                    given[name].position,
                )
    null = given["null"].value if "null" in given else ("" if csv else "\\N")
    if null is None:
        raise SqlError(SYNTAX_ERROR, "NULL takes a string", given["null"].position)
    header = _header(given.get("header"))
    if header and not csv:
        raise SqlError(
            FEATURE_NOT_SUPPORTED,
            "COPY HEADER available only in CSV mode",
            given["header"].position,
        )
    if delimiter in ("\r", "\n") or (not csv and delimiter == "\\"):
        raise SqlError(
            INVALID_PARAMETER_VALUE,
            "COPY delimiter cannot be newline, carriage return or (in text format) backslash",
            given["delimiter"].position if "delimiter" in given else 0,
        )
    if csv and delimiter == quote:
        raise SqlError(INVALID_PARAMETER_VALUE, "COPY delimiter and quote must be different")
    if delimiter in null:
        raise SqlError(
            INVALID_PARAMETER_VALUE, "COPY delimiter must not appear in the NULL specification"
        )
    return CopyFormat(kind, delimiter, null, header, quote, escape)


def _kind(option: CopyOption | None, location: str | None) -> FormatKind:
    if option is None:
        path = (location or "").split("?", 1)[0].lower()
        if path.endswith(".parquet"):
            return "parquet"
        if path.endswith(".csv"):
            return "csv"
        return "text"
    value = (option.value or "").lower()
    if value in ("text", "csv", "parquet"):
        return value  # type: ignore[return-value]
    if value == "binary":
        raise SqlError(
            FEATURE_NOT_SUPPORTED,
            "COPY FORMAT binary is not supported",
            option.position,
            hint="use text, csv or parquet",
        )
    raise SqlError(
        INVALID_PARAMETER_VALUE, f'COPY format "{value}" not recognized', option.position
    )


def _char(option: CopyOption | None, default: str, what: str) -> str:
    if option is None:
        return default
    value = option.value or ""
    if len(value) != 1 or len(value.encode()) != 1:
        raise SqlError(
            FEATURE_NOT_SUPPORTED,
            f"COPY {what} must be a single one-byte character",
            option.position,
        )
    return value


def _header(option: CopyOption | None) -> bool:
    if option is None:
        return False
    if option.value is None:
        return True
    value = _BOOL_WORDS.get(option.value.lower())
    if value is None:
        raise SqlError(INVALID_PARAMETER_VALUE, "header requires a Boolean value", option.position)
    return value
