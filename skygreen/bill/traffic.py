"""The bytes and requests a run makes against its bucket on one offer.

    saves         = max(1, training hours x 3600 / interval)   (the final commit at least)
    uploaded_gb   = saves x save_gb                     (VM -> bucket)
    downloaded_gb = expected preemptions x save_gb      (bucket -> VM, one restore each; a fresh
                                                         start restores nothing)
    gb_months     = min(keep, saves) x save_gb x span hours / 730
    writes        = saves x (parts per save + SAVE_OVERHEAD_WRITES)
    reads         = restores x (ranged parts per restore + RESTORE_OVERHEAD_READS)

`save_gb` is what one save commits, all shards together: the checkpoint's size after
`half_precision` (`skygreen.plan.memory.checkpoint_gb`), times the trainable fraction where only
the trainable state is saved (adapters). The kept checkpoints are priced for the run's span
only: what stays in the bucket afterwards is the user's to keep or delete.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

MIB = 1024 * 1024
HOURS_PER_MONTH = 730.0
"""Providers bill GB-months of 730 hours (365 x 24 / 12)."""
UPLOAD_PART_BYTES: Mapping[str, int] = {"aws": 16 * MIB, "gcp": 100 * MIB, "azure": 8 * MIB}
"""One write request per part: S3 multipart parts of 16 MiB (`checkpoint.s3_store`), GCS
resumable-upload chunks of 100 MiB (`checkpoint.gcs_store.CHUNK_BYTES`), Azure blocks of 8 MiB
(`checkpoint.azure_store.BLOCK_BYTES`)."""
READ_PART_BYTES = 16 * MIB
"""One ranged GET per part on a restore (`checkpoint.ranged.RangedDownload.part_bytes`)."""
SAVE_OVERHEAD_WRITES = 6
"""Per save besides the parts: manifest, lease check, retention's list and deletes, the ledger."""
RESTORE_OVERHEAD_READS = 4
"""Per restore besides the parts: the lease, the list of manifests, the manifest, the ledger."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunTraffic:
    """What one run moves, keeps and asks of its bucket."""

    save_gb: float
    saves: float
    restores: float
    gb_months: float
    writes: float
    reads: float

    @property
    def uploaded_gb(self) -> float:
        """VM to bucket: every save."""
        return self.saves * self.save_gb

    @property
    def downloaded_gb(self) -> float:
        """Bucket to VM: every restore after a preemption."""
        return self.restores * self.save_gb

    @property
    def moved_gb(self) -> float:
        """Both directions together: `bytes_moved_gb` in the plan."""
        return self.uploaded_gb + self.downloaded_gb


def save_gb(checkpoint_gb: float, *, trainable_fraction: float = 1.0) -> float:
    """What one save commits: the checkpoint's size (already after `half_precision`), times the
    fraction of the state that is trainable when only that is saved (1.0: a full fine-tune).

    Raises:
        ValueError: a negative size or a fraction outside (0, 1].
    """
    if not (checkpoint_gb >= 0 and math.isfinite(checkpoint_gb)):
        raise ValueError(f"checkpoint_gb must be a finite number >= 0, got {checkpoint_gb}")
    if not 0 < trainable_fraction <= 1:
        raise ValueError(f"trainable_fraction must be in (0, 1], got {trainable_fraction}")
    return checkpoint_gb * trainable_fraction


def parts(gb: float, part_bytes: int, *, files: int = 1) -> int:
    """Requests to move `gb` split over `files` files in parts of `part_bytes` (each file at least one)."""
    if gb <= 0:
        return 0
    per_file_bytes = gb * 1e9 / files
    return files * max(1, math.ceil(per_file_bytes / part_bytes))


def run_traffic(
    *,
    save_gb: float,
    interval_s: float | None,
    training_hours: float,
    expected_preemptions: float,
    keep: int,
    span_hours: float,
    bucket_cloud: str,
    files_per_save: int = 1,
) -> RunTraffic:
    """The run's saves, restores, kept GB-months and requests (see the module docstring).

    Args:
        save_gb: one save, all shards together (`save_gb()`).
        interval_s: seconds of training between saves; None: no save along the way (no
            preemptions to guard against), only the final commit every run ends with.
        training_hours: hours the GPUs train, redone work included (wall time less restarts).
        expected_preemptions: restores, one per preemption.
        keep: checkpoints the bucket keeps (`checkpoint.keep`).
        span_hours: the run's wall time, start to end.
        bucket_cloud: the bucket's cloud, for its part sizes.
        files_per_save: files one save writes (one per rank when sharded).
    """
    saves = max(1.0, training_hours * 3600.0 / interval_s if interval_s else 0.0)
    kept = min(float(keep), saves)
    write_parts = parts(save_gb, UPLOAD_PART_BYTES[bucket_cloud], files=files_per_save)
    read_parts = parts(save_gb, READ_PART_BYTES, files=files_per_save)
    return RunTraffic(
        save_gb=save_gb,
        saves=saves,
        restores=expected_preemptions,
        gb_months=kept * save_gb * span_hours / HOURS_PER_MONTH,
        writes=saves * (write_parts + SAVE_OVERHEAD_WRITES),
        reads=expected_preemptions * (read_parts + RESTORE_OVERHEAD_READS),
    )
