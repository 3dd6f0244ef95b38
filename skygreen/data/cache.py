"""The local shard cache: files written whole (temporary name, then rename) and hashed.

The cache is this machine's own disk, so a file of the right size is trusted; what comes from
the bucket is hashed on the way in and checked against the manifest before it is renamed
into place.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path

_HASH_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """Return the file's sha256 as 64 hex digits, read in 1 MiB chunks.

    Args:
        path: the file.

    Returns:
        The hex digest.
    """
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_local(path: Path, data: bytes) -> None:
    """Write `data` to `path` whole: into a temporary file beside it, then renamed onto it.

    Creates the parent folders. A reader never sees a half-written file; a failed write
    leaves the old file, if any, in place.

    Args:
        path: the file to write.
        data: its bytes.
    """
    with temp_beside(path) as tmp:
        Path(tmp).write_bytes(data)


class temp_beside:
    """A temporary file name beside `path`, renamed onto it when the block succeeds.

    Beside, so the rename stays on one file system and is atomic; on an error the temporary
    file is removed and `path` left as it was.
    """

    def __init__(self, path: Path) -> None:
        """Name the file to write; nothing is created before the block starts.

        Args:
            path: the file that the temporary one replaces.
        """
        self.path = path

    def __enter__(self) -> str:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, self.tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        os.close(fd)
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            os.replace(self.tmp, self.path)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.tmp)
