"""Speeds measured by a task's earlier runs on this machine, which the plan uses in place of
the shipped prior (`skygreen.gpus`).

Kept apart from `costing` (which prices ledgers) because `skygreen plan` reads these on every
call: this module reads each run's `measured.json` (which names its task) and imports neither the
registry nor the pricing, so the plan path stays as light as it was before costs existed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skygreen.files import data_dir

if TYPE_CHECKING:
    from skygreen.launch.registry import Registry, RunRecord
    from skygreen.ledger.records import Segment

MEASURED_FILE = "measured.json"
"""In each run's folder: what the run measured (samples per second per GPU, samples needed,
changeovers)."""


def save_measured(registry: Registry, record: RunRecord, segments: Sequence[Segment]) -> None:
    """Write what this run measured: samples per second per GPU (one GPU of that type), and
    the samples the run needed when it completed, and each resumed segment's changeover
    (`skygreen.costs.changeovers` learns the plan's restart from them)."""
    from skygreen.ledger.changeover import changeovers

    per_gpu: dict[str, list[float]] = {}
    for s in segments:
        if s.place.gpu and s.samples_per_s:
            per_gpu.setdefault(s.place.gpu, []).append(s.samples_per_s / max(1, s.place.gpu_count * s.place.nodes))
    completed = any(s.end in ("completed", "early-stopped") for s in segments)
    data = {
        "task_path": record.task_path,
        "samples_per_s_per_gpu": {g: sum(v) / len(v) for g, v in per_gpu.items()},
        "total_samples": max(s.samples for s in segments) if completed else None,
        "changeovers": [c.to_json() for c in changeovers(segments)],
        "checkpoint_bytes": next((s.checkpoint_bytes for s in reversed(segments) if s.checkpoint_bytes), None),
    }
    try:
        from skygreen.files import write_atomic

        write_atomic(registry.run_dir(record.run_id) / MEASURED_FILE, json.dumps(data, sort_keys=True) + "\n")
    except OSError:
        pass


def measured_speeds(
    spec: Any, task_path: str | Path, *, registry: Registry | None = None
) -> dict[str, tuple[float, int]]:
    """Relative speeds (A100 = 1.0, as `skygreen.gpus`) measured by earlier runs of this task,
    with how many runs measured each: GPU -> (speed, runs).

    A completed run says how many samples the whole job takes (S). A GPU that trains at r
    samples per second then needs S / r / 3600 hours, and the task's `work` ({gpu_hours, on})
    says that is work_gpu_hours x speed(on) / speed(gpu) hours: so speed(gpu) = work_gpu_hours
    x speed(on) x 3600 x r / S. Without a completed run there is no S, and nothing is measured.
    """
    from skygreen.plan.cost import RunModel

    root = registry.root if registry is not None else data_dir() / "runs"
    target = str(Path(task_path).resolve())
    totals: list[int] = []
    rates: dict[str, list[float]] = {}
    for path in sorted(root.glob(f"*/{MEASURED_FILE}")) if root.is_dir() else ():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if str(Path(str(data["task_path"])).resolve()) != target:
                continue
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a damaged file does not hide the other runs
        if data.get("total_samples"):
            totals.append(int(data["total_samples"]))
        for gpu, rate in (data.get("samples_per_s_per_gpu") or {}).items():
            rates.setdefault(gpu, []).append(float(rate))
    if not totals or not rates:
        return {}
    total = sorted(totals)[len(totals) // 2]
    work = spec.green.work
    on_speed = RunModel(work_gpu_hours=work.gpu_hours, work_on=work.gpu, speed=spec.green.speed).relative_speed(
        work.gpu
    )
    return {gpu: (work.gpu_hours * on_speed * 3600.0 * (sum(v) / len(v)) / total, len(v)) for gpu, v in rates.items()}


def measured_checkpoint_gb(task_path: str | Path, *, registry: Registry | None = None) -> float | None:
    """The checkpoint size earlier runs of this task committed (the runtime records it in the
    ledger, `Segment.checkpoint_bytes`), in GB; None before any run recorded one.

    The median over runs: a LoRA run's checkpoint is its adapter and optimizer state, which the
    plan's estimate from `model:` (the full state unless told otherwise) cannot know.
    """
    root = registry.root if registry is not None else data_dir() / "runs"
    target = str(Path(task_path).resolve())
    sizes: list[int] = []
    for path in sorted(root.glob(f"*/{MEASURED_FILE}")) if root.is_dir() else ():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if str(Path(str(data["task_path"])).resolve()) == target and data.get("checkpoint_bytes"):
                sizes.append(int(data["checkpoint_bytes"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a damaged file does not hide the other runs
    if not sizes:
        return None
    return sorted(sizes)[len(sizes) // 2] / 1e9
