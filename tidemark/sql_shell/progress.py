"""The progress line ``tidemark sql`` shows while a statement runs long.

The shell names each Execute call (a statement id) and, once the call has run ``after``
seconds (2 by default, ``--progress-after``), asks the adapter how far it has come every
``POLL_INTERVAL_S`` from a second thread (``Adapter.StatementProgress``), and shows the answer
on stderr: on a terminal one line overwritten in place and erased when the statement ends,
elsewhere a line each time the text changes, e.g.::

    … 12/40 parts, 3.1M/9.6M rows (6 s)
    … waiting for u7 to hydrate: 3/10 parts, 1.2M/4M rows (3 s)

Progress is a courtesy: a failed poll (an adapter that does not know the call) ends the
polling, never the statement.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from typing import TextIO

from tidemark.clients.adapter import StatementProgress
from tidemark.errors import TidemarkError

DEFAULT_PROGRESS_AFTER_S = 2.0
POLL_INTERVAL_S = 0.5
_ERASE_LINE = "\r\x1b[K"


def compact(count: int) -> str:
    """``950``, ``12k``, ``3.1M``, ``2B``: a count in at most four characters or so."""
    for size, suffix in ((1_000_000_000, "B"), (1_000_000, "M"), (1_000, "k")):
        if count >= size:
            shown = f"{count / size:.1f}".removesuffix(".0")
            return f"{shown}{suffix}"
    return str(count)


def render_progress(progress: StatementProgress) -> str:
    """The progress line's text (without the leading erase)."""
    counts = []
    if progress.parts_total:
        counts.append(f"{progress.parts_done}/{progress.parts_total} parts")
    if progress.rows_total:
        counts.append(f"{compact(progress.rows_done)}/{compact(progress.rows_total)} rows")
    elif progress.rows_done:
        counts.append(f"{compact(progress.rows_done)} rows")
    if progress.state == "waiting" and progress.waiting_for:
        verb = "hydrates" if len(progress.waiting_for) == 1 else "hydrate"
        what = f"waiting while {', '.join(progress.waiting_for)} {verb}"
    elif progress.state == "waiting":
        what = "waiting for the inputs"
    elif counts:
        what = ""
    else:
        what = "running"
    text = ": ".join(part for part in (what, ", ".join(counts)) if part)
    return f"… {text} ({progress.elapsed_ms // 1000} s)"


class ProgressLine:
    """Where the progress goes: ``stream``, overwritten in place when it is a terminal."""

    def __init__(
        self, stream: TextIO, *, tty: bool | None = None, width: int | None = None
    ) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.width = width
        """Columns of the terminal (``None``: asked when a line is shown)."""
        self._last = ""

    def show(self, text: str) -> None:
        # Off a terminal (a log, a script's stderr) a line is written when the progress
        # itself moves, not every time only the elapsed seconds do.
        seen = text if self.tty else text.rsplit(" (", 1)[0]
        if seen == self._last:
            return
        self._last = seen
        if self.tty:
            # A line wider than the terminal would wrap, and the next one would be written
            # below it instead of over it.
            width = self.width or shutil.get_terminal_size().columns
            self.stream.write(f"{_ERASE_LINE}{text[: max(1, width - 1)]}")
        else:
            self.stream.write(f"{text}\n")
        self.stream.flush()

    def clear(self) -> None:
        """Erases the line on a terminal (before the statement's results are printed)."""
        if self.tty and self._last:
            self.stream.write(_ERASE_LINE)
            self.stream.flush()
        self._last = ""


class ProgressWatcher:
    """Polls ``poll`` on a thread of its own once ``after_s`` has passed, until stopped, and
    shows what it answers on ``line``."""

    def __init__(
        self,
        poll: Callable[[], StatementProgress | None],
        line: ProgressLine,
        *,
        after_s: float = DEFAULT_PROGRESS_AFTER_S,
        interval_s: float = POLL_INTERVAL_S,
    ) -> None:
        self.poll = poll
        self.line = line
        self.after_s = after_s
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def __enter__(self) -> ProgressWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self.line.clear()

    def _run(self) -> None:
        if self._stop.wait(self.after_s):
            return
        while not self._stop.is_set():
            try:
                progress = self.poll()
            except (TidemarkError, OSError, RuntimeError):
                return  # an adapter that cannot tell: the statement goes on without a line
            if progress is not None and not self._stop.is_set():
                self.line.show(render_progress(progress))
            self._stop.wait(self.interval_s)
