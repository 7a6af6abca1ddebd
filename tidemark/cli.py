"""The ``tidemark`` command.

``tidemark up`` runs a whole Tidemark on one machine: every service as its own process on
localhost, embedded backends (SQLite consensus, a blob directory) under one data directory,
one log file per process. A service that crashes is restarted (with backoff) while the others
keep serving. Ctrl-C stops them all; running it again finds the same data. ``tidemark sql`` is
a SQL shell connected to an adapter; ``tidemark status`` shows the health of the local
services, and how often each was restarted and why it last exited.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tidemark.local.services import DEFAULT_BASE_PORT, DEFAULT_SPARK_MASTER


def _add_base_port(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--base-port",
        type=int,
        default=int(os.environ.get("TIDEMARK_BASE_PORT", str(DEFAULT_BASE_PORT))),
        help="the adapter listens here, the other services on the next ports "
        f"[env TIDEMARK_BASE_PORT; default: {DEFAULT_BASE_PORT}]",
    )


def _add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("TIDEMARK_DATA_DIR", "data")),
        help="where the embedded backends and the logs live [env TIDEMARK_DATA_DIR; "
        "default: ./data]",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tidemark", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    up_parser = commands.add_parser("up", help="run every service on localhost")
    _add_data_dir(up_parser)
    _add_base_port(up_parser)
    up_parser.add_argument(
        "--spark-master",
        default=os.environ.get("TIDEMARK_SPARK_MASTER", DEFAULT_SPARK_MASTER),
        help="the Spark master of the compute cluster [env TIDEMARK_SPARK_MASTER; "
        f"default: {DEFAULT_SPARK_MASTER}]",
    )

    sql_parser = commands.add_parser("sql", help="a SQL shell on an adapter")
    sql_parser.add_argument(
        "--address",
        default=os.environ.get("TIDEMARK_ADDRESS", f"127.0.0.1:{DEFAULT_BASE_PORT}"),
        help="the adapter's HOST:PORT [env TIDEMARK_ADDRESS; "
        f"default: 127.0.0.1:{DEFAULT_BASE_PORT}]",
    )
    sql_parser.add_argument(
        "-U",
        "--user",
        default=os.environ.get("TIDEMARK_USER", ""),
        help="the role to act as [env TIDEMARK_USER; default: the adapter's choice, under "
        "auth = trust its bootstrap superuser]",
    )
    sql_parser.add_argument(
        "-W",
        "--password",
        action="store_true",
        dest="ask_password",
        help="prompt for the password (else it is read from env TIDEMARK_PASSWORD, if set)",
    )
    sql_parser.add_argument(
        "-c",
        "--command",
        action="append",
        dest="commands",
        metavar="SQL",
        help="run SQL (or one backslash command) and exit; may be given several times",
    )

    status_parser = commands.add_parser(
        "status", help="health of the local services, their restarts and last exits"
    )
    _add_base_port(status_parser)
    _add_data_dir(status_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "up":
        from tidemark.local.supervisor import up

        return up(args.data_dir, args.base_port, args.spark_master)
    if args.command == "sql":
        from tidemark.clients.adapter import BlockingAdapterClient
        from tidemark.logging import configure_logging
        from tidemark.sql_shell.repl import run

        # The shell's output is the results; library chatter (retries) stays out of it.
        configure_logging("console", "warning")

        password = os.environ.get("TIDEMARK_PASSWORD", "")
        if args.ask_password:
            import getpass

            password = getpass.getpass(f"Password for user {args.user or '(default)'}: ")
        with BlockingAdapterClient(args.address, user=args.user, password=password) as connection:
            return run(connection, args.commands)
    if args.command == "status":
        from tidemark.local.supervisor import status

        return status(args.base_port, args.data_dir)
    return 2


if __name__ == "__main__":
    sys.exit(main())
