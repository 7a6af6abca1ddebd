"""Stopping background asyncio tasks."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel every one of ``tasks``, then wait for each to finish. Their cancellation is the
    expected outcome and is swallowed; any other error a task ends with propagates (the first
    one met, in argument order), since a failed background task should not pass unnoticed."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
