"""Changeovers measured by a task's earlier runs on this machine, which the plan uses in place
of the flat restart time and the default restore rate.

A sibling of `speeds` for the same reason: `skygreen plan` reads these on every call, so this
module reads each run's `measured.json` (which names its task) directly and imports neither the
registry nor the pricing nor the run records.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from skygreen.costs.speeds import MEASURED_FILE
from skygreen.files import data_dir

if TYPE_CHECKING:
    from skygreen.launch.registry import Registry
    from skygreen.ledger.changeover import Changeover


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasuredChangeovers:
    """What earlier runs of a task measured of their changeovers, for `plan`."""

    seconds: Mapping[str, float]
    """ "cloud/GPU" and "cloud" -> median seconds from the first setup line to the first new step."""
    counts: Mapping[str, int]
    """The same keys -> how many changeovers each median is taken over."""
    restore_gb_per_s: float | None
    """The median restore rate measured, GB/s; None where no restore large enough was timed."""


def _rows(root: Path, target: str) -> list[Changeover]:
    rows: list[Changeover] = []
    for path in sorted(root.glob(f"*/{MEASURED_FILE}")) if root.is_dir() else ():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if str(Path(str(data["task_path"])).resolve()) != target:
                continue
            from skygreen.ledger.changeover import Changeover  # only once a run of this task is found

            rows.extend(Changeover(**row) for row in data.get("changeovers") or ())
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a damaged file does not hide the other runs
    return rows


def measured_changeovers(task_path: str | Path, *, registry: Registry | None = None) -> MeasuredChangeovers:
    """Changeovers measured by earlier runs of this task.

    Args:
        task_path: The task file; runs whose `measured.json` names the same resolved path count.
        registry: Where the runs' folders are; None means this machine's default.

    Returns:
        The median seconds from the first setup line to the first new step per "cloud/GPU" and
        per "cloud", with how many each, and the median restore rate in GB/s.
    """
    root = registry.root if registry is not None else data_dir() / "runs"
    rows = _rows(root, str(Path(task_path).resolve()))
    if not rows:  # no earlier run of this task: nothing measured, and `plan` skips the next import
        return MeasuredChangeovers(seconds={}, counts={}, restore_gb_per_s=None)
    from skygreen.ledger.changeover import restore_rates, typical_changeover_s

    typical = typical_changeover_s(rows)
    seconds = {(cloud if gpu is None else f"{cloud}/{gpu}"): s for (cloud, gpu), (s, _) in typical.items()}
    counts = {(cloud if gpu is None else f"{cloud}/{gpu}"): n for (cloud, gpu), (_, n) in typical.items()}
    rates = sorted(restore_rates(rows).values())
    rate = rates[len(rates) // 2] / 1e9 if rates else None
    return MeasuredChangeovers(seconds=seconds, counts=counts, restore_gb_per_s=rate)
