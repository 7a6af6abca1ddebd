"""The ``tidemark`` command.

``tidemark up`` runs a whole Tidemark on one machine: every service as its own process on
localhost, embedded backends (SQLite consensus, a blob directory) under one data directory,
one log file per process. A service that crashes is restarted (with backoff) while the others
keep serving. Ctrl-C stops them all; running it again finds the same data. ``tidemark sql`` is
a SQL shell connected to an adapter; ``tidemark status`` shows the health of the local
services, and how often each was restarted and why it last exited. ``tidemark certs`` makes
a local CA and a certificate per service identity, for mTLS (``tidemark up --tls`` does it
itself).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tidemark.local.services import DEFAULT_BASE_PORT, DEFAULT_SPARK_MASTER
from tidemark.rpc.tls import TlsSettings


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


def _add_client_tls(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "TLS",
        "for an adapter serving TLS; a client certificate is needed only where the "
        "adapter requires one (its --tls-client-auth)",
    )
    group.add_argument(
        "--tls-dir",
        type=Path,
        default=os.environ.get("TIDEMARK_TLS_DIR") or None,
        help="the directory tidemark certs (or tidemark up --tls, in <data>/tls) wrote: its "
        "ca.crt, client-cli.crt and client-cli.key [env TIDEMARK_TLS_DIR]",
    )
    for name, what in (
        ("ca", "the CA's certificate"),
        ("cert", "a client certificate"),
        ("key", "its key"),
    ):
        group.add_argument(
            f"--tls-{name}",
            default=os.environ.get(f"TIDEMARK_TLS_{name.upper()}", ""),
            metavar="PATH",
            help=f"PEM file: {what} [env TIDEMARK_TLS_{name.upper()}]",
        )


def client_tls(args: argparse.Namespace) -> TlsSettings | None:
    """The TLS settings the tool's flags give (``None``: plaintext)."""
    if args.tls_dir is not None:
        from tidemark.local.services import cli_tls

        return cli_tls(args.tls_dir)
    if not args.tls_ca:
        if args.tls_cert or args.tls_key:
            raise SystemExit("tidemark: --tls-cert and --tls-key need --tls-ca")
        return None
    if bool(args.tls_cert) != bool(args.tls_key):
        raise SystemExit("tidemark: --tls-cert and --tls-key go together")
    return TlsSettings(args.tls_cert, args.tls_key, args.tls_ca)


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
    up_parser.add_argument(
        "--tls",
        action="store_true",
        default=os.environ.get("TIDEMARK_UP_TLS", "") not in ("", "0", "false"),
        help="write a CA and a certificate per service into <data>/tls and run every service "
        "with mTLS (each call's caller checked by its certificate's identity) [env "
        "TIDEMARK_UP_TLS]",
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
    sql_parser.add_argument(
        "--progress-after",
        type=float,
        default=float(os.environ.get("TIDEMARK_PROGRESS_AFTER", "2")),
        metavar="SECONDS",
        help="show a progress line on stderr (parts and rows done) for a statement running "
        "longer than this (negative: never) [env TIDEMARK_PROGRESS_AFTER; default: 2]",
    )
    _add_client_tls(sql_parser)

    certs_parser = commands.add_parser(
        "certs",
        help="a local CA and a certificate per service identity, for mTLS",
        description="Writes ca.crt/ca.key (an existing CA in DIR is reused) and <name>.crt/"
        "<name>.key per identity, each naming its identity as a SAN URI plus localhost, "
        "127.0.0.1 and its Kubernetes service names. Without --identity: every service, "
        "the cluster 'default' of the database 'tidemark', and client 'cli'.",
    )
    certs_parser.add_argument("directory", type=Path, metavar="DIR")
    certs_parser.add_argument(
        "--identity",
        action="append",
        dest="identities",
        metavar="URI",
        help="tidemark://adapter, tidemark://compute/<tenant>/<cluster>, "
        "tidemark://client/<name>, ...; may be given several times",
    )
    certs_parser.add_argument(
        "--dns",
        action="append",
        dest="dns_names",
        metavar="NAME",
        help="one more host name the certificates answer to (a Kubernetes Service in front of "
        "the workload, say); may be given several times",
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

        return up(args.data_dir, args.base_port, args.spark_master, tls=args.tls)
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
        with BlockingAdapterClient(
            args.address, user=args.user, password=password, tls=client_tls(args)
        ) as connection:
            return run(connection, args.commands, progress_after=args.progress_after)
    if args.command == "certs":
        return _certs(args.directory, args.identities or [], args.dns_names or [])
    if args.command == "status":
        from tidemark.local.supervisor import status

        return status(args.base_port, args.data_dir)
    return 2


def _certs(directory: Path, uris: Sequence[str], dns_names: Sequence[str]) -> int:
    from tidemark.rpc.identity import Identity
    from tidemark.security.certs import default_identities, write_certificates

    try:
        identities = [Identity.parse(uri) for uri in uris] or default_identities()
    except ValueError as exc:
        print(f"tidemark certs: {exc}", file=sys.stderr)
        return 2
    for path in write_certificates(directory, identities, extra_dns=dns_names):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
