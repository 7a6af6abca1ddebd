"""What the shell needs from a connection to the adapter (a fake stands in for it in tests)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from tidemark.clients.adapter import ExecuteResult, SubscribeEvent


class SqlConnection(Protocol):
    @property
    def address(self) -> str: ...

    def execute(self, sql: str) -> ExecuteResult: ...

    def subscribe(self, sql: str) -> Iterator[SubscribeEvent]: ...

    def close(self) -> None: ...
