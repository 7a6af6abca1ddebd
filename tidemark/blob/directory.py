"""Blob store in a local directory: the embedded default (``file:///path``).

A key maps to a file under the root; '/' in a key maps to subdirectories, so
``shards/u1/b7.parquet`` is ``ROOT/shards/u1/b7.parquet``.

Atomicity and durability: a value is written to a temporary file next to its final name,
flushed with ``fsync``, moved into place with ``os.replace`` (atomic on POSIX file systems)
and the directory is fsynced so the rename itself survives a power loss. A reader therefore
opens either the old file or the new one. Temporary names start with '.', which no key
segment may, so a temporary file left behind by a crash is never listed and never shadows a
key. Such leftovers are harmless garbage; they are not swept, because another process may
still be writing them.

Limitations, inherent to files: a key cannot also be a directory of other keys ("a" and
"a/b" cannot both exist; the second put raises ``FailedPrecondition``), and directories
emptied by deletes are left in place (a later put into them would otherwise race their
removal).

Blocking file I/O runs in worker threads so the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import secrets
from contextlib import suppress
from pathlib import Path

from tidemark.blob.base import Blob, is_key_segment, validate_key, validate_prefix
from tidemark.errors import FailedPrecondition, Indeterminate, InvalidArgument, Unavailable

_TEMP_PREFIX = ".tmp-"


def _fsync_directory(directory: Path) -> None:
    """Make the entries of ``directory`` (creations, renames, removals) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DirectoryBlob(Blob):
    """Files under ``root``; create instances with :meth:`open`."""

    def __init__(self, root: Path) -> None:
        self._root = root

    @property
    def root(self) -> Path:
        return self._root

    @classmethod
    async def open(cls, root: str | os.PathLike[str]) -> DirectoryBlob:
        """Open the store at ``root``, creating the directory if needed."""
        path = Path(root)
        if not path.is_absolute():
            raise InvalidArgument(f"blob directory must be an absolute path, not {str(root)!r}")
        try:
            await asyncio.to_thread(path.mkdir, parents=True, exist_ok=True)
        except FileExistsError:
            raise InvalidArgument(f"blob directory {path} exists and is not a directory") from None
        except OSError as exc:
            raise Unavailable(f"cannot create blob directory {path}: {exc}") from exc
        return cls(path)

    def _path(self, key: str) -> Path:
        # validate_key admits only plain segments, so the path stays under the root.
        return self._root.joinpath(*validate_key(key).split("/"))

    # --- put ---------------------------------------------------------------------------

    async def put(self, key: str, data: bytes) -> None:
        await asyncio.to_thread(self.put_now, key, bytes(data))

    def put_now(self, key: str, data: bytes) -> None:
        """``put`` in the calling thread, for a caller with no event loop of its own (a
        resident task's request loop): handing a small write to a thread and back costs
        about as much as the write."""
        path = self._path(key)
        try:
            self._make_directories(key, path.parent)
            temp = path.parent / f"{_TEMP_PREFIX}{secrets.token_hex(8)}"
            try:
                with open(temp, "xb") as file:
                    file.write(data)
                    file.flush()
                    os.fsync(file.fileno())
                os.replace(temp, path)
            except BaseException:
                with suppress(OSError):
                    os.unlink(temp)
                raise
        except IsADirectoryError:
            raise FailedPrecondition(
                f"blob key {key!r} is a directory of other keys in {self._root}"
            ) from None
        except OSError as exc:
            raise Unavailable(f"blob directory {self._root}: put {key!r} failed: {exc}") from exc
        try:
            _fsync_directory(path.parent)
        except OSError as exc:
            # The rename happened; only its durability is in doubt.
            raise Indeterminate(
                f"blob directory {self._root}: put {key!r} may not be durable: {exc}"
            ) from exc

    def _make_directories(self, key: str, directory: Path) -> None:
        """Create ``directory`` and any missing parents, fsyncing each new entry."""
        missing: builtins.list[Path] = []
        current = directory
        while current != self._root and not current.is_dir():
            missing.append(current)
            current = current.parent
        for new_directory in reversed(missing):
            try:
                os.mkdir(new_directory)
            except FileExistsError:
                if not new_directory.is_dir():  # a concurrent put may have created it
                    raise FailedPrecondition(
                        f"blob key {key!r} lies under an existing key "
                        f"{new_directory.relative_to(self._root).as_posix()!r} "
                        f"in {self._root}"
                    ) from None
            except NotADirectoryError:
                raise FailedPrecondition(
                    f"blob key {key!r} lies under an existing key in {self._root}"
                ) from None
            _fsync_directory(new_directory.parent)

    # --- get, delete -------------------------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        path = self._path(key)
        return await asyncio.to_thread(self._get_blocking, key, path)

    def _get_blocking(self, key: str, path: Path) -> bytes | None:
        try:
            with open(path, "rb") as file:
                return file.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        except OSError as exc:
            raise Unavailable(f"blob directory {self._root}: get {key!r} failed: {exc}") from exc

    async def delete(self, key: str) -> None:
        path = self._path(key)
        await asyncio.to_thread(self._delete_blocking, key, path)

    def _delete_blocking(self, key: str, path: Path) -> None:
        try:
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return
        except OSError as exc:
            raise Unavailable(f"blob directory {self._root}: delete {key!r} failed: {exc}") from exc
        try:
            _fsync_directory(path.parent)
        except OSError as exc:
            raise Indeterminate(
                f"blob directory {self._root}: delete {key!r} may not be durable: {exc}"
            ) from exc

    # --- list --------------------------------------------------------------------------

    async def list(self, prefix: str = "") -> builtins.list[str]:
        validate_prefix(prefix)
        return await asyncio.to_thread(self._list_blocking, prefix)

    def _list_blocking(self, prefix: str) -> builtins.list[str]:
        # Start at the deepest directory the prefix names completely; only the entries
        # there are filtered by the prefix's last, partial segment.
        directory_part, _, name_start = prefix.rpartition("/")
        start = self._root.joinpath(*directory_part.split("/")) if directory_part else self._root
        key_base = f"{directory_part}/" if directory_part else ""
        keys: builtins.list[str] = []
        try:
            self._collect(start, key_base, name_start, keys)
        except OSError as exc:
            raise Unavailable(
                f"blob directory {self._root}: list {prefix!r} failed: {exc}"
            ) from exc
        keys.sort()
        return keys

    def _collect(
        self, directory: Path, key_base: str, name_start: str, keys: builtins.list[str]
    ) -> None:
        try:
            entries = os.scandir(directory)
        except (FileNotFoundError, NotADirectoryError):
            return
        with entries:
            for entry in entries:
                # Temporary files (leading '.') and anything else no key could name are
                # not blobs.
                if not entry.name.startswith(name_start) or not is_key_segment(entry.name):
                    continue
                key = key_base + entry.name
                if entry.is_dir(follow_symlinks=False):
                    self._collect(Path(entry.path), f"{key}/", "", keys)
                elif entry.is_file(follow_symlinks=False):
                    keys.append(key)

    async def close(self) -> None:
        pass
