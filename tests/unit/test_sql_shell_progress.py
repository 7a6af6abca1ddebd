"""The progress line of ``tidemark sql``: what it says, and how the shell shows it while a
call runs (a fake connection that answers only once it has been asked for progress)."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterable, Iterator

from tidemark.clients.adapter import (
    ExecuteResult,
    StatementProgress,
    StatementResult,
    SubscribeEvent,
)
from tidemark.sql_shell.progress import ProgressLine, compact, render_progress
from tidemark.sql_shell.repl import Shell
from tidemark.v1 import adapter_pb2


def progress(
    state: str = "running",
    waiting_for: Iterable[str] = (),
    parts: tuple[int, int] = (0, 0),
    rows: tuple[int, int] = (0, 0),
    elapsed_ms: int = 6400,
) -> StatementProgress:
    return StatementProgress("SELECT ...", elapsed_ms, state, list(waiting_for), *parts, *rows)


def test_counts_are_compact() -> None:
    assert [compact(n) for n in (0, 950, 1000, 12_345, 3_100_000, 40_000_000, 2 * 10**9)] == [
        "0",
        "950",
        "1k",
        "12.3k",
        "3.1M",
        "40M",
        "2B",
    ]


def test_the_line_says_parts_rows_and_what_the_statement_waits_for() -> None:
    assert (
        render_progress(progress(parts=(12, 40), rows=(3_100_000, 9_600_000)))
        == "… 12/40 parts, 3.1M/9.6M rows (6 s)"
    )
    assert (
        render_progress(progress("waiting", ["u7"], (3, 10), (1_200_000, 4_000_000), 3000))
        == "… waiting while u7 hydrates: 3/10 parts, 1.2M/4M rows (3 s)"
    )
    assert (
        render_progress(progress("waiting", ["u7", "u9"], rows=(5, 0)))
        == "… waiting while u7, u9 hydrate: 5 rows (6 s)"
    )
    assert render_progress(progress("waiting")) == "… waiting for the inputs (6 s)"
    assert render_progress(progress("")) == "… running (6 s)"


def test_on_a_terminal_the_line_is_overwritten_and_erased() -> None:
    stream = io.StringIO()
    line = ProgressLine(stream, tty=True)
    line.show("… 1/4 parts")
    line.show("… 1/4 parts")
    line.show("… 2/4 parts")
    line.clear()
    assert stream.getvalue() == "\r\x1b[K… 1/4 parts\r\x1b[K… 2/4 parts\r\x1b[K"
    narrow = io.StringIO()
    ProgressLine(narrow, tty=True, width=8).show("… 12/40 parts")
    assert narrow.getvalue() == "\r\x1b[K… 12/40"
    piped = io.StringIO()
    line = ProgressLine(piped, tty=False)
    for text in ("… 1/4 parts", "… 1/4 parts", "… 2/4 parts"):
        line.show(text)
    line.clear()
    assert piped.getvalue() == "… 1/4 parts\n… 2/4 parts\n"


class SlowConnection:
    """An Execute that runs until its progress has been asked for ``polls`` times, each
    answer a step further."""

    address = "fake:1"

    def __init__(self, polls: int) -> None:
        self.polls = polls
        self.asked: list[str] = []
        self.statement_ids: list[str] = []
        self._done = threading.Event()

    def execute(self, sql: str, *, statement_id: str = "") -> ExecuteResult:
        self.statement_ids.append(statement_id)
        assert self._done.wait(30), "the shell never asked for progress"
        result = StatementResult("SELECT 1")
        return ExecuteResult([result], adapter_pb2.Session())

    def statement_progress(self, statement_id: str) -> StatementProgress | None:
        self.asked.append(statement_id)
        step = len(self.asked)
        if step >= self.polls:
            self._done.set()
        return progress(parts=(step, 4), rows=(step * 1000, 4000), elapsed_ms=step * 1000)

    def subscribe(self, sql: str) -> Iterator[SubscribeEvent]:
        raise AssertionError("no subscriptions here")

    def copy_in(self, sql: str, data: Iterable[bytes]) -> StatementResult:
        raise AssertionError("no COPY here")

    def copy_out(self, sql: str) -> tuple[list[bytes], StatementResult]:
        raise AssertionError("no COPY here")

    def close(self) -> None:
        pass


def test_a_long_statement_shows_its_progress_then_its_result() -> None:
    connection = SlowConnection(polls=3)
    out, err = io.StringIO(), io.StringIO()
    shell = Shell(connection, out=out, err=err, progress_after=0.0, progress_tty=False)
    assert shell.run_sql("SELECT count(*) FROM big;")
    (statement_id,) = connection.statement_ids
    assert statement_id and set(connection.asked) == {statement_id}
    assert err.getvalue().splitlines() == [
        "… 1/4 parts, 1k/4k rows (1 s)",
        "… 2/4 parts, 2k/4k rows (2 s)",
        "… 3/4 parts, 3k/4k rows (3 s)",
    ]
    assert out.getvalue() == "SELECT 1\n"


def test_on_a_terminal_the_result_follows_an_erased_line() -> None:
    connection = SlowConnection(polls=2)
    out, err = io.StringIO(), io.StringIO()
    shell = Shell(connection, out=out, err=err, progress_after=0.0, progress_tty=True)
    assert shell.run_sql("SELECT count(*) FROM big;")
    assert err.getvalue() == (
        "\r\x1b[K… 1/4 parts, 1k/4k rows (1 s)\r\x1b[K… 2/4 parts, 2k/4k rows (2 s)\r\x1b[K"
    )


def test_a_quick_statement_or_a_negative_threshold_shows_nothing() -> None:
    class Quick(SlowConnection):
        def execute(self, sql: str, *, statement_id: str = "") -> ExecuteResult:
            self.statement_ids.append(statement_id)
            return ExecuteResult([StatementResult("SELECT 0")], adapter_pb2.Session())

    quick = Quick(polls=1)
    err = io.StringIO()
    assert Shell(quick, out=io.StringIO(), err=err, progress_after=60.0).run_sql("SELECT 1;")
    assert quick.asked == [] and err.getvalue() == ""
    off = Quick(polls=1)
    assert Shell(off, out=io.StringIO(), err=err, progress_after=-1).run_sql("SELECT 1;")
    assert off.statement_ids == [""] and off.asked == []


def test_off_a_terminal_a_line_is_written_only_when_the_progress_moves() -> None:
    stream = io.StringIO()
    line = ProgressLine(stream, tty=False)
    for text in ("… running (1 s)", "… running (2 s)", "… 1/2 parts (3 s)", "… 1/2 parts (4 s)"):
        line.show(text)
    assert stream.getvalue() == "… running (1 s)\n… 1/2 parts (3 s)\n"
