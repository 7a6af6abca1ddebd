"""Asserting on what the adapter answers: statements that must succeed or must fail."""

from __future__ import annotations

from tidemark.clients.adapter import AdapterClient, StatementError, StatementResult


async def ok(client: AdapterClient, sql: str) -> StatementResult:
    """The last statement's result; every statement must succeed."""
    result = await client.execute(sql)
    assert result.error is None, f"{sql!r} failed: {result.error}"
    return result.results[-1]


async def fails(client: AdapterClient, sql: str) -> StatementError:
    """The error of the statement that failed; one must fail."""
    result = await client.execute(sql)
    assert result.error is not None, f"{sql!r} succeeded: {result.results}"
    return result.error
