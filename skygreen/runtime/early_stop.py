"""Early stopping as a small state machine whose whole state survives a resume.

No ROI in polishing noise: when the watched metric has not improved by more than `min_delta`
for `patience` evaluations in a row, stop. `grace` evaluations at the start never count
against patience (and never set the best value), for curricula where the loss rises before it
falls. The state is plain numbers, so it goes into a checkpoint as is.

Pure: no torch import.
"""

from __future__ import annotations

import math
from typing import Any

from skygreen.task.spec import EarlyStopConfig

__all__ = ["EarlyStopConfig", "EarlyStopper"]


class EarlyStopper:
    """Feed it each evaluation of the metric; it says when to stop.

    Attributes:
        evaluations: evaluations seen, grace ones included.
        best: the best value so far (None before the first finite one after the grace).
        bad_evaluations: evaluations in a row without an improvement of more than `min_delta`.
        stopped: whether patience ran out; it stays set.
    """

    def __init__(self, config: EarlyStopConfig) -> None:
        """Start with nothing seen.

        Args:
            config: the metric, mode (`min`/`max`), patience, min_delta and grace.
        """
        self.config = config
        self.evaluations = 0
        self.best: float | None = None
        self.bad_evaluations = 0
        self.stopped = False

    def update(self, value: float) -> bool:
        """Record one evaluation of the metric.

        A NaN or infinite value is never an improvement: a diverged run counts against patience.
        The first `grace` evaluations are counted and otherwise ignored.

        Args:
            value: the metric's value at this evaluation.

        Returns:
            True once the run should stop (and from then on).
        """
        value = float(value)
        self.evaluations += 1
        if self.stopped or self.evaluations <= self.config.grace:
            return self.stopped
        if self._improves(value):
            self.best = value
            self.bad_evaluations = 0
        else:
            self.bad_evaluations += 1
            self.stopped = self.bad_evaluations >= self.config.patience
        return self.stopped

    def _improves(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.best is None:
            return True
        if self.config.mode == "min":
            return value < self.best - self.config.min_delta
        return value > self.best + self.config.min_delta

    def state_dict(self) -> dict[str, Any]:
        """Return the stopper's whole state as plain numbers, for a checkpoint (the config is not part of it)."""
        return {
            "evaluations": self.evaluations,
            "best": self.best,
            "bad_evaluations": self.bad_evaluations,
            "stopped": self.stopped,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a state `state_dict` returned.

        Args:
            state: the saved state.

        Raises:
            KeyError: `state` lacks one of `evaluations`, `best`, `bad_evaluations`, `stopped`.
        """
        self.evaluations = int(state["evaluations"])
        self.best = None if state["best"] is None else float(state["best"])
        self.bad_evaluations = int(state["bad_evaluations"])
        self.stopped = bool(state["stopped"])
