"""Blob stores: immutable byte strings under string keys (see :mod:`tidemark.blob.base`).

:func:`open_blob` picks the backend from a URL:

* ``s3://BUCKET[/PREFIX]?endpoint=HOST:PORT&secure=false`` — S3 or MinIO (production);
  credentials from the environment, see :mod:`tidemark.blob.s3`;
* ``file:///ABSOLUTE/PATH`` — a local directory (the embedded default);
* ``memory://`` (private) or ``memory://NAME`` (shared in the process) — unit tests.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from tidemark.blob.base import Blob, validate_key, validate_prefix
from tidemark.blob.directory import DirectoryBlob
from tidemark.blob.memory import MemoryBlob, named_store
from tidemark.blob.s3 import S3Blob, S3Settings
from tidemark.errors import InvalidArgument

__all__ = [
    "Blob",
    "DirectoryBlob",
    "MemoryBlob",
    "S3Blob",
    "S3Settings",
    "open_blob",
    "validate_key",
    "validate_prefix",
]


async def open_blob(url: str) -> Blob:
    """Open the blob store named by ``url``; ``InvalidArgument`` if the URL is malformed.

    Opening may touch the backend (the S3 bucket is created if missing, the directory made),
    so it can also raise ``Unavailable``.
    """
    if not isinstance(url, str):
        raise InvalidArgument("blob URL must be a string")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise InvalidArgument(f"malformed blob URL {url!r}: {exc}") from None
    blob: Blob
    if parts.scheme == "s3":
        blob = await S3Blob.open(S3Settings.from_url(url))
    elif parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
            raise InvalidArgument(f"blob URL must look like file:///absolute/path, not {url!r}")
        blob = await DirectoryBlob.open(unquote(parts.path))
    elif parts.scheme == "memory":
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise InvalidArgument(f"blob URL must look like memory:// or memory://NAME: {url!r}")
        blob = MemoryBlob(named_store(parts.netloc) if parts.netloc else None)
    else:
        raise InvalidArgument(f"unsupported blob URL {url!r}: use s3://, file:// or memory://")
    blob.url = url
    return blob
