"""The service runner: stop signals cancel the service's main and exit cleanly."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from tidemark.runner import run_until_signalled


async def test_a_main_that_returns_exits_zero() -> None:
    async def main() -> None:
        await asyncio.sleep(0)

    assert await run_until_signalled(main) == 0


async def test_a_main_that_fails_exits_one() -> None:
    async def main() -> None:
        raise RuntimeError("cannot reach etcd")

    assert await run_until_signalled(main) == 1


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_stop_signal_cancels_main_lets_it_clean_up_and_exits_zero(
    signum: signal.Signals,
) -> None:
    cleaned_up = asyncio.Event()
    started = asyncio.Event()

    async def main() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0.01)  # cleanup may itself await
            cleaned_up.set()

    async def send_signal() -> None:
        await started.wait()
        os.kill(os.getpid(), signum)

    sender = asyncio.ensure_future(send_signal())
    assert await run_until_signalled(main) == 0
    await sender
    assert cleaned_up.is_set()
