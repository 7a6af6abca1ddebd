"""The compute process's Spark session: a start that fails (the JVM now and then fails to
launch on a loaded machine) is tried again by the next caller, instead of leaving the process
without Spark until it restarts."""

from __future__ import annotations

from typing import Any

import pytest

from services.compute.engines import SparkEngine
from tidemark.errors import Unavailable


async def test_a_failed_session_start_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = SparkEngine("local[1]", 1, {})
    session = object()
    attempts: list[int] = []

    def make_session() -> Any:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("Java gateway process exited before sending its port number")
        return session

    async def no_cluster() -> None:
        return None

    monkeypatch.setattr(engine, "_make_session", make_session)
    monkeypatch.setattr(engine, "_warm", no_cluster)
    with pytest.raises(Unavailable, match="gateway process exited"):
        await engine.session()
    assert await engine.session() is session
    assert await engine.session() is session  # started once more, not on every call
    assert len(attempts) == 2
