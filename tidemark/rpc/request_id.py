"""Request ids: one id follows a request through every process and log line it touches.

A client sends the id in the ``x-request-id`` metadata; the server logs it, binds it to the
logging context for the handler, and returns it in the trailing metadata. A handler that calls
another service passes the same id along (the client helpers read it from the context).
"""

from __future__ import annotations

import string
import uuid
from collections.abc import Iterable

import structlog

REQUEST_ID_KEY = "x-request-id"

# Ids come from clients and end up in log lines: accept only short, plain tokens so a caller
# cannot forge extra fields or lines.
_MAX_LENGTH = 128
_ALLOWED = frozenset(string.ascii_letters + string.digits + "-_.:/")


def new_request_id() -> str:
    return uuid.uuid4().hex


def is_valid_request_id(value: str) -> bool:
    return 0 < len(value) <= _MAX_LENGTH and all(ch in _ALLOWED for ch in value)


def request_id_from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The caller's request id, if it sent a valid one."""
    for key, value in metadata or ():
        if key == REQUEST_ID_KEY and isinstance(value, str) and is_valid_request_id(value):
            return value
    return None


def current_request_id() -> str | None:
    """The id of the request being handled in this task, if any."""
    value = structlog.contextvars.get_contextvars().get("request_id")
    return value if isinstance(value, str) else None
