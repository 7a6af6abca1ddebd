"""``python -m services.oracle``: the timestamp oracle process."""

from __future__ import annotations

from dataclasses import dataclass

from services.oracle.oracle import TimestampOracle
from services.oracle.service import oracle_service
from tidemark.config import ServiceConfig, consensus_url_setting, listen_setting, setting
from tidemark.consensus import open_consensus
from tidemark.retry import RetryPolicy
from tidemark.rpc import announce_port, serve
from tidemark.runner import run_service


@dataclass(frozen=True)
class OracleConfig(ServiceConfig):
    listen: str = listen_setting("127.0.0.1:7001")
    consensus_url: str = consensus_url_setting()
    backend_retry_seconds: float = setting(
        5.0, help="how long a call retries an unavailable consensus before failing UNAVAILABLE"
    )
    batch_linger: float = setting(
        0.002,
        help="under load, the longest calls queued behind a consensus round trip wait for more "
        "calls to share the next one, while more keep arriving (0: no wait); fewer round trips "
        "per call for at most that much latency",
        metavar="SECONDS",
    )


async def main(config: OracleConfig) -> None:
    consensus = open_consensus(config.consensus_url)
    oracle = TimestampOracle(
        consensus,
        retry=RetryPolicy(config.backend_retry_seconds),
        batch_linger_s=config.batch_linger,
    )
    try:
        await serve(
            [oracle_service(oracle)],
            config.listen,
            grace=config.shutdown_grace,
            on_started=announce_port,
            tls=config.tls(),
            reflection=config.reflection,
        )
    finally:
        await oracle.close()
        await consensus.close()


if __name__ == "__main__":
    run_service(
        main,
        OracleConfig,
        prog="python -m services.oracle",
        description="Tidemark timestamp oracle: linearizable read and write timestamps per "
        "timeline, kept in a consensus store.",
    )
