"""A changeover: from a recovered VM's first setup line to its first new optimizer step.

The rendered setup script stamps its start and end in `~/.skygreen/changeover/<run id>.started`
and `.ended` (Unix seconds, one number each): setup's environment does not reach the run, a file
does. The runtime reads them when it writes its segment (`read_setup`); the restore is timed by
the runtime itself. Readers summarise segments into `Changeover` rows for `status`, `cost` and
`report`, and `plan` learns the typical changeover per cloud and GPU from earlier runs.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from skygreen.ledger.records import Segment

STAMP_DIR = Path(".skygreen") / "changeover"
SETUP_MAX_AGE_S = 6 * 3600.0
"""Stamps older than this are another life's (a reused image): this VM's setup did not write them."""
MIN_RATE_BYTES = 100_000_000
"""Restores smaller than this say more about latency than about the link: their rate is not learned."""


def stamp_paths(run_id: str, home: Path) -> tuple[Path, Path]:
    """Where setup stamps its start and its end for `run_id` under `home`."""
    base = home / STAMP_DIR
    return base / f"{run_id}.started", base / f"{run_id}.ended"


def _read_stamp(path: Path) -> float | None:
    try:
        value = float(path.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None
    return value if value > 0 else None


def read_setup(run_id: str, *, home: Path, process_started_at: float) -> dict[str, float]:
    """`setup_started_at` and `setup_s` from this VM's stamps, read once for both the segment's
    start (the VM is paid from setup's first line) and its changeover figures; empty where no
    setup ran (a local run) or the stamps are not this process's (a start after the process, or
    more than `SETUP_MAX_AGE_S` before it)."""
    started_path, ended_path = stamp_paths(run_id, home)
    started = _read_stamp(started_path)
    if started is None or not 0.0 <= process_started_at - started <= SETUP_MAX_AGE_S:
        return {}
    ended = _read_stamp(ended_path)
    out = {"setup_started_at": started}
    if ended is not None and started <= ended <= process_started_at:
        out["setup_s"] = ended - started
    return out


def redone_steps(earlier: Sequence[Segment], resumed_at: int) -> int | None:
    """Steps the earlier lives of a run trained beyond `resumed_at`, the step this life resumes
    from, and that it trains again: the furthest step any of them reached (its last checkpoint,
    or the step its ledger heartbeat recorded past that checkpoint before a kill -9) minus
    `resumed_at`. None for a run's first life."""
    if not earlier:
        return None
    furthest = max(max(s.step, s.reached_step or 0) for s in earlier)
    return max(0, furthest - resumed_at)


def restore_figures(
    manifest: Any, started_monotonic_s: float, *, blob_names: Iterable[str] | None = None
) -> dict[str, float | int]:
    """The restore of a checkpoint whose loading began at `started_monotonic_s` (time.monotonic):
    its seconds so far and the bytes of the blobs this process downloaded (`blob_names`; None:
    every blob the manifest lists)."""
    names = manifest.blobs.keys() if blob_names is None else blob_names
    return {
        "restore_s": time.monotonic() - started_monotonic_s,
        "restore_bytes": sum(manifest.blobs[name].size for name in names),
    }


@dataclass(frozen=True, kw_only=True, slots=True)
class Changeover:
    """One segment's way back to training: where, and how long each part took."""

    segment: int
    cloud: str
    gpu: str | None
    setup_s: float | None
    restore_s: float | None
    restore_bytes: int | None
    restore_bytes_per_s: float | None
    to_first_step_s: float | None
    """From the first setup line (or the process start) to the first new step."""
    redone_steps: int | None

    def to_json(self) -> dict[str, object]:
        """Every field under its own name."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def changeover_of(s: Segment) -> Changeover:
    """The changeover figures a segment carries."""
    return Changeover(
        segment=s.segment,
        cloud=s.place.cloud,
        gpu=s.place.gpu,
        setup_s=s.setup_s,
        restore_s=s.restore_s,
        restore_bytes=s.restore_bytes,
        restore_bytes_per_s=s.restore_bytes_per_s,
        to_first_step_s=s.changeover_s,
        redone_steps=s.redone_steps,
    )


def changeovers(segments: Sequence[Segment]) -> list[Changeover]:
    """The changeovers of a run: every segment that resumed from a checkpoint (a restore)."""
    return [changeover_of(s) for s in segments if s.restore_bytes]


def describe(c: Changeover) -> str:
    """One line: `segment 2: setup 41 s, restore 12 s (1.4 GB at 117 MB/s), first step after 58 s, 30 steps redone`."""
    parts = [f"setup {c.setup_s:.3g} s" if c.setup_s is not None else "no setup"]
    if c.restore_s is not None:
        size = f" ({(c.restore_bytes or 0) / 1e9:.3g} GB" + (
            f" at {c.restore_bytes_per_s / 1e6:.3g} MB/s)" if c.restore_bytes_per_s else ")"
        )
        parts.append(f"restore {c.restore_s:.3g} s{size}")
    if c.to_first_step_s is not None:
        parts.append(f"first step after {c.to_first_step_s:.3g} s")
    if c.redone_steps is not None:
        parts.append(f"{c.redone_steps} steps redone")
    return f"segment {c.segment}: " + ", ".join(parts)


def typical_changeover_s(rows: Sequence[Changeover]) -> dict[tuple[str, str | None], tuple[float, int]]:
    """(cloud, GPU) and (cloud, None) -> (median seconds to the first new step, how many)."""
    groups: dict[tuple[str, str | None], list[float]] = {}
    for c in rows:
        if c.to_first_step_s is None:
            continue
        groups.setdefault((c.cloud, c.gpu), []).append(c.to_first_step_s)
        if c.gpu is not None:
            groups.setdefault((c.cloud, None), []).append(c.to_first_step_s)
    return {key: (_median(values), len(values)) for key, values in groups.items()}


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def restore_rates(rows: Sequence[Changeover]) -> Mapping[str, float]:
    """cloud -> the median restore rate measured, bytes per second, over restores of at least
    `MIN_RATE_BYTES`."""
    groups: dict[str, list[float]] = {}
    for c in rows:
        if c.restore_bytes_per_s and (c.restore_bytes or 0) >= MIN_RATE_BYTES:
            groups.setdefault(c.cloud, []).append(c.restore_bytes_per_s)
    return {cloud: _median(v) for cloud, v in groups.items()}
