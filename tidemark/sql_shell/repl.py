"""The interactive shell and the one-shot ``-c`` run of ``tidemark sql``.

Input is collected line by line until a statement ends with ``;`` (psql's rule), then sent.
Consecutive ordinary statements go to the adapter in one ``Execute`` call; a ``SUBSCRIBE``
goes to the ``Subscribe`` stream, whose changes are printed as they arrive until it ends or
the user presses Ctrl-C, which stops the subscription, not the shell. A call that runs past
``progress_after`` seconds shows a progress line on stderr meanwhile (:mod:`.progress`).
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from tidemark.clients.adapter import (
    Changes,
    ExecuteResult,
    Progress,
    SubscribeError,
    SubscribeHeader,
)
from tidemark.errors import TidemarkError
from tidemark.sql_shell.client import SqlConnection
from tidemark.sql_shell.meta import Outcome, run_meta
from tidemark.sql_shell.progress import (
    DEFAULT_PROGRESS_AFTER_S,
    ProgressLine,
    ProgressWatcher,
)
from tidemark.sql_shell.render import (
    render_change,
    render_change_header,
    render_error,
    render_notices,
    render_result,
    render_timing,
)
from tidemark.sql_shell.statements import is_subscribe, split_complete, split_statements

PROMPT = "tidemark=> "
CONTINUATION_PROMPT = "tidemark-> "
HISTORY_LENGTH = 2000


class Shell:
    """One connection's shell state: where output goes, ``\\timing``, the NULL marker."""

    def __init__(
        self,
        connection: SqlConnection,
        *,
        out: TextIO | None = None,
        err: TextIO | None = None,
        timing: bool = False,
        null: str = "",
        progress_after: float = DEFAULT_PROGRESS_AFTER_S,
        progress_tty: bool | None = None,
    ) -> None:
        self.connection = connection
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.timing = timing
        self.null = null
        self.progress_after = progress_after
        """Seconds a call runs before its progress line shows (negative: never)."""
        self.progress_tty = progress_tty
        """Whether the progress line is overwritten in place (``None``: when stderr is a
        terminal)."""

    def write(self, text: str) -> None:
        # Flushed at once: a subscription's reader may be another program on a pipe.
        print(text, file=self.out, flush=True)

    def write_error(self, text: str) -> None:
        print(text, file=self.err, flush=True)

    # -- SQL --------------------------------------------------------------------------------

    def run_sql(self, sql: str) -> bool:
        """Runs every statement of ``sql``; stops at the first that fails (returns False)."""
        batch: list[str] = []
        for statement in split_statements(sql):
            if is_subscribe(statement.text):
                if batch and not self.execute(";".join(batch)):
                    return False
                batch = []
                if not self.subscribe(statement.text):
                    return False
            else:
                batch.append(statement.text)
        return not batch or self.execute(";".join(batch))

    def execute(self, sql: str) -> bool:
        started = time.perf_counter()
        try:
            result = self._execute_watched(sql)
        except TidemarkError as exc:
            self.write_error(f"error: {exc.message} (adapter at {self.connection.address})")
            return False
        except KeyboardInterrupt:
            self.write_error("cancelled")
            return False
        elapsed = time.perf_counter() - started
        for statement in result.results:
            for notice in render_notices(statement):
                self.write_error(notice)
            if statement.error is not None:
                self.write_error(render_error(statement.error, sql))
                return False
            self.write(render_result(statement, self.null))
        if self.timing:
            self.write(render_timing(elapsed))
        return True

    def _execute_watched(self, sql: str) -> ExecuteResult:
        """``execute``, with a progress line once it has run ``progress_after`` seconds."""
        if self.progress_after < 0:
            return self.connection.execute(sql)
        statement_id = uuid.uuid4().hex
        watcher = ProgressWatcher(
            lambda: self.connection.statement_progress(statement_id),
            ProgressLine(self.err, tty=self.progress_tty),
            after_s=self.progress_after,
        )
        with watcher:
            return self.connection.execute(sql, statement_id=statement_id)

    def subscribe(self, sql: str) -> bool:
        """Prints the subscription's changes until it completes, fails, or Ctrl-C (which
        counts as success: it is how a subscription is meant to end)."""
        events = self.connection.subscribe(sql)
        try:
            for event in events:
                if isinstance(event, SubscribeHeader):
                    self.write(render_change_header(event.columns))
                elif isinstance(event, Changes):
                    for change in event.changes:
                        self.write(render_change(change, self.null))
                elif isinstance(event, SubscribeError):
                    self.write_error(render_error(event.error, sql))
                    return False
                elif isinstance(event, Progress) and event.upper is None:
                    return True
            return True
        except KeyboardInterrupt:
            return True
        except TidemarkError as exc:
            self.write_error(f"error: {exc.message} (adapter at {self.connection.address})")
            return False
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()

    def run_command(self, text: str) -> bool:
        """One ``-c`` argument: a backslash command or SQL."""
        if text.lstrip().startswith("\\"):
            return run_meta(text, self) is not Outcome.FAILED
        return self.run_sql(text)

    # -- interactive ------------------------------------------------------------------------

    def repl(self, read_line: Callable[[str], str], *, prompts: bool = True) -> int:
        """Reads and runs input until ``\\q`` or end of input. ``read_line`` is ``input``
        (with readline) or a fake; it raises EOFError at the end."""
        buffer = ""
        while True:
            prompt = (CONTINUATION_PROMPT if buffer else PROMPT) if prompts else ""
            try:
                line = read_line(prompt)
            except EOFError:
                if prompts:
                    self.write("")
                if buffer.strip():
                    self.run_sql(buffer)
                return 0
            except KeyboardInterrupt:
                # As in psql: Ctrl-C at the prompt discards the statement being typed.
                self.write("")
                buffer = ""
                continue
            if not buffer and line.lstrip().startswith("\\"):
                if run_meta(line, self) is Outcome.QUIT:
                    return 0
                continue
            ready, buffer = split_complete(buffer + line + "\n")
            if ready:
                self.run_sql(ready)
            if not buffer.strip():
                buffer = ""


def history_path() -> Path:
    return Path(os.environ.get("TIDEMARK_HISTORY", str(Path.home() / ".tidemark_history")))


def enable_history(path: Path) -> Callable[[], None]:
    """Line editing and history across sessions through readline; returns the function that
    saves the history (a no-op where readline is missing)."""
    try:
        import readline
    except ImportError:
        return lambda: None
    readline.set_history_length(HISTORY_LENGTH)
    try:
        readline.read_history_file(path)
    except OSError:
        pass  # no history yet

    def save() -> None:
        try:
            readline.write_history_file(path)
        except OSError:
            pass  # a read-only home must not break the shell on exit

    return save


def run(
    connection: SqlConnection,
    command: list[str] | None,
    *,
    progress_after: float = DEFAULT_PROGRESS_AFTER_S,
) -> int:
    """``tidemark sql``: each ``-c`` command in turn (exit 1 at the first failure), or the
    interactive shell."""
    shell = Shell(connection, progress_after=progress_after)
    if command:
        for text in command:
            if not shell.run_command(text):
                return 1
        return 0
    interactive = sys.stdin.isatty()
    save_history = enable_history(history_path()) if interactive else lambda: None
    if interactive:
        shell.write(f"tidemark sql: connected to {connection.address}; \\? for help, \\q to quit")
    try:
        return shell.repl(input, prompts=interactive)
    finally:
        save_history()
