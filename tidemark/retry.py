"""Retrying an operation while its backend is unavailable, with jittered backoff."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from tidemark.errors import Unavailable

R = TypeVar("R")


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep retrying an unavailable backend before giving up."""

    total_seconds: float = 5.0
    initial_backoff: float = 0.02
    max_backoff: float = 0.5

    def backoffs(self) -> Backoff:
        return Backoff(self)


class Backoff:
    """Jittered exponential delays until the policy's time budget is spent."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.deadline = time.monotonic() + policy.total_seconds
        self.delay = policy.initial_backoff

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline

    async def sleep(self) -> None:
        remaining = self.deadline - time.monotonic()
        await asyncio.sleep(max(0.0, min(self.delay * (0.5 + random.random()), remaining)))
        self.delay = min(self.delay * 2, self.policy.max_backoff)


async def retry_unavailable(op: Callable[[], Awaitable[R]], policy: RetryPolicy, what: str) -> R:
    """Run ``op``, retrying on :class:`Unavailable` until ``policy`` runs out; then raise
    ``Unavailable`` naming ``what``. Any other error propagates at once."""
    backoff = policy.backoffs()
    while True:
        try:
            return await op()
        except Unavailable as exc:
            if backoff.expired():
                raise Unavailable(f"{what} is unavailable: {exc.message}") from exc
            await backoff.sleep()
