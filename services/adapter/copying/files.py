"""The files a ``COPY ... FROM '<location>'`` names, read by the adapter.

A location is a path or ``file://`` URL on the adapter's machine, or an object in S3:
``s3://bucket/key?endpoint=host:port&secure=false`` (credentials from the environment, as for
the blob store). A directory, or an S3 location ending in ``/``, stands for every file in it
(their contents go in together, as one write). Files are fetched concurrently and decoded on
worker threads: Arrow's readers release the interpreter while they parse.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from services.adapter.sql.errors import SqlError
from tidemark.blob.s3 import S3Blob, S3Settings
from tidemark.errors import TidemarkError

UNDEFINED_FILE = "58P01"
IO_ERROR = "58030"
# Files fetched at once from S3.
CONCURRENT_FETCHES = 8


async def read_location(location: str) -> list[tuple[str, bytes]]:
    """Each file's name and contents, in name order. 58P01 when there is none."""
    parts = urlsplit(location)
    if parts.scheme == "s3":
        return await _read_s3(location)
    if parts.scheme not in ("", "file"):
        raise SqlError(
            "0A000",
            f"COPY FROM reads paths, file:// and s3:// URLs, not {parts.scheme}://",
        )
    path = Path(unquote(parts.path) if parts.scheme == "file" else location)
    return await asyncio.to_thread(_read_local, path)


def _read_local(path: Path) -> list[tuple[str, bytes]]:
    try:
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
            if not files:
                raise SqlError(UNDEFINED_FILE, f'directory "{path}" holds no files')
            return [(str(p), p.read_bytes()) for p in files]
        return [(str(path), path.read_bytes())]
    except FileNotFoundError:
        raise SqlError(
            UNDEFINED_FILE,
            f'could not open file "{path}" for reading: no such file or directory',
            hint="COPY FROM a path reads the adapter's file system; from the client's, use "
            "COPY ... FROM STDIN (tidemark sql: \\copy)",
        ) from None
    except OSError as exc:
        raise SqlError(IO_ERROR, f'could not read "{path}": {exc.strerror or exc}') from None


async def _read_s3(location: str) -> list[tuple[str, bytes]]:
    parts = urlsplit(location)
    key_path = unquote(parts.path).lstrip("/")
    directory, _, name = key_path.rpartition("/")
    prefix_url = urlunsplit(("s3", parts.netloc, "/" + directory, parts.query, ""))
    try:
        settings = S3Settings.from_url(prefix_url)
        blob = await S3Blob.open(settings)
    except TidemarkError as exc:
        raise SqlError(IO_ERROR, f"could not open {location}: {exc.message}") from None
    try:
        keys = [name] if name else await blob.list("")
        if not keys:
            raise SqlError(UNDEFINED_FILE, f"no objects under {location}")
        gate = asyncio.Semaphore(CONCURRENT_FETCHES)

        async def fetch(key: str) -> tuple[str, bytes]:
            async with gate:
                data = await blob.get(key)
            if data is None:
                raise SqlError(UNDEFINED_FILE, f"no object s3://{parts.netloc}/{directory}/{key}")
            return key, data

        return list(await asyncio.gather(*(fetch(k) for k in sorted(keys))))
    except TidemarkError as exc:
        raise SqlError(IO_ERROR, f"could not read {location}: {exc.message}") from None
    finally:
        await blob.close()
