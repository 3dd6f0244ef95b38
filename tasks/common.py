"""What every example task shares: the task-size knob and a slice of a prepared dataset."""

from __future__ import annotations

import os
import sys
from typing import Any

from skygreen.task.settings import TASK_SIZE_ENV  # `full` (default) or `small`; `skygreen smoke` sets small


def task_size() -> str:
    size = os.environ.get(TASK_SIZE_ENV, "full").strip().lower() or "full"
    if size not in ("full", "small"):
        sys.exit(f"error: {TASK_SIZE_ENV}={size!r}: expected 'full' or 'small'")
    return size


class Rows:
    """Rows `[start, stop)` of a prepared dataset, as a dataset of its own (train / validation)."""

    def __init__(self, dataset: Any, start: int, stop: int) -> None:
        self.dataset, self.start, self.stop = dataset, start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, index: int) -> Any:
        return self.dataset[self.start + index]
