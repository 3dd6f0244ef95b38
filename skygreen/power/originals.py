"""The original power limit of each GPU skygreen capped on this machine, kept on disk.

A power limit outlives the process that set it (on a real GPU until reboot or reset), so a
`kill -9` leaves the cap on the board. Before skygreen's first change to a GPU it writes the
limit it found to `<data dir>/power/originals/<GPU uuid>.json`, with the run and process that
own the change; a clean restore deletes the file. The next start on the same machine finds a
file whose owner is dead and restores that original limit, not the capped one on the board.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from skygreen.files import write_atomic


@dataclass(frozen=True, kw_only=True, slots=True)
class Original:
    """One GPU's limit before skygreen first changed it, in watts, and the run and process that own the change."""

    uuid: str
    gpu: str
    original_limit_w: float
    run_id: str | None
    pid: int

    @property
    def owner_alive(self) -> bool:
        """Whether the process `pid` still runs: this process, or one that exists and is no zombie.

        A process this user may not signal counts as alive.
        """
        if self.pid == os.getpid():
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return _not_zombie(self.pid)


def _not_zombie(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return True
    return fields[0] != "Z"


def _original_from_json(raw: object) -> Original | None:
    """The record in an originals file's JSON, or None when it is not one: a foreign or hand-edited
    file must not stop `skygreen power` or a run's first cap, nor send a signal to pid 0."""
    if not isinstance(raw, dict):
        return None
    try:
        original = Original(**raw)
    except TypeError:
        return None
    limit_w, pid = original.original_limit_w, original.pid
    valid = (
        isinstance(original.uuid, str)
        and isinstance(original.gpu, str)
        and isinstance(limit_w, (int, float))
        and not isinstance(limit_w, bool)
        and math.isfinite(limit_w)
        and limit_w > 0
        and (original.run_id is None or isinstance(original.run_id, str))
        and isinstance(pid, int)
        and not isinstance(pid, bool)
        and pid > 0
    )
    return original if valid else None


class OriginalLimits:
    """One JSON file per GPU uuid under `root`."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    @classmethod
    def default(cls, environ: Mapping[str, str] | None = None) -> OriginalLimits:
        """The originals under skygreen's data folder on this machine: `<data dir>/power/originals`."""
        from skygreen.launch.registry import data_dir

        return cls(data_dir(environ) / "power" / "originals")

    def _path(self, uuid: str) -> Path:
        return self.root / f"{uuid.replace('/', '_')}.json"

    def get(self, uuid: str) -> Original | None:
        """The record for the GPU `uuid`, or None when there is none, or its file cannot be read or
        is not a record (not JSON, not an object, fields missing, unknown or of the wrong kind)."""
        try:
            raw = json.loads(self._path(uuid).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return _original_from_json(raw)

    def record(self, original: Original) -> None:
        """Write the record for `original.uuid` atomically, replacing any earlier one."""
        write_atomic(self._path(original.uuid), json.dumps(asdict(original), indent=1))

    def clear(self, uuid: str) -> None:
        """Delete the record for the GPU `uuid`; no error when there is none."""
        self._path(uuid).unlink(missing_ok=True)

    def all(self) -> list[Original]:
        """Every readable record, in file name order; empty when the folder does not exist."""
        if not self.root.is_dir():
            return []
        found = (self.get(p.stem) for p in sorted(self.root.glob("*.json")))
        return [o for o in found if o is not None]
