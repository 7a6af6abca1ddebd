"""Who is calling: the role each Adapter call (and pgwire connection) acts as.

gRPC callers name themselves in call metadata, ``tidemark-user`` and ``tidemark-password``.
The adapter's ``auth`` setting says what that is worth:

- ``trust`` (the default, the embedded ``make run``): no user means the bootstrap superuser, a
  named user is taken at its word (as PostgreSQL's ``trust``: no password is checked, but the
  role must exist and have LOGIN, else 28000).
- ``password``: the user must be a catalog role with LOGIN whose SCRAM verifier the password
  matches; anything else fails with 28P01. A verified password is remembered for a minute
  (keyed by a keyed hash of it and the verifier it matched, so a changed password or a dropped
  role takes effect at once) so PBKDF2 does not run on every call.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from services.adapter.sql.errors import SqlError
from tidemark.catalog_items import role_named
from tidemark.scram import ScramVerifier
from tidemark.v1 import catalog_pb2

TRUST = "trust"
PASSWORD = "password"
AUTH_MODES = (TRUST, PASSWORD)
USER_METADATA = "tidemark-user"
PASSWORD_METADATA = "tidemark-password"
INVALID_PASSWORD = "28P01"
INVALID_AUTHORIZATION = "28000"
DEFAULT_SUPERUSER = "tidemark"
CACHE_SECONDS = 60.0
CACHE_ENTRIES = 4096
_ROLES_MEMO = "roles_by_name"


@dataclass(frozen=True)
class Principal:
    """The role a session acts as. ``administrator``: a superuser by configuration (the users
    of pgwire's password file), whatever the catalog holds."""

    name: str
    administrator: bool = False


Metadata = Iterable[tuple[str, str | bytes]]


class CallAuthenticator:
    """Turns a call's metadata into a :class:`Principal`, or an SqlError (28P01, 28000)."""

    def __init__(
        self,
        mode: str,
        items: Callable[[], Iterable[catalog_pb2.CatalogItem]],
        bootstrap_superuser: str = DEFAULT_SUPERUSER,
        *,
        cache_seconds: float = CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if mode not in AUTH_MODES:
            raise ValueError(f"auth must be one of {', '.join(AUTH_MODES)}, got {mode!r}")
        self.mode = mode
        self.items = items
        self.bootstrap_superuser = bootstrap_superuser
        self.cache_seconds = cache_seconds
        self.clock = clock
        self._key = secrets.token_bytes(32)
        # (user, keyed hash of the password) -> (the stored key it matched, until when).
        self._verified: dict[tuple[str, bytes], tuple[bytes, float]] = {}

    @property
    def requires_passwords(self) -> bool:
        return self.mode == PASSWORD

    def from_metadata(self, metadata: Metadata | None) -> Principal:
        values: dict[str, str] = {}
        for key, value in metadata or ():
            if key in (USER_METADATA, PASSWORD_METADATA):
                values[key] = value.decode() if isinstance(value, bytes) else value
        return self.authenticate(values.get(USER_METADATA, ""), values.get(PASSWORD_METADATA))

    def authenticate(self, user: str, password: str | None) -> Principal:
        if self.mode == TRUST:
            if not user:
                return Principal(self.bootstrap_superuser)
            self.check_login(user)
            return Principal(user)
        if not user:
            raise SqlError(
                INVALID_AUTHORIZATION,
                f"no user given: send the call metadata {USER_METADATA} and {PASSWORD_METADATA}",
            )
        if not self._password_matches(user, password or ""):
            raise SqlError(INVALID_PASSWORD, f'password authentication failed for user "{user}"')
        return Principal(user)

    def check_login(self, user: str) -> None:
        """28000 unless ``user`` is a role that may log in (what trust still checks)."""
        role = self._role(user)
        if role is None:
            raise SqlError(INVALID_AUTHORIZATION, f'role "{user}" does not exist')
        if not role.role.login:
            raise SqlError(INVALID_AUTHORIZATION, f'role "{user}" is not permitted to log in')

    def _role(self, user: str) -> catalog_pb2.CatalogItem | None:
        items = self.items()
        memo = getattr(items, "memo", None)  # a CatalogState: index its roles once
        if not isinstance(memo, dict):
            return role_named(items, user)
        roles = memo.get(_ROLES_MEMO)
        if roles is None:
            roles = {i.name.item: i for i in items if i.WhichOneof("body") == "role"}
            memo[_ROLES_MEMO] = roles
        found = roles.get(user)
        return found if isinstance(found, catalog_pb2.CatalogItem) else None

    def _password_matches(self, user: str, password: str) -> bool:
        role = self._role(user)
        if role is None or not role.role.login or not role.role.HasField("password"):
            return False
        stored_key = role.role.password.stored_key
        key = (user, hmac.new(self._key, password.encode(), hashlib.sha256).digest())
        now = self.clock()
        remembered = self._verified.get(key)
        if (
            remembered is not None
            and remembered[1] > now
            and hmac.compare_digest(remembered[0], stored_key)
        ):
            return True
        if not ScramVerifier.from_proto(role.role.password).matches(password):
            return False
        if len(self._verified) >= CACHE_ENTRIES:
            self._verified.clear()
        self._verified[key] = (stored_key, now + self.cache_seconds)
        return True
