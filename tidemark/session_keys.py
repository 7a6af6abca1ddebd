"""The adapters' session keys file: named secret keys, one ``id:base64key`` per line.

The first key signs the sessions an adapter hands out; every key listed verifies them. That is
how keys rotate without breaking open sessions across several adapters:

1. add the new key as the second line everywhere (it verifies, nothing signs with it yet);
2. move it to the first line everywhere (new sessions are signed with it; the old key still
   verifies sessions clients hold);
3. once those sessions have moved on (a session is re-signed on every call), remove the old key.

Blank lines and lines starting with ``#`` are ignored. Key ids are 1 to 64 characters of
``A-Z a-z 0-9 . _ -``; keys are at least 16 bytes (``new_key_line`` makes 32 random ones).
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

MIN_KEY_BYTES = 16
KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


class KeyFileError(ValueError):
    """A keys file that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class SessionKey:
    key_id: str
    secret: bytes = b""

    def __repr__(self) -> str:  # never the secret, in logs or tracebacks
        return f"SessionKey({self.key_id!r})"


def parse_keys(text: str, source: str = "session keys") -> list[SessionKey]:
    """The keys of a keys file's ``text``, in order (the first signs)."""
    keys: list[SessionKey] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key_id, colon, encoded = line.partition(":")
        where = f"{source} line {number}"
        if not colon or not KEY_ID.fullmatch(key_id):
            raise KeyFileError(
                f"{where}: expected id:base64key with an id of 1 to 64 characters A-Z a-z 0-9 . _ -"
            )
        try:
            secret = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise KeyFileError(f"{where}: key {key_id!r} is not valid base64") from None
        if len(secret) < MIN_KEY_BYTES:
            raise KeyFileError(
                f"{where}: key {key_id!r} has {len(secret)} bytes, at least {MIN_KEY_BYTES} needed"
            )
        if any(key.key_id == key_id for key in keys):
            raise KeyFileError(f"{where}: key id {key_id!r} appears twice")
        keys.append(SessionKey(key_id, secret))
    if not keys:
        raise KeyFileError(f"{source}: no keys")
    return keys


def read_keys(path: Path) -> list[SessionKey]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise KeyFileError(f"cannot read session keys file {path}: {exc.strerror}") from None
    return parse_keys(text, str(path))


def new_key(key_id: str) -> SessionKey:
    return SessionKey(key_id, secrets.token_bytes(32))


def key_line(key: SessionKey) -> str:
    return f"{key.key_id}:{base64.b64encode(key.secret).decode()}"


def ensure_keys_file(path: Path, key_id: str = "local") -> Path:
    """``path``, created with one new random key (readable by its owner only) unless it exists;
    an existing file is kept, so sessions stay valid across restarts."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path  # made by someone else meanwhile
    with os.fdopen(descriptor, "w") as file:
        file.write(key_line(new_key(key_id)) + "\n")
    return path
