"""A local directory as a checkpoint store (`file://` URLs and plain paths).

Used on laptops, by `skygreen up --local`, by the CPU smoke test and on shared filesystems.
Every write goes to a temporary file beside its target, is flushed to disk, and is renamed
over the target: a reader sees the old object or the whole new one, never half of one, even
if the process dies mid-write.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from skygreen.checkpoint.store import DEFAULT_RETRY, RetryPolicy, call_with_retries, cut_back, rewind
from skygreen.errors import KeyNotFoundError, StoreError, TransientStoreError
from skygreen.files import COPY_CHUNK_BYTES, TEMP_PREFIX, write_atomic

# errno -> transient? Full disks and permissions do not heal by waiting; NFS hiccups can.
_TRANSIENT_ERRNOS = {errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT, errno.EIO}


class LocalStore:
    """Keys are relative paths under `root`; "/" separates folders on every platform."""

    def __init__(self, root: str | os.PathLike[str], *, retry: RetryPolicy = DEFAULT_RETRY) -> None:
        self.root = Path(os.path.expanduser(str(root))).absolute()
        self.url = str(self.root)
        self.retry = retry
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(
                f"{self.root}: checkpoint bucket path exists but is not a directory\n  fix: choose a directory path"
            )

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise StoreError(f"{self.root}: bad store key {key!r} (relative, '/'-separated, no '.' or '..')")
        return self.root.joinpath(*parts)

    def _run(self, what: str, operation, *, on_retry: Callable[[], None] | None = None):
        return call_with_retries(
            lambda: _mapped(self.root, what, operation), what=what, policy=self.retry, on_retry=on_retry
        )

    def put(self, key: str, data: bytes | BinaryIO) -> None:
        """Write atomically (temporary file, fsync, rename), making folders as needed.

        A key with an empty, "." or ".." part, or a leading "/", is a `StoreError`; so are a
        full disk and a permission error. A stream is written from where it stands and rewound
        there before a retry; one that cannot be rewound makes a retry a `StoreError` instead.
        """
        target = self._path(key)
        self._run(f"write {target}", lambda: write_atomic(target, data), on_retry=rewind(data))

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Copy the file at `path` in, atomically as `put` writes."""
        target = self._path(key)

        def copy() -> None:
            with open(path, "rb") as src:
                write_atomic(target, src)

        self._run(f"write {target}", copy)

    def get(self, key: str) -> bytes:
        """The file's bytes; `KeyNotFoundError` where no file is at the key."""
        path = self._path(key)
        return self._run(f"read {path}", lambda: _read_existing(path, key).read_bytes())

    def get_to(self, key: str, fileobj: BinaryIO) -> None:
        """Copy the file into `fileobj` in `COPY_CHUNK_BYTES` chunks; `KeyNotFoundError` where
        no file is at the key. Before a retry `fileobj` is cut back to where it stood, so no part
        is written twice (one that cannot seek makes a retry a `StoreError` instead)."""
        path = self._path(key)

        def copy() -> None:
            with _read_existing(path, key).open("rb") as src:
                shutil.copyfileobj(src, fileobj, COPY_CHUNK_BYTES)

        self._run(f"read {path}", copy, on_retry=cut_back(fileobj))

    def get_range(self, key: str, start: int, stop: int) -> bytes:
        """Bytes `start` up to (not including) `stop` of the file; a file shorter than that is a
        `StoreError`. Lets a big blob on a shared filesystem be read by several threads at once."""
        path = self._path(key)

        def read() -> bytes:
            with _read_existing(path, key).open("rb") as src:
                data = os.pread(src.fileno(), stop - start, start)
            if len(data) != stop - start:
                raise StoreError(f"read {path}: got {len(data)} of {stop - start} bytes at {start}")
            return data

        return self._run(f"read {path}", read)

    def list(self, prefix: str = "") -> list[str]:
        """Keys of the files under the root that start with `prefix`, sorted; the temporary files
        of a killed writer are left out, and a root that does not exist yet lists as empty."""
        if not self.root.is_dir():
            return []
        keys = []
        for folder, dirs, files in os.walk(self.root):
            dirs.sort()
            rel = Path(folder).relative_to(self.root).as_posix()
            for name in sorted(files):
                if name.startswith(TEMP_PREFIX):
                    continue
                key = name if rel == "." else f"{rel}/{name}"
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        """Remove the file, then the folders it leaves empty, up to the root (which stays); a
        missing file is not an error."""
        path = self._path(key)
        self._run(f"delete {path}", lambda: path.unlink(missing_ok=True))
        _prune_empty_parents(path.parent, self.root)

    def exists(self, key: str) -> bool:
        """Whether a regular file is at the key's path."""
        return self._path(key).is_file()

    def size(self, key: str) -> int:
        """The file's length in bytes; `KeyNotFoundError` where no file is at the key."""
        path = self._path(key)
        return self._run(f"stat {path}", lambda: _read_existing(path, key).stat().st_size)

    def storage_class(self, key: str) -> str | None:
        """Always None: a local directory has no storage classes."""
        return None

    def set_storage_class(self, key: str, storage_class: str) -> None:
        """Always raises `StoreError`: a local directory has no storage classes to move to."""
        raise StoreError(f"{self.root}: a local directory has no storage classes; cold storage does not apply")


def _read_existing(path: Path, key: str) -> Path:
    if not path.is_file():
        raise KeyNotFoundError(f"{path}: no such checkpoint object {key!r}")
    return path


def _prune_empty_parents(folder: Path, root: Path) -> None:
    while folder != root and root in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


def _mapped(root: Path, what: str, operation):
    """Run a filesystem operation, mapping OSError to skygreen's store errors."""
    try:
        return operation()
    except PermissionError as e:
        raise StoreError(
            f"{what}: permission denied on the checkpoint directory {root}\n"
            "  fix: make it writable by this user, or choose another bucket path"
        ) from e
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise StoreError(
                f"{what}: the disk holding {root} is full\n  fix: free space or choose another bucket path"
            ) from e
        if e.errno in _TRANSIENT_ERRNOS:
            raise TransientStoreError(f"{what}: {e}") from e
        raise StoreError(f"{what}: {e}") from e
