"""Logging: JSON lines for machines, readable lines for people, one stream for both."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from tidemark.logging import configure_logging, get_logger, resolve_format


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    config = structlog.get_config()
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.configure(**config)
    structlog.contextvars.clear_contextvars()


def test_json_lines_carry_the_event_level_time_and_bound_context() -> None:
    out = io.StringIO()
    configure_logging("json", "info", stream=out)
    log = get_logger("unit")
    with structlog.contextvars.bound_contextvars(request_id="r-1"):
        log.info("appended", shard="u7", rows=3)
    log.debug("too quiet to show")

    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["event"] == "appended"
    assert record["level"] == "info"
    assert record["component"] == "unit"
    assert (record["shard"], record["rows"], record["request_id"]) == ("u7", 3, "r-1")
    assert record["timestamp"].endswith("Z")


def test_exceptions_are_logged_with_their_traceback_as_a_field() -> None:
    out = io.StringIO()
    configure_logging("json", stream=out)
    try:
        raise KeyError("missing shard")
    except KeyError:
        get_logger("unit").exception("lookup_failed")
    record = json.loads(out.getvalue())
    assert record["level"] == "error"
    assert "Traceback" in record["exception"] and "KeyError: 'missing shard'" in record["exception"]


def test_standard_library_loggers_come_out_in_the_same_format() -> None:
    out = io.StringIO()
    configure_logging("json", "warning", stream=out)
    logging.getLogger("some.library").warning("disk %s full", "/data")
    logging.getLogger("some.library").info("not shown")
    record = json.loads(out.getvalue())
    assert (record["event"], record["level"], record["logger"]) == (
        "disk /data full",
        "warning",
        "some.library",
    )


def test_reconfiguring_replaces_the_previous_setup() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("json", stream=first)
    configure_logging("json", stream=second)
    logging.getLogger("lib").warning("once")
    get_logger("unit").info("also once")
    assert first.getvalue() == ""
    assert [json.loads(line)["event"] for line in second.getvalue().splitlines()] == [
        "once",
        "also once",
    ]


def test_console_format_is_for_people() -> None:
    out = io.StringIO()
    configure_logging("console", stream=out)
    get_logger("unit").info("started", port=7001)
    text = out.getvalue()
    assert "started" in text and "port=7001" in text
    with pytest.raises(ValueError):
        json.loads(text)


def test_auto_picks_console_on_a_terminal_and_json_elsewhere() -> None:
    assert resolve_format("auto", FakeTerminal()) == "console"
    assert resolve_format("auto", io.StringIO()) == "json"
    assert resolve_format("json", FakeTerminal()) == "json"


def test_an_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="verbose"):
        configure_logging("json", "verbose", stream=io.StringIO())
