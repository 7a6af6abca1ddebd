"""``tidemark sql``: statement splitting, rendering, backslash commands, the REPL loop and the
command line, against a fake connection."""

from __future__ import annotations

import datetime
import io
import readline
from collections.abc import Callable, Iterable, Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from tidemark import cli
from tidemark.clients.adapter import (
    Change,
    Changes,
    Column,
    ExecuteResult,
    Progress,
    StatementError,
    StatementProgress,
    StatementResult,
    SubscribeError,
    SubscribeEvent,
    SubscribeHeader,
)
from tidemark.errors import Unavailable
from tidemark.sql_shell import repl
from tidemark.sql_shell.meta import Outcome, parse_meta, run_meta
from tidemark.sql_shell.render import (
    format_value,
    render_change,
    render_error,
    render_result,
    render_table,
)
from tidemark.sql_shell.repl import Shell
from tidemark.sql_shell.statements import is_complete, is_subscribe, split_statements
from tidemark.v1 import adapter_pb2

# -- statements -------------------------------------------------------------------------------


def test_split_statements_ignores_semicolons_in_quotes_and_comments() -> None:
    sql = (
        "INSERT INTO t VALUES ('a;b', \"c;d\"); -- x; y\n"
        "SELECT $$;$$, $q$ ; $q$, E'\\';' /* ; /* ; */ ; */ ;"
        "  SELECT 3"
    )
    statements = split_statements(sql)
    assert [s.text.strip() for s in statements] == [
        "INSERT INTO t VALUES ('a;b', \"c;d\")",
        "-- x; y\nSELECT $$;$$, $q$ ; $q$, E'\\';' /* ; /* ; */ ; */",
        "SELECT 3",
    ]
    assert [s.complete for s in statements] == [True, True, False]


def test_doubled_quotes_stay_inside_the_string() -> None:
    assert [s.text for s in split_statements("SELECT 'it''s;'; SELECT 2;")] == [
        "SELECT 'it''s;'",
        " SELECT 2",
    ]


@pytest.mark.parametrize(
    ("buffer", "complete"),
    [
        ("", True),
        ("   \n", True),
        ("SELECT 1", False),
        ("SELECT 1;", True),
        ("SELECT 1;\n", True),
        ("SELECT 1; -- done\n", True),
        ("SELECT 'a;", False),
        ("SELECT 1 /* ; */", False),
        ("SELECT 1; SELECT", False),
    ],
)
def test_is_complete(buffer: str, complete: bool) -> None:
    assert is_complete(buffer) is complete


@pytest.mark.parametrize(
    ("statement", "expected"),
    [
        ("SUBSCRIBE v", True),
        ("  subscribe TO (SELECT 1)", True),
        ("-- watch\n/* it */ Subscribe v", True),
        ("SELECT 'SUBSCRIBE'", False),
        ("SUBSCRIBER", False),
    ],
)
def test_is_subscribe(statement: str, expected: bool) -> None:
    assert is_subscribe(statement) is expected


# -- rendering --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, ""),
        (True, "t"),
        (False, "f"),
        (42, "42"),
        (-1.5, "-1.5"),
        (float("inf"), "Infinity"),
        (float("nan"), "NaN"),
        (Decimal("1E+2"), "100"),
        (Decimal("3.10"), "3.10"),
        (b"\x01\xab", "\\x01ab"),
        (datetime.date(2024, 1, 2), "2024-01-02"),
        (datetime.datetime(2024, 1, 2, 3, 4, 5, 600000), "2024-01-02 03:04:05.600000"),
        ('{"a": 1}', '{"a": 1}'),
    ],
)
def test_format_value(value: object, text: str) -> None:
    assert format_value(value, "") == text  # type: ignore[arg-type]


def test_render_table_aligns_like_psql() -> None:
    columns = [Column("customer", "text"), Column("total", "numeric(10,2)"), Column("n", "bigint")]
    rows = [("ada", Decimal("19.75"), 2), ("bob", Decimal("3.00"), 11), (None, None, None)]
    assert render_table(columns, rows, null="∅") == (
        " customer | total | n\n"
        "----------+-------+----\n"
        " ada      | 19.75 |  2\n"
        " bob      |  3.00 | 11\n"
        " ∅        |     ∅ |  ∅\n"
        "(3 rows)"
    )


def test_render_table_one_row_and_no_rows() -> None:
    columns = [Column("a", "text")]
    assert render_table(columns, [("x",)]).splitlines()[-1] == "(1 row)"
    assert render_table(columns, []) == " a\n---\n(0 rows)"


def test_render_result_shows_the_tag_without_columns() -> None:
    assert render_result(StatementResult(tag="INSERT 0 3")) == "INSERT 0 3"


def test_render_error_points_at_the_position() -> None:
    sql = "SELECT 1;\nSELECT *\n  FROM nope"
    error = StatementError("42P01", 'unknown table "nope"', sql.index("nope") + 1, "create it")
    assert render_error(error, sql) == (
        'ERROR:  unknown table "nope" (SQLSTATE 42P01)\n'
        "LINE 3:   FROM nope\n"
        "               ^\n"
        "HINT:  create it"
    )
    # No position (or one outside the text): no LINE and no caret.
    assert render_error(StatementError("XX000", "boom"), sql) == "ERROR:  boom (SQLSTATE XX000)"
    assert render_error(StatementError("XX000", "boom", 999), sql).count("\n") == 0


def test_render_change() -> None:
    change = Change(17, -1, ("bob", Decimal("3.00"), None))
    assert render_change(change, "NULL") == "17 | -1 | bob | 3.00 | NULL"
    assert render_change(Change(18, 2, ())) == "18 | +2"


# -- a fake connection ------------------------------------------------------------------------


def rows_result(names: list[str], *rows: tuple[object, ...]) -> StatementResult:
    return StatementResult(
        tag=f"SELECT {len(rows)}",
        columns=[Column(name, "text") for name in names],
        rows=list(rows),  # type: ignore[arg-type]
    )


def failure(code: str, message: str, position: int = 0) -> StatementResult:
    return StatementResult(tag="", error=StatementError(code, message, position))


class FakeConnection:
    """Answers each SQL text from ``answers`` (a function of the text), and records it."""

    address = "fake:1"

    def __init__(
        self,
        answers: Callable[[str], list[StatementResult]],
        events: Callable[[], Iterator[SubscribeEvent]] | None = None,
    ) -> None:
        self.answers = answers
        self.events = events
        self.executed: list[str] = []
        self.subscribed: list[str] = []
        self.copied_in: list[tuple[str, bytes]] = []
        self.copied_out: list[str] = []
        self.closed = False

    def execute(self, sql: str, *, statement_id: str = "") -> ExecuteResult:
        self.executed.append(sql)
        return ExecuteResult(self.answers(sql), adapter_pb2.Session())

    def statement_progress(self, statement_id: str) -> StatementProgress | None:
        return None

    def subscribe(self, sql: str) -> Iterator[SubscribeEvent]:
        self.subscribed.append(sql)
        assert self.events is not None
        return self.events()

    def copy_in(self, sql: str, data: Iterable[bytes]) -> StatementResult:
        self.copied_in.append((sql, b"".join(data)))
        return self.answers(sql)[0]

    def copy_out(self, sql: str) -> tuple[list[bytes], StatementResult]:
        self.copied_out.append(sql)
        return [b"1,a\n", b"2,b\n"], self.answers(sql)[0]

    def close(self) -> None:
        self.closed = True


def tags(sql: str) -> list[StatementResult]:
    """One tag-only result per statement, named after its first word."""
    return [StatementResult(tag=s.text.split()[0].upper()) for s in split_statements(sql)]


def make_shell(connection: FakeConnection) -> tuple[Shell, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    return Shell(connection, out=out, err=err), out, err


# -- running SQL ------------------------------------------------------------------------------


def test_statements_go_in_one_call_until_a_subscribe() -> None:
    def events() -> Iterator[SubscribeEvent]:
        yield SubscribeHeader([Column("a", "bigint")], 5)
        yield Changes([Change(5, 1, (1,)), Change(5, 1, (2,))])
        yield Progress(6)
        yield Changes([Change(7, -1, (1,))])
        yield Progress(None)

    connection = FakeConnection(tags, events)
    shell, out, _ = make_shell(connection)
    assert shell.run_sql(
        "CREATE TABLE t (a bigint); INSERT INTO t VALUES (1), (2);\nSUBSCRIBE t; SELECT 1;"
    )
    assert connection.executed == [
        "CREATE TABLE t (a bigint); INSERT INTO t VALUES (1), (2)",
        " SELECT 1",
    ]
    assert connection.subscribed == ["\nSUBSCRIBE t"]
    assert out.getvalue().splitlines() == [
        "CREATE",
        "INSERT",
        "timestamp | diff | a",
        "5 | +1 | 1",
        "5 | +1 | 2",
        "7 | -1 | 1",
        "SELECT",
    ]


def test_an_error_stops_the_run_and_shows_the_caret() -> None:
    def answers(sql: str) -> list[StatementResult]:
        return [StatementResult(tag="SELECT 0"), failure("42601", "syntax error", 11)]

    connection = FakeConnection(answers)
    shell, out, err = make_shell(connection)
    assert not shell.run_sql("SELECT 1; SELEC 2; SUBSCRIBE t;")
    assert connection.subscribed == []  # nothing after the failed statement runs
    assert out.getvalue() == "SELECT 0\n"
    assert err.getvalue() == (
        "ERROR:  syntax error (SQLSTATE 42601)\nLINE 1: SELECT 1; SELEC 2\n                  ^\n"
    )


def test_notices_and_timing() -> None:
    connection = FakeConnection(lambda sql: [StatementResult(tag="DROP TABLE", notices=["gone"])])
    shell, out, err = make_shell(connection)
    shell.timing = True
    assert shell.run_sql("DROP TABLE t;")
    assert err.getvalue() == "NOTICE:  gone\n"
    lines = out.getvalue().splitlines()
    assert lines[0] == "DROP TABLE"
    assert lines[1].startswith("Time: ") and lines[1].endswith(" ms")


def test_a_transport_error_is_reported_not_raised() -> None:
    def answers(sql: str) -> list[StatementResult]:
        raise Unavailable("connection refused")

    shell, _, err = make_shell(FakeConnection(answers))
    assert not shell.run_sql("SELECT 1;")
    assert err.getvalue() == "error: connection refused (adapter at fake:1)\n"


def test_subscription_error_and_ctrl_c() -> None:
    def failing() -> Iterator[SubscribeEvent]:
        yield SubscribeError(StatementError("42P01", "no v", 11))

    shell, _, err = make_shell(FakeConnection(tags, failing))
    assert not shell.run_sql("SUBSCRIBE v")
    assert err.getvalue().startswith("ERROR:  no v (SQLSTATE 42P01)\nLINE 1: SUBSCRIBE v\n")

    closed: list[bool] = []

    def interrupted() -> Iterator[SubscribeEvent]:
        try:
            yield SubscribeHeader([Column("a", "bigint")], 1)
            raise KeyboardInterrupt
        finally:
            closed.append(True)

    shell, out, _ = make_shell(FakeConnection(tags, interrupted))
    # Ctrl-C is how a subscription is meant to end: a success, and the stream is closed.
    assert shell.run_sql("SUBSCRIBE v")
    assert out.getvalue() == "timestamp | diff | a\n"
    assert closed == [True]


# -- backslash commands -----------------------------------------------------------------------


def test_parse_meta() -> None:
    assert parse_meta("\\d") == parse_meta("\\d ")
    assert parse_meta("\\d  orders ").args == ("orders",)
    assert parse_meta('\\d "My Table";').args == ('"My Table"',)
    assert parse_meta("\\timing on").name == "timing"


def show_answers(sql: str) -> list[StatementResult]:
    listings = {
        "SHOW TABLES": rows_result(["name"], ("orders",), ("accounts",)),
        "SHOW VIEWS": rows_result(["name"]),
        "SHOW MATERIALIZED VIEWS": rows_result(["name", "cluster"], ("spend", "default")),
        "SHOW INDEXES": rows_result(["name", "on"], ("spend_idx", "spend")),
        "SHOW DATABASES": rows_result(["name"], ("tidemark",)),
        "SHOW COLUMNS FROM orders": rows_result(["name", "type"], ("id", "bigint")),
    }
    if sql in listings:
        return [listings[sql]]
    return [failure("0A000", f"{sql} is not supported")]


def test_d_lists_every_kind_of_relation_skipping_unsupported_listings() -> None:
    connection = FakeConnection(show_answers)
    shell, out, err = make_shell(connection)
    assert run_meta("\\d", shell) is Outcome.OK
    assert connection.executed == [
        "SHOW TABLES",
        "SHOW SOURCES",
        "SHOW VIEWS",
        "SHOW MATERIALIZED VIEWS",
    ]
    assert out.getvalue() == (
        "   name   |       type\n"
        "----------+-------------------\n"
        " accounts | table\n"
        " orders   | table\n"
        " spend    | materialized view\n"
        "(3 rows)\n\n"
    )
    assert err.getvalue() == ""


def test_d_reports_a_real_error() -> None:
    connection = FakeConnection(lambda sql: [failure("XX000", "catalog unavailable")])
    shell, _, err = make_shell(connection)
    assert run_meta("\\d", shell) is Outcome.FAILED
    assert err.getvalue() == "ERROR:  catalog unavailable (SQLSTATE XX000)\n"


@pytest.mark.parametrize(
    ("command", "sql", "first_row"),
    [
        ("\\dt", "SHOW TABLES", " orders"),
        ("\\dm", "SHOW MATERIALIZED VIEWS", " spend | default"),
        ("\\di", "SHOW INDEXES", " spend_idx | spend"),
        ("\\l", "SHOW DATABASES", " tidemark"),
        ("\\d orders", "SHOW COLUMNS FROM orders", " id   | bigint"),
    ],
)
def test_listing_commands_run_show(command: str, sql: str, first_row: str) -> None:
    connection = FakeConnection(show_answers)
    shell, out, _ = make_shell(connection)
    assert run_meta(command, shell) is Outcome.OK
    assert connection.executed == [sql]
    assert out.getvalue().splitlines()[2] == first_row


def test_timing_help_quit_and_unknown_commands() -> None:
    shell, out, err = make_shell(FakeConnection(tags))
    assert run_meta("\\timing", shell) is Outcome.OK
    assert shell.timing
    assert run_meta("\\timing off", shell) is Outcome.OK
    assert not shell.timing
    assert run_meta("\\timing maybe", shell) is Outcome.FAILED
    assert out.getvalue().splitlines() == ["Timing is on.", "Timing is off."]
    assert run_meta("\\?", shell) is Outcome.OK
    assert "\\dm" in out.getvalue()
    assert run_meta("\\q", shell) is Outcome.QUIT
    assert run_meta("\\zz", shell) is Outcome.FAILED
    assert "invalid command \\zz" in err.getvalue()


# -- the REPL ---------------------------------------------------------------------------------


def scripted(lines: list[str]) -> tuple[Callable[[str], str], list[str]]:
    """A fake ``input``: returns the lines, then raises EOFError; records the prompts."""
    prompts: list[str] = []
    remaining = list(lines)

    def read_line(prompt: str) -> str:
        prompts.append(prompt)
        if not remaining:
            raise EOFError
        line = remaining.pop(0)
        if line == "<ctrl-c>":
            raise KeyboardInterrupt
        return line

    return read_line, prompts


def test_repl_collects_lines_until_a_semicolon() -> None:
    connection = FakeConnection(tags)
    shell, out, _ = make_shell(connection)
    read_line, prompts = scripted(
        ["SELECT", "  1;", "\\timing on", "INSERT INTO t", "<ctrl-c>", "DROP t;", "\\q", "never"]
    )
    assert shell.repl(read_line) == 0
    assert connection.executed == ["SELECT\n  1", "DROP t"]
    assert prompts == [
        "tidemark=> ",
        "tidemark-> ",
        "tidemark=> ",
        "tidemark=> ",
        "tidemark-> ",
        "tidemark=> ",
        "tidemark=> ",
    ]
    assert "Timing is on." in out.getvalue()


def test_repl_runs_an_unterminated_statement_at_end_of_input() -> None:
    connection = FakeConnection(tags)
    shell, _, _ = make_shell(connection)
    # A line's complete statements run at once; the rest waits for more input.
    read_line, prompts = scripted(["SELECT 1; SELECT", "2"])
    assert shell.repl(read_line, prompts=False) == 0
    assert connection.executed == ["SELECT 1", " SELECT\n2\n"]
    assert set(prompts) == {""}


# -- the command line -------------------------------------------------------------------------


def test_cli_parses_sql_arguments() -> None:
    args = cli.build_parser().parse_args(["sql", "--address", "h:1", "-c", "SELECT 1", "-c", "\\d"])
    assert (args.command, args.address, args.commands) == ("sql", "h:1", ["SELECT 1", "\\d"])
    default = cli.build_parser().parse_args(["sql"])
    assert (default.address, default.commands) == ("127.0.0.1:6875", None)
    assert (default.user, default.ask_password) == ("", False)
    as_alice = cli.build_parser().parse_args(["sql", "--user", "alice", "-W"])
    assert (as_alice.user, as_alice.ask_password) == ("alice", True)
    up = cli.build_parser().parse_args(["up", "--spark-master", "local[2]"])
    assert (up.spark_master, up.base_port, up.data_dir) == ("local[2]", 6875, Path("data"))


def test_run_with_commands_exits_1_at_the_first_failure(capsys: pytest.CaptureFixture[str]) -> None:
    def answers(sql: str) -> list[StatementResult]:
        if "nope" in sql:
            return [failure("42P01", 'unknown table "nope"', 15)]
        return [rows_result(["a"], ("x",))]

    connection = FakeConnection(answers)
    assert repl.run(connection, ["SELECT a FROM t", "SELECT * FROM nope", "SELECT 3"]) == 1
    assert connection.executed == ["SELECT a FROM t", "SELECT * FROM nope"]
    captured = capsys.readouterr()
    assert captured.out == " a\n---\n x\n(1 row)\n\n"
    assert captured.err == (
        'ERROR:  unknown table "nope" (SQLSTATE 42P01)\n'
        "LINE 1: SELECT * FROM nope\n"
        "                      ^\n"
    )
    assert repl.run(FakeConnection(answers), ["SELECT 1", "\\dt"]) == 0


def test_history_is_saved_to_the_history_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = tmp_path / "history"
    monkeypatch.setenv("TIDEMARK_HISTORY", str(history))
    assert repl.history_path() == history
    save = repl.enable_history(history)
    readline.clear_history()
    readline.add_history("SELECT 42;")
    save()
    assert "SELECT 42;" in history.read_text()


def test_copy_reads_and_writes_files_on_the_shell_side(tmp_path: Path) -> None:
    source = tmp_path / "in.csv"
    source.write_bytes(b"a,b\n1,x\n")
    connection = FakeConnection(lambda sql: [StatementResult(tag="COPY 1")])
    shell, out, _ = make_shell(connection)
    assert run_meta(f"\\copy t (a, b) FROM '{source}' WITH (FORMAT csv, HEADER);", shell) is (
        Outcome.OK
    )
    assert connection.copied_in == [
        ("COPY t (a, b) FROM STDIN WITH (FORMAT csv, HEADER)", b"a,b\n1,x\n")
    ]
    target = tmp_path / "out.csv"
    query = "(SELECT a, 'to' FROM t WHERE b <> ')') TO"
    assert run_meta(f"\\COPY {query} '{target}' CSV", shell) is Outcome.OK
    assert connection.copied_out == ["COPY (SELECT a, 'to' FROM t WHERE b <> ')') TO STDOUT CSV"]
    assert target.read_bytes() == b"1,a\n2,b\n"
    assert out.getvalue().splitlines() == ["COPY 1", "COPY 1"]


def test_copy_reports_errors() -> None:
    connection = FakeConnection(lambda sql: [failure("22P02", "bad value (COPY t, line 2)", 0)])
    shell, _, err = make_shell(connection)
    assert run_meta("\\copy t FROM '/nonexistent/file'", shell) is Outcome.FAILED
    assert "No such file" in err.getvalue()
    assert run_meta("\\copy t TO stdout", shell) is Outcome.FAILED
    assert "line 2" in err.getvalue()
    assert run_meta("\\copy t", shell) is Outcome.FAILED
