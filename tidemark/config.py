"""Service settings, declared once, read from flags and ``TIDEMARK_*`` environment variables.

A service declares its settings as a frozen dataclass extending :class:`ServiceConfig`, one
field per setting, each made with :func:`setting`::

    @dataclass(frozen=True)
    class OracleConfig(ServiceConfig):
        listen: str = listen_setting("127.0.0.1:7001")
        consensus_url: str = consensus_url_setting()
        batch_limit: int = setting(1024, help="most calls answered by one backend round trip")

:func:`load_config` then builds the typed object: a field ``batch_limit`` is the flag
``--batch-limit`` and the variable ``TIDEMARK_BATCH_LIMIT``; a flag beats the variable, which
beats the default. ``--help`` lists every flag with its variable and default. Field types may be
``str``, ``int``, ``float`` or ``bool`` (``--flag`` / ``--no-flag``; variables accept
1/0, true/false, yes/no, on/off).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

from tidemark.logging import LOG_FORMATS, LOG_LEVELS
from tidemark.rpc.tls import TlsSettings

ENV_PREFIX = "TIDEMARK_"
_SETTING = "tidemark.setting"

C = TypeVar("C", bound="ServiceConfig")


@dataclass(frozen=True)
class SettingInfo:
    help: str
    choices: tuple[str, ...] | None = None
    metavar: str | None = None


def setting(
    default: Any,
    *,
    help: str,
    choices: Sequence[str] | None = None,
    metavar: str | None = None,
) -> Any:
    """A dataclass field that is also a command-line flag and an environment variable."""
    info = SettingInfo(help, tuple(choices) if choices is not None else None, metavar)
    return dataclasses.field(default=default, metadata={_SETTING: info})


def env_var(name: str) -> str:
    """The environment variable for the setting called ``name``."""
    return ENV_PREFIX + name.upper()


def flag(name: str) -> str:
    """The command-line flag for the setting called ``name``."""
    return "--" + name.replace("_", "-")


def listen_setting(default: str = "127.0.0.1:0") -> Any:
    return setting(
        default,
        help="address to serve gRPC on, host:port (port 0 lets the OS choose)",
        metavar="HOST:PORT",
    )


def consensus_url_setting(default: str | None = None) -> Any:
    if default is None:
        default = "sqlite://" + str(Path("data/consensus.db").absolute())
    return setting(
        default,
        help="consensus backend: etcd://host:port[,host:port...] in production (over TLS with "
        "?ca=PATH&cert=PATH&key=PATH), sqlite:///path for one machine",
        metavar="URL",
    )


def blob_url_setting(default: str | None = None) -> Any:
    if default is None:
        default = "file://" + str(Path("data/blobs").absolute())
    return setting(
        default,
        help="blob store: s3://bucket/prefix in production (?endpoint=HOST:PORT, secure=false "
        "for HTTP, ca=PATH for a private CA), file:///path for one machine",
        metavar="URL",
    )


@dataclass(frozen=True)
class ServiceConfig:
    """Settings every service has."""

    listen: str = listen_setting()
    log_format: str = setting(
        "auto",
        help="log line format; auto: console on a terminal, JSON otherwise",
        choices=LOG_FORMATS,
    )
    log_level: str = setting("info", help="lowest level logged", choices=LOG_LEVELS)
    shutdown_grace: float = setting(
        10.0,
        help="seconds calls in flight get to finish after SIGTERM before they are cancelled",
        metavar="SECONDS",
    )
    metrics_port: int = setting(
        0,
        help="port of the Prometheus /metrics endpoint, on the host of --listen (0: none)",
        metavar="PORT",
    )
    tls_cert: str = setting(
        "",
        help="PEM certificate naming this service's tidemark:// identity; with --tls-key and "
        "--tls-ca the service serves mTLS, and presents it on its own calls (empty: plaintext)",
        metavar="PATH",
    )
    tls_key: str = setting("", help="PEM private key of --tls-cert", metavar="PATH")
    tls_ca: str = setting(
        "",
        help="PEM certificate of the CA that signs the peers' certificates (clients' and servers')",
        metavar="PATH",
    )
    reflection: bool = setting(
        True, help="serve gRPC server reflection (lists the services and their messages)"
    )

    def tls(self) -> TlsSettings | None:
        """The TLS settings of the service's own channels and (requiring client certificates)
        of its server; ``None``: plaintext. ValueError when only some files are given."""
        return TlsSettings.from_paths(self.tls_cert, self.tls_key, self.tls_ca)


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not a boolean (use true/false)")


_PARSERS: dict[type, Callable[[str], Any]] = {str: str, int: int, float: float, bool: _parse_bool}


@dataclass(frozen=True)
class _Setting:
    name: str
    kind: type
    default: Any
    info: SettingInfo

    def parse(self, text: str) -> Any:
        value = _PARSERS[self.kind](text)
        if self.info.choices is not None and value not in self.info.choices:
            raise ValueError(f"{text!r} is not one of {', '.join(self.info.choices)}")
        return value

    def parse_flag(self, text: str) -> Any:
        # argparse shows an ArgumentTypeError's own message; for a ValueError it would name
        # this method instead.
        try:
            return self.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    @property
    def metavar(self) -> str:
        if self.info.metavar is not None:
            return self.info.metavar
        if self.info.choices is not None:
            return "{" + ",".join(self.info.choices) + "}"
        return self.kind.__name__.upper()


def _settings(config_type: type[ServiceConfig]) -> list[_Setting]:
    hints = get_type_hints(config_type)
    found = []
    for field in dataclasses.fields(config_type):
        info = field.metadata.get(_SETTING)
        if info is None:
            raise TypeError(f"{config_type.__name__}.{field.name} is not declared with setting()")
        kind = hints[field.name]
        if kind not in _PARSERS:
            raise TypeError(f"{config_type.__name__}.{field.name}: unsupported type {kind!r}")
        found.append(_Setting(field.name, kind, field.default, info))
    return found


def build_parser(
    config_type: type[ServiceConfig], *, prog: str | None = None, description: str | None = None
) -> argparse.ArgumentParser:
    """The argument parser for ``config_type``; no flag has a default of its own, so a flag
    left out is absent from the parsed namespace and the environment gets its say."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=f"Each flag may instead be given as the environment variable shown beside it "
        f"({ENV_PREFIX}<NAME>); a flag on the command line wins over the variable.",
    )
    for item in _settings(config_type):
        shown = "(empty)" if item.default == "" else item.default
        described = f"{item.info.help} [env {env_var(item.name)}; default: {shown}]"
        common: dict[str, Any] = {"dest": item.name, "default": argparse.SUPPRESS}
        if item.kind is bool:
            parser.add_argument(
                flag(item.name), action=argparse.BooleanOptionalAction, help=described, **common
            )
        else:
            parser.add_argument(
                flag(item.name),
                type=item.parse_flag,
                help=described,
                metavar=item.metavar,
                **common,
            )
    return parser


def load_config(
    config_type: type[C],
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    prog: str | None = None,
    description: str | None = None,
) -> C:
    """Read ``config_type`` from ``argv`` (default: the command line) and ``environ`` (default:
    the process environment). Bad values exit with status 2 and a message naming the flag or
    variable, like any argparse error."""
    env = os.environ if environ is None else environ
    parser = build_parser(config_type, prog=prog, description=description)
    given = vars(parser.parse_args(argv))
    values: dict[str, Any] = {}
    for item in _settings(config_type):
        if item.name in given:
            values[item.name] = given[item.name]
        elif env_var(item.name) in env:
            try:
                values[item.name] = item.parse(env[env_var(item.name)])
            except ValueError as exc:
                parser.error(f"environment variable {env_var(item.name)}: {exc}")
    config = config_type(**values)
    try:
        config.tls()
    except ValueError as exc:
        parser.error(str(exc))
    return config
