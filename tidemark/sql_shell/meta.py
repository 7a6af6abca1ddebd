"""Backslash commands: ``\\d`` and friends become ``SHOW`` statements; ``\\q``, ``\\?`` and
``\\timing`` act on the shell itself."""

from __future__ import annotations

import enum
import shlex
from dataclasses import dataclass
from typing import Protocol

from tidemark.clients.adapter import Column, StatementResult
from tidemark.sql_shell.client import SqlConnection
from tidemark.sql_shell.render import render_error, render_result

# SHOW statements a listing uses; the relation kinds \d lists together, in this order.
RELATION_LISTINGS: tuple[tuple[str, str], ...] = (
    ("table", "SHOW TABLES"),
    ("source", "SHOW SOURCES"),
    ("view", "SHOW VIEWS"),
    ("materialized view", "SHOW MATERIALIZED VIEWS"),
)
LISTING_FOR: dict[str, str] = {
    "dt": "SHOW TABLES",
    "dv": "SHOW VIEWS",
    "dm": "SHOW MATERIALIZED VIEWS",
    "di": "SHOW INDEXES",
    "l": "SHOW DATABASES",
}
# Errors meaning "this adapter has no such listing": \d leaves that kind out.
UNSUPPORTED_SQLSTATES = frozenset({"0A000", "42601"})

HELP = """\
  \\d             list tables, sources, views and materialized views
  \\d NAME        describe NAME's columns
  \\dt \\dv \\dm    list tables, views, materialized views
  \\di            list indexes
  \\l             list databases
  \\timing [on|off]  show how long each statement takes
  \\?             this help
  \\q             quit
End a statement with ; to run it. SUBSCRIBE streams changes until Ctrl-C."""


class Outcome(enum.Enum):
    OK = "ok"
    FAILED = "failed"
    QUIT = "quit"


@dataclass(frozen=True)
class MetaCommand:
    name: str
    """Without the backslash: ``d``, ``dt``, ``timing``, ..."""
    args: tuple[str, ...] = ()


class MetaContext(Protocol):
    """The shell, as the commands see it."""

    connection: SqlConnection
    timing: bool
    null: str

    def run_sql(self, sql: str) -> bool: ...

    def write(self, text: str) -> None: ...

    def write_error(self, text: str) -> None: ...


def parse_meta(line: str) -> MetaCommand:
    """``\\d  foo`` -> ``MetaCommand("d", ("foo",))``. Arguments split like a shell's, so a
    quoted name keeps its spaces; double quotes are kept for SQL identifiers."""
    body = line.strip().removeprefix("\\")
    name, _, rest = body.partition(" ")
    name = name.rstrip(";")
    try:
        lexer = shlex.shlex(rest, posix=False)
        lexer.whitespace_split = True
        args = tuple(a.rstrip(";") for a in lexer if a.rstrip(";"))
    except ValueError:  # an unclosed quote: take the rest as it is
        args = (rest.strip(),) if rest.strip() else ()
    return MetaCommand(name, args)


def run_meta(line: str, shell: MetaContext) -> Outcome:
    command = parse_meta(line)
    name, args = command.name, command.args
    if name in ("q", "quit"):
        return Outcome.QUIT
    if name in ("?", "h", "help"):
        shell.write(HELP)
        return Outcome.OK
    if name == "timing":
        return _set_timing(args, shell)
    if name == "d" and args:
        return _ok(shell.run_sql(f"SHOW COLUMNS FROM {args[0]}"))
    if name == "d":
        return list_relations(shell)
    if name in LISTING_FOR:
        return _ok(shell.run_sql(LISTING_FOR[name]))
    shell.write_error(f"invalid command \\{name}; try \\? for help")
    return Outcome.FAILED


def _ok(succeeded: bool) -> Outcome:
    return Outcome.OK if succeeded else Outcome.FAILED


def _set_timing(args: tuple[str, ...], shell: MetaContext) -> Outcome:
    if not args:
        shell.timing = not shell.timing
    elif args[0].lower() in ("on", "off"):
        shell.timing = args[0].lower() == "on"
    else:
        shell.write_error(f"\\timing: unrecognized value {args[0]!r}; expected on or off")
        return Outcome.FAILED
    shell.write(f"Timing is {'on' if shell.timing else 'off'}.")
    return Outcome.OK


def list_relations(shell: MetaContext) -> Outcome:
    """One table of every relation, by kind: what ``\\d`` prints."""
    rows: list[tuple[str, str]] = []
    for kind, sql in RELATION_LISTINGS:
        result = shell.connection.execute(sql)
        error = result.error
        if error is not None:
            if error.code in UNSUPPORTED_SQLSTATES:
                continue
            shell.write_error(render_error(error, sql))
            return Outcome.FAILED
        for statement in result.results:
            # The first column of a SHOW listing is the name.
            rows.extend((str(row[0]), _kind_of(kind, row)) for row in statement.rows if row)
    if not rows:
        shell.write("Did not find any relations.")
        return Outcome.OK
    listing = StatementResult(
        tag=f"SELECT {len(rows)}",
        columns=[Column("name", "text"), Column("type", "text")],
        rows=[row for row in sorted(rows)],
    )
    shell.write(render_result(listing, shell.null))
    return Outcome.OK


def _kind_of(kind: str, row: tuple[object, ...]) -> str:
    """A listed relation's kind; SHOW SOURCES tells a source's subsources and progress
    relation apart in its second column."""
    if kind == "source" and len(row) > 1 and row[1] in ("subsource", "progress"):
        return str(row[1])
    return kind
