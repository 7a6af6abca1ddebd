"""The adapter's one-shot reads: a read capability whose lease lapsed between renewals (a long
stall) is acquired afresh once, instead of failing every later read of the collection."""

from __future__ import annotations

from typing import Any

import pytest

from services.adapter.reads import PlanInputs, QueryReader
from tidemark.errors import PermissionDenied


class Holds:
    def __init__(self) -> None:
        self.generation = 0
        self.forgotten: list[str] = []

    async def read(self, collection_id: str) -> str:
        return f"{collection_id}#{self.generation}"

    def forget(self, collection_id: str) -> None:
        self.forgotten.append(collection_id)
        self.generation += 1


class Compute:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.seen: list[Any] = []

    async def peek(self, target: Any, timestamp: int, **_: Any) -> str:
        self.seen.append(target)
        if self.failures:
            self.failures -= 1
            raise PermissionDenied("capability is not a live capability (expired)")
        return "answer"


def reader(holds: Holds) -> QueryReader:
    return QueryReader(backends=None, timestamps=None, holds=holds)  # type: ignore[arg-type]


INPUTS = PlanInputs(frozenset({"u1", "u2"}), frozenset({"u1", "u2"}), frozenset())


async def test_a_lapsed_read_capability_is_acquired_afresh_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("services.adapter.reads.one_shot", lambda plan, caps: list(caps))
    holds = Holds()
    compute = Compute(failures=1)
    answer = await reader(holds)._one_shot(compute, None, INPUTS, None, 5, 0)  # type: ignore[arg-type]
    assert answer == "answer"
    assert sorted(holds.forgotten) == ["u1", "u2"]
    assert compute.seen == [["u1#0", "u2#0"], ["u1#2", "u2#2"]]


async def test_a_capability_refused_twice_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("services.adapter.reads.one_shot", lambda plan, caps: list(caps))
    compute = Compute(failures=2)
    with pytest.raises(PermissionDenied):
        await reader(Holds())._one_shot(compute, None, INPUTS, None, 5, 0)  # type: ignore[arg-type]
    assert len(compute.seen) == 2
