"""Choosing a consensus backend by URL.

- ``etcd://host:port[,host:port...][?timeout=SECONDS&ca=PATH&cert=PATH&key=PATH&tls=BOOL]``:
  etcd v3; endpoints are tried in turn when one cannot be reached. ``timeout`` bounds every
  call (default 5 s). TLS: ``ca`` is the PEM file of the CA that signed the etcd servers'
  certificates; ``cert`` and ``key`` are this client's certificate and key, for an etcd run
  with ``--client-cert-auth``; ``tls=true`` alone uses the system's trusted roots. Any of them
  switches TLS on (the files are read when the URL is opened); none: plaintext.
- ``sqlite:///absolute/path.db`` or ``sqlite://relative/path.db`` ``[?timeout=SECONDS]``:
  one SQLite file, shared safely by the processes of one machine. Everything between
  ``sqlite://`` and ``?`` is the file path. ``timeout`` is how long a write waits for another
  writer's lock before failing with ``Unavailable`` (default 5 s).
- ``memory://``: a private in-process store, for unit tests.
"""

from __future__ import annotations

import math
from urllib.parse import parse_qs

from tidemark.consensus.base import Consensus
from tidemark.consensus.etcd import DEFAULT_TIMEOUT_S, Endpoint, EtcdConsensus
from tidemark.consensus.etcd_tls import EtcdTls
from tidemark.consensus.memory import MemoryConsensus
from tidemark.consensus.sqlite import DEFAULT_BUSY_TIMEOUT_S, SqliteConsensus
from tidemark.errors import InvalidArgument

ETCD_DEFAULT_PORT = 2379
_ETCD_TLS_OPTIONS = ("ca", "cert", "key", "tls")
_EXAMPLES = "etcd://host:port[,host:port], sqlite:///path/file.db or memory://"


def open_consensus(url: str) -> Consensus:
    """The consensus backend ``url`` names; :class:`InvalidArgument` for a malformed URL.
    Nothing is contacted yet: connections are made on first use."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        raise InvalidArgument(f"consensus URL {url!r} has no scheme; expected {_EXAMPLES}")
    body, _, query = rest.partition("?")
    options = _parse_options(url, query)
    scheme = scheme.lower()
    if scheme == "memory":
        _allow_options(url, options, set())
        if body.strip("/"):
            raise InvalidArgument(f"consensus URL {url!r}: memory:// takes no name or path")
        return MemoryConsensus()
    if scheme == "sqlite":
        _allow_options(url, options, {"timeout"})
        if not body or body == "/":
            raise InvalidArgument(f"consensus URL {url!r} names no file; e.g. sqlite:///path/db")
        if body.strip("/") == ":memory:":
            raise InvalidArgument(
                f"consensus URL {url!r}: an in-memory SQLite database is private to one "
                "connection; use memory:// instead"
            )
        timeout = _seconds(url, options, "timeout", DEFAULT_BUSY_TIMEOUT_S)
        return SqliteConsensus(body, busy_timeout_s=timeout)
    if scheme == "etcd":
        _allow_options(url, options, {"timeout", *_ETCD_TLS_OPTIONS})
        timeout = _seconds(url, options, "timeout", DEFAULT_TIMEOUT_S)
        endpoints = _parse_endpoints(url, body)
        return EtcdConsensus(endpoints, timeout_s=timeout, tls=_etcd_tls(url, options))
    raise InvalidArgument(f"consensus URL {url!r}: unknown scheme {scheme!r}; expected {_EXAMPLES}")


def _etcd_tls(url: str, options: dict[str, str]) -> EtcdTls | None:
    switch = options.get("tls", "").lower()
    if switch not in ("", "true", "false"):
        raise InvalidArgument(f"consensus URL {url!r}: tls must be true or false")
    files = {name: options.get(name, "") for name in ("ca", "cert", "key")}
    if switch == "false" and any(files.values()):
        raise InvalidArgument(f"consensus URL {url!r}: tls=false with ca, cert or key")
    if switch != "true" and not any(files.values()):
        return None
    try:
        return EtcdTls.from_files(**files)
    except InvalidArgument as exc:
        raise InvalidArgument(f"consensus URL {url!r}: {exc.message}") from None


def _parse_options(url: str, query: str) -> dict[str, str]:
    try:
        parsed = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise InvalidArgument(f"consensus URL {url!r}: malformed query: {exc}") from exc
    options: dict[str, str] = {}
    for name, values in parsed.items():
        if len(values) != 1:
            raise InvalidArgument(f"consensus URL {url!r}: option {name!r} given twice")
        options[name] = values[0]
    return options


def _allow_options(url: str, options: dict[str, str], allowed: set[str]) -> None:
    unknown = sorted(set(options) - allowed)
    if unknown:
        hint = f"; allowed: {', '.join(sorted(allowed))}" if allowed else ""
        raise InvalidArgument(f"consensus URL {url!r}: unknown option(s) {unknown}{hint}")


def _seconds(url: str, options: dict[str, str], name: str, default: float) -> float:
    if name not in options:
        return default
    try:
        value = float(options[name])
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise InvalidArgument(
            f"consensus URL {url!r}: {name} must be a positive number of seconds, "
            f"got {options[name]!r}"
        )
    return value


def _parse_endpoints(url: str, body: str) -> list[Endpoint]:
    hosts = body.rstrip("/")
    if "/" in hosts:
        raise InvalidArgument(f"consensus URL {url!r}: etcd URLs take no path")
    endpoints = [_parse_endpoint(url, item.strip()) for item in hosts.split(",") if item.strip()]
    if not endpoints:
        raise InvalidArgument(f"consensus URL {url!r} names no etcd endpoint; e.g. etcd://h:2379")
    return endpoints


def _parse_endpoint(url: str, item: str) -> Endpoint:
    if item.startswith("["):  # [IPv6]:port
        host, bracket, after = item[1:].partition("]")
        if not bracket or (after and not after.startswith(":")):
            raise InvalidArgument(f"consensus URL {url!r}: malformed endpoint {item!r}")
        port_text = after[1:] if after else ""
    else:
        host, _, port_text = item.partition(":")
    if not host:
        raise InvalidArgument(f"consensus URL {url!r}: endpoint {item!r} has no host")
    if not port_text:
        return Endpoint(host, ETCD_DEFAULT_PORT)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InvalidArgument(f"consensus URL {url!r}: endpoint {item!r} has a bad port")
    return Endpoint(host, int(port_text))
