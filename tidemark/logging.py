"""Structured logging for every Tidemark process, on stderr.

Production runs write one JSON object per line (easy to ship and query); a developer at a
terminal gets structlog's readable console rendering. Logs from libraries that use the standard
``logging`` module (grpc, aetcd, ...) pass through the same renderer, so a process never mixes
two formats on one stream.

Values bound with ``structlog.contextvars`` (the RPC layer binds ``request_id`` and ``method``
for each call) appear on every line logged while handling that call.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

import structlog
from structlog.typing import FilteringBoundLogger, Processor

LogFormat = Literal["auto", "json", "console"]
LOG_FORMATS: tuple[LogFormat, ...] = ("auto", "json", "console")
LOG_LEVELS: tuple[str, ...] = ("debug", "info", "warning", "error", "critical")

# The stdlib handler this module installed last, so reconfiguring replaces it instead of
# duplicating every foreign log line.
_installed_handler: logging.Handler | None = None


def resolve_format(log_format: LogFormat, stream: TextIO) -> Literal["json", "console"]:
    """``auto`` means console on a terminal, JSON otherwise (pipes, files, containers)."""
    if log_format == "auto":
        return "console" if stream.isatty() else "json"
    return log_format


def level_number(level: str | int) -> int:
    """A level name ("info", "WARNING", ...) or number as the stdlib's number."""
    if isinstance(level, int):
        return level
    number = logging.getLevelNamesMapping().get(level.upper())
    if number is None:
        raise ValueError(f"unknown log level {level!r}; expected one of {', '.join(LOG_LEVELS)}")
    return number


def configure_logging(
    log_format: LogFormat = "auto",
    level: str | int = "info",
    *,
    stream: TextIO | None = None,
) -> None:
    """Send structlog and stdlib logging to ``stream`` (default: stderr) in one format.

    Safe to call more than once; the last call wins.
    """
    global _installed_handler
    out = sys.stderr if stream is None else stream
    threshold = level_number(level)
    rendering = resolve_format(log_format, out)

    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    renderer: Processor
    if rendering == "json":
        # Tracebacks become a string field; the console renderer formats them itself.
        shared.append(structlog.processors.format_exc_info)
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty())

    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        # Loggers are often created at import time, before this runs; caching would pin
        # them to whatever configuration was current at their first use.
        cache_logger_on_first_use=False,
    )

    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    if _installed_handler is not None:
        root.removeHandler(_installed_handler)
    root.addHandler(handler)
    root.setLevel(threshold)
    _installed_handler = handler


def get_logger(component: str) -> FilteringBoundLogger:
    """A logger whose lines carry ``component=component``. It follows later calls to
    :func:`configure_logging`, so modules may create theirs at import time."""
    logger: FilteringBoundLogger = structlog.get_logger(component=component)
    return logger
