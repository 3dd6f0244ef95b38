"""Local files written so that a reader, or a process killed mid-write, never sees half of one.

Run records, rendered YAML and local checkpoint objects all go through `write_atomic`: a
temporary file beside the target, fsynced, renamed over it, and the folder fsynced so the
rename itself survives a crash. Temporary names start with `TEMP_PREFIX`, so listings can skip
the leftovers of a killed writer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

TEMP_PREFIX = ".tmp-"
COPY_CHUNK_BYTES = 8 * 1024 * 1024
DATA_DIR_ENV = "SKYGREEN_DATA_DIR"


def data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """skygreen's folder for runs, local buckets and rendered tasks on this machine."""
    environ = os.environ if environ is None else environ
    if environ.get(DATA_DIR_ENV):
        return Path(environ[DATA_DIR_ENV]).expanduser()
    base = environ.get("XDG_DATA_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".local" / "share")
    return Path(base).expanduser() / "skygreen"


def inside_parts(name: object) -> list[str]:
    """The parts of `name`, a `/`-separated path that stays inside whatever folder it is joined
    to: none empty, `.` or `..`, no backslash or NUL. Names read from a bucket (blob and shard
    keys) become local paths, and a bucket is untrusted.

    Raises:
        ValueError: the name could leave the folder (or is not a string).
    """
    if not isinstance(name, str) or "\\" in name or "\0" in name:
        raise ValueError(f"{name!r} is not a relative path inside its folder")
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"{name!r} is not a relative path inside its folder")
    return parts


def write_atomic(target: Path, data: str | bytes | bytearray | memoryview | BinaryIO) -> None:
    """Write `data` (text as UTF-8, bytes, or a binary stream copied in chunks) to `target`."""
    import tempfile  # here, not at the top: `plan` reads measured speeds through this module and never writes

    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            if isinstance(data, str):
                out.write(data.encode("utf-8"))
            elif isinstance(data, (bytes, bytearray, memoryview)):
                out.write(data)
            else:
                import shutil

                shutil.copyfileobj(data, out, COPY_CHUNK_BYTES)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def fsync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable (POSIX); harmless where directories cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
