"""In-process change notification for the embedded backends' watches."""

from __future__ import annotations

import asyncio


class ChangeSignal:
    """A counter that rises on every change notice, and lets tasks wait for it to rise.

    A watcher takes :attr:`token` *before* reading the key, then waits until the token moves
    past it: a change that lands between the read and the wait has already raised the token,
    so it cannot be slept through.
    """

    def __init__(self) -> None:
        self._token = 0
        self._event = asyncio.Event()

    @property
    def token(self) -> int:
        return self._token

    def notify(self) -> None:
        self._token += 1
        self._event.set()
        self._event = asyncio.Event()

    async def wait_past(self, token: int) -> None:
        """Return once :attr:`token` is greater than ``token``."""
        while self._token <= token:
            await self._event.wait()
