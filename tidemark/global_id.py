"""GlobalIds: the names of time-varying collections, never reused.

A GlobalId is a kind letter followed by a decimal number without leading zeros: ``u<N>`` for
user objects, ``s<N>`` for system objects (``u12``, ``s3``). The number fits in 64 bits.
"""

from __future__ import annotations

import re

from tidemark.errors import InvalidArgument

GLOBAL_ID_KINDS = ("u", "s")
_GLOBAL_ID = re.compile(r"([us])(0|[1-9][0-9]{0,19})")
_U64_MAX = (1 << 64) - 1


def validate_global_id(text: str) -> str:
    """Return ``text`` if it is a well-formed GlobalId, else raise ``InvalidArgument``."""
    match = _GLOBAL_ID.fullmatch(text) if isinstance(text, str) else None
    if match is None or int(match.group(2)) > _U64_MAX:
        raise InvalidArgument(
            f"{text!r} is not a GlobalId: expected 'u' (user) or 's' (system) followed by a "
            "number, like 'u12' or 's3'"
        )
    return text
