"""Session settings: their defaults, validation, ``SET`` and ``SHOW``.

The adapter keeps nothing between calls; a session is what the client sends back each time
(``adapter.proto`` Session): its settings, and the open transaction (``transactions``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from services.adapter.sql.catalog_view import search_path
from services.adapter.sql.errors import SqlError
from tidemark.v1 import adapter_pb2

UNDEFINED_PARAMETER = "42704"
INVALID_PARAMETER_VALUE = "22023"

STRICT_SERIALIZABLE = "strict serializable"
SERIALIZABLE = "serializable"
ISOLATION_LEVELS = (STRICT_SERIALIZABLE, SERIALIZABLE)


@dataclass(frozen=True)
class Setting:
    default: str
    description: str
    choices: tuple[str, ...] | None = None
    integer: bool = False


SETTINGS: dict[str, Setting] = {
    "cluster": Setting("default", "the compute cluster that runs this session's queries"),
    "database": Setting("tidemark", "the database names are resolved in"),
    "search_path": Setting("public", "the schemas names are resolved in, in order"),
    "transaction_isolation": Setting(
        STRICT_SERIALIZABLE, "the isolation level of transactions", ISOLATION_LEVELS
    ),
    "statement_timeout": Setting(
        "0", "milliseconds a statement may run before it is cancelled (0: no limit)", integer=True
    ),
    "statement_memory_limit": Setting(
        "0",
        "MiB a query's evaluation may hold in compute before it fails with 53200 (0: the "
        "cluster's budget; a larger value is lowered to it)",
        integer=True,
    ),
    "application_name": Setting("", "the client's name, for logs"),
    "client_encoding": Setting("UTF8", "the client's character set", ("UTF8",)),
    "datestyle": Setting("ISO, MDY", "how dates are shown", ("ISO, MDY",)),
    "timezone": Setting("UTC", "the session's time zone", ("UTC",)),
}

_ALIASES = {
    "transaction isolation level": "transaction_isolation",
    "time zone": "timezone",
    "schema": "search_path",
}


def canonical_name(name: str) -> str:
    lowered = " ".join(name.strip().lower().split())
    return _ALIASES.get(lowered, lowered)


def normalize(name: str, value: str, position: int = 0) -> tuple[str, str]:
    """``(canonical name, checked value)`` for ``SET name = value``."""
    key = canonical_name(name)
    setting = SETTINGS.get(key)
    if setting is None:
        raise SqlError(
            UNDEFINED_PARAMETER, f'unrecognized configuration parameter "{name}"', position
        )
    cleaned = value.strip()
    if key == "transaction_isolation":
        cleaned = " ".join(cleaned.lower().split())
    if key == "client_encoding" and cleaned.upper().replace("-", "") == "UTF8":
        cleaned = "UTF8"
    if key == "timezone" and cleaned.upper() in ("UTC", "GMT", "Z", "+00:00", "ETC/UTC"):
        cleaned = "UTC"
    if key == "datestyle" and cleaned.upper().replace(" ", "") in ("ISO,MDY", "ISO"):
        cleaned = "ISO, MDY"
    if setting.integer:
        try:
            number = int(cleaned)
        except ValueError:
            raise SqlError(
                INVALID_PARAMETER_VALUE,
                f'invalid value for parameter "{key}": "{value}" (an integer is needed)',
                position,
            ) from None
        if number < 0:
            raise SqlError(
                INVALID_PARAMETER_VALUE, f'"{key}" must not be negative, got {number}', position
            )
        cleaned = str(number)
    if setting.choices is not None and cleaned not in setting.choices:
        raise SqlError(
            INVALID_PARAMETER_VALUE,
            f'invalid value for parameter "{key}": "{value}"',
            position,
            hint=f"available values: {', '.join(setting.choices)}",
        )
    if key == "cluster" and not cleaned:
        raise SqlError(INVALID_PARAMETER_VALUE, "the cluster name must not be empty", position)
    return key, cleaned


class Settings:
    """A session's settings: what the client sent, over the defaults."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self.values = dict(values)

    @classmethod
    def from_session(cls, session: adapter_pb2.Session) -> Settings:
        return cls(session.settings)

    def get(self, name: str) -> str:
        key = canonical_name(name)
        if key in self.values:
            return self.values[key]
        setting = SETTINGS.get(key)
        if setting is None:
            raise SqlError(UNDEFINED_PARAMETER, f'unrecognized configuration parameter "{name}"')
        return setting.default

    def set(self, name: str, value: str, position: int = 0) -> None:
        key, checked = normalize(name, value, position)
        self.values[key] = checked

    def reset(self, name: str, position: int = 0) -> None:
        key = canonical_name(name)
        if key not in SETTINGS:
            raise SqlError(
                UNDEFINED_PARAMETER, f'unrecognized configuration parameter "{name}"', position
            )
        self.values.pop(key, None)

    def all(self) -> list[tuple[str, str, str]]:
        """``(name, value, description)`` of every setting, by name."""
        return [(name, self.get(name), SETTINGS[name].description) for name in sorted(SETTINGS)]

    @property
    def cluster(self) -> str:
        return self.get("cluster")

    @property
    def database(self) -> str:
        return self.get("database")

    @property
    def search_path(self) -> list[str]:
        return search_path(self.values)

    @property
    def statement_memory_bytes(self) -> int:
        """The ``statement_memory_limit`` in bytes (0: the cluster's budget)."""
        try:
            return max(0, int(self.get("statement_memory_limit"))) << 20
        except ValueError:
            return 0

    @property
    def statement_timeout_ms(self) -> int:
        try:
            return int(self.get("statement_timeout"))
        except ValueError:
            return 0

    def check(self) -> None:
        """Reject a value a client put in the session itself that ``SET`` would not accept
        (names the adapter does not know are left alone: clients may keep their own)."""
        for name, value in list(self.values.items()):
            if canonical_name(name) not in SETTINGS:
                continue
            key, checked = normalize(name, value)
            if key != name:
                del self.values[name]
            self.values[key] = checked
