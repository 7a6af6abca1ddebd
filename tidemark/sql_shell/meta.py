"""Backslash commands: ``\\d`` and friends become ``SHOW`` statements; ``\\q``, ``\\?`` and
``\\timing`` act on the shell itself."""

from __future__ import annotations

import enum
import re
import shlex
import sys
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
    if re.match(r"\s*\\copy\b", line, re.IGNORECASE):
        return _ok(run_copy(line.strip().removeprefix("\\")[4:].strip().rstrip(";"), shell))
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


_COPY_DIRECTION = re.compile(
    r"\s+(?P<direction>FROM|TO)\s+(?P<file>'(?:[^']|'')*'|\"[^\"]*\"|\S+)(?P<rest>.*)$",
    re.IGNORECASE | re.DOTALL,
)
# Bytes per message of a COPY FROM's data.
COPY_CHUNK_BYTES = 1 << 20


def _copy_target(text: str) -> int:
    """Where ``\\copy``'s table or parenthesized query ends."""
    if not text.startswith("("):
        match = re.match(r"(?:\"[^\"]*\"|[^\s(])+(?:\s*\([^)]*\))?", text)
        return match.end() if match else 0
    depth = 0
    quote = ""
    for index, char in enumerate(text):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return index + 1
    return len(text)


def run_copy(text: str, shell: MetaContext) -> bool:
    """``\\copy``: COPY with the file on the shell's side of the connection."""
    end = _copy_target(text)
    found = _COPY_DIRECTION.match(text, end) if end else None
    if found is None:
        shell.write_error("\\copy: expected TABLE [(COLUMNS)] FROM|TO 'FILE' [OPTIONS]")
        return False
    target, rest = text[:end], found.group("rest")
    file = found.group("file")
    if file.startswith("'"):
        file = file[1:-1].replace("''", "'")
    elif file.startswith('"'):
        file = file[1:-1]
    to_standard = file.lower() in ("stdin", "stdout", "pstdin", "pstdout")
    if found.group("direction").upper() == "FROM":
        return _copy_from(f"COPY {target} FROM STDIN{rest}", None if to_standard else file, shell)
    return _copy_to(f"COPY {target} TO STDOUT{rest}", None if to_standard else file, shell)


def _copy_from(sql: str, path: str | None, shell: MetaContext) -> bool:
    try:
        source = sys.stdin.buffer if path is None else open(path, "rb")
    except OSError as exc:
        shell.write_error(f"{path}: {exc.strerror or exc}")
        return False
    with source:
        chunks = iter(lambda: source.read(COPY_CHUNK_BYTES), b"")
        result = shell.connection.copy_in(sql, chunks)
    return _report(result, sql, shell)


def _copy_to(sql: str, path: str | None, shell: MetaContext) -> bool:
    chunks, result = shell.connection.copy_out(sql)
    if result.error is None:
        try:
            if path is None:
                shell.write(b"".join(chunks).decode().rstrip("\n"))
            else:
                with open(path, "wb") as sink:
                    sink.writelines(chunks)
        except OSError as exc:
            shell.write_error(f"{path}: {exc.strerror or exc}")
            return False
    return _report(result, sql, shell)


def _report(result: StatementResult, sql: str, shell: MetaContext) -> bool:
    if result.error is not None:
        shell.write_error(render_error(result.error, sql))
        return False
    shell.write(result.tag)
    return True


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
