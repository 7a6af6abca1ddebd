"""What the shell needs from a connection to the adapter (a fake stands in for it in tests)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

from tidemark.clients.adapter import (
    ExecuteResult,
    StatementProgress,
    StatementResult,
    SubscribeEvent,
)


class SqlConnection(Protocol):
    @property
    def address(self) -> str: ...

    def execute(self, sql: str, *, statement_id: str = "") -> ExecuteResult: ...

    def statement_progress(self, statement_id: str) -> StatementProgress | None:
        """Called from another thread while ``execute`` runs."""
        ...

    def subscribe(self, sql: str) -> Iterator[SubscribeEvent]: ...

    def copy_in(self, sql: str, data: Iterable[bytes]) -> StatementResult: ...

    def copy_out(self, sql: str) -> tuple[list[bytes], StatementResult]: ...

    def close(self) -> None: ...
