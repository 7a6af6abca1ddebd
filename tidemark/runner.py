"""Running a service process: configuration, logging, signals, exit status.

Each ``services/<name>/__main__.py`` is a few lines::

    async def main(config: OracleConfig) -> None:
        ...
        await serve([...], config.listen, grace=config.shutdown_grace)

    run_service(main, OracleConfig, prog="python -m services.oracle", description="...")

SIGTERM or SIGINT cancels ``main``; the servers it started stop gracefully on the way out
(:func:`tidemark.rpc.server.serve`), and the process exits with status 0. A second signal
during that stop cuts the grace period short. An exception escaping ``main`` is logged and
exits with status 1; bad flags or variables exit with status 2 before anything starts.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import NoReturn, TypeVar, cast

from tidemark.config import ServiceConfig, load_config
from tidemark.logging import LogFormat, configure_logging, get_logger
from tidemark.metrics import serve_metrics

C = TypeVar("C", bound=ServiceConfig)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

log = get_logger("tidemark.runner")


async def run_until_signalled(main: Callable[[], Awaitable[None]]) -> int:
    """Run ``main()`` until it returns or a stop signal cancels it; the exit status."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(main())
    received: list[signal.Signals] = []

    def on_signal(signum: signal.Signals) -> None:
        received.append(signum)
        if len(received) == 1:
            log.info("shutdown_requested", signal=signum.name)
        else:
            log.warning("shutdown_forced", signal=signum.name)
        task.cancel()

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await task
        return 0
    except asyncio.CancelledError:
        if received:
            return 0
        raise
    except Exception:
        log.exception("service_failed")
        return 1
    finally:
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)


def run_service(
    main: Callable[[C], Awaitable[None]],
    config_type: type[C],
    *,
    prog: str | None = None,
    description: str | None = None,
    argv: Sequence[str] | None = None,
) -> NoReturn:
    """Parse the settings, configure logging, run ``main(config)``, exit with its status."""
    config = load_config(config_type, argv, prog=prog, description=description)
    configure_logging(cast(LogFormat, config.log_format), config.log_level)
    if config.metrics_port:
        try:
            serve_metrics(config.listen, config.metrics_port)
        except OSError as exc:
            log.error("metrics_port_unavailable", port=config.metrics_port, error=str(exc))
            sys.exit(1)
    status = asyncio.run(run_until_signalled(lambda: main(config)))
    sys.exit(status)
