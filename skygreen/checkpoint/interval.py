"""When to checkpoint: every N steps, every T seconds, or auto (the interval of least cost), decided purely.

Auto is Daly's optimum for the measured save; where the runtime knows its price and a save's
bytes cost dollars between the VM and the bucket (`IntervalPolicy.bill`), it is the plan's
dollar-optimal interval for the measured bytes (`skygreen.bill.interval.auto_interval_s`).
Time is passed in, so the schedule is testable without clocks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol


def _log_interval(message: str, *args: object) -> None:
    """Log at INFO on `skygreen.checkpoint`; `logging` is imported here, not at the top, because
    the planner imports this module for its rates and never logs."""
    import logging

    logging.getLogger("skygreen.checkpoint").info(message, *args)


PREEMPTION_RATE_PER_HOUR: Mapping[str, float] = {"aws": 0.47, "gcp": 0.24, "azure": 0.24}
"""Assumed spot preemption rates, the one table the planner and the runtime both use.

Per hour a spot node is alive (a task overrides them with `skygreen.preemption.rate_per_hour`);
`tests/test_replay.py` derives them from the real traces
in `../shared/spot-traces` and fails if they drift from what the traces say:
- aws 0.47/h: AWS p3.2xlarge (V100) spot kept alive and relaunched for a week in four zones
  (skypilot-org/spot-traces, 2023-04): 202 preemptions in 431 alive hours, pooled; 0.31-0.74
  per zone (mean lifetimes 1.4-2.9 h).
- gcp 0.24/h: GCP a3-highgpu-1g (H100) spot probes every 10 min in 13 zones for 14.6 days
  (SkyNomad artifact, 2025-10): 834 available -> unavailable transitions in 3,497 available
  hours, pooled; 0.003-1.8 per zone. Probes, not running instances: an upper estimate.
- azure 0.24/h: no public trace; Azure publishes eviction-rate bands per size and region but
  not a rate, so skygreen assumes GCP's.
"""
UNKNOWN_CLOUD_PREEMPTIONS_PER_HOUR = 0.1
"""Assumed where the table has no answer (a local machine, a run that names no cloud): mean 10 h
between preemptions, so `every: auto` still checkpoints every few minutes."""


class SaveBill(Protocol):
    """What a save's bytes cost, as `skygreen.bill.interval.SaveBill` says (that module builds on
    this one, so the policy names the shape it needs rather than importing it)."""

    def save_usd(self, save_bytes: int, *, daly_s: float) -> float:
        """One save's dollars at the rate a month of saves every `daly_s` pays."""
        ...

    def interval_s(self, *, stall_s: float, save_bytes: int, mtbf_s: float, restore_s: float = 0.0) -> float:
        """The interval of least total cost for a save of `stall_s` and `save_bytes`."""
        ...

    def describe(self) -> str:
        """Where the bytes go and the price, for the log: `azure/westus3 -> aws/us-east-1 at $8.19/h`."""
        ...


def preemption_rate_per_hour(cloud: str | None, overrides: Mapping[str, float] | None = None) -> float | None:
    """The task's own rate for `cloud`, else the table's; None for a cloud the table does not know."""
    if cloud is None:
        return None
    if overrides and cloud in overrides:
        return overrides[cloud]
    return PREEMPTION_RATE_PER_HOUR.get(cloud)


def optimal_interval_s(save_cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum checkpoint interval (compute time between saves).

    tau = sqrt(2 C M) x (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C   for C < 2M, else M
    (Daly 2006, "A higher order estimate of the optimum checkpoint interval for restart
    dumps"; its first term is Young's sqrt(2 C M)). Checkpointing more often wastes save cost;
    less often loses more work per preemption. An infinite M (no preemptions) gives infinity.
    """
    if save_cost_s < 0 or mtbf_s <= 0:
        raise ValueError(f"need save_cost_s >= 0 and mtbf_s > 0, got {save_cost_s}, {mtbf_s}")
    if math.isinf(mtbf_s):
        return math.inf
    if save_cost_s >= 2 * mtbf_s:
        return mtbf_s
    ratio = save_cost_s / (2 * mtbf_s)
    return math.sqrt(2 * save_cost_s * mtbf_s) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - save_cost_s


@dataclass(frozen=True, kw_only=True, slots=True)
class IntervalPolicy:
    """When to checkpoint: every N steps, every T seconds, or auto (Daly's optimum).

    Auto needs a measured save cost; until the first save it uses `first_auto_s`. The auto
    interval is never shorter than the last upload took, so saves do not queue up behind
    each other, and is clamped to [min_interval_s, max_interval_s]. With a `bill` and a save
    whose bytes cost dollars, auto is the dollar-optimal interval instead, held by the plan's
    cap (`skygreen.bill.interval.DOLLAR_LOSS_CAP`) rather than `max_interval_s`.
    """

    every_steps: int | None = None
    every_s: float | None = None
    preemptions_per_hour: float = UNKNOWN_CLOUD_PREEMPTIONS_PER_HOUR
    first_auto_s: float = 120.0
    min_interval_s: float = 10.0
    max_interval_s: float = 3600.0
    bill: SaveBill | None = None
    """Where the VM and the bucket are and the run's price; None: bytes are free (Daly)."""

    def __post_init__(self) -> None:
        if self.every_steps is not None and self.every_s is not None:
            raise ValueError("IntervalPolicy: set every_steps or every_s, not both")
        if self.every_steps is not None and (not isinstance(self.every_steps, int) or self.every_steps < 1):
            raise ValueError(f"IntervalPolicy.every_steps must be an integer >= 1, got {self.every_steps!r}")
        if self.every_s is not None and not self.every_s > 0:
            raise ValueError(f"IntervalPolicy.every_s must be > 0, got {self.every_s!r}")
        if not self.preemptions_per_hour > 0:
            raise ValueError(f"IntervalPolicy.preemptions_per_hour must be > 0, got {self.preemptions_per_hour!r}")
        if not 0 < self.min_interval_s <= self.max_interval_s:
            raise ValueError("IntervalPolicy: need 0 < min_interval_s <= max_interval_s")

    @property
    def mode(self) -> str:
        """The schedule's kind: "steps" when `every_steps` is set, "seconds" when `every_s` is, else "auto"."""
        if self.every_steps is not None:
            return "steps"
        return "seconds" if self.every_s is not None else "auto"

    @property
    def mtbf_s(self) -> float:
        """Mean time between preemptions, in seconds, from `preemptions_per_hour`."""
        return 3600.0 / self.preemptions_per_hour

    def save_usd(self, save_cost_s: float, save_bytes: int | None) -> float:
        """What a save of `save_bytes` costs in transfer (`SaveBill.save_usd`); 0 without a bill."""
        if self.bill is None or not save_bytes:
            return 0.0
        return self.bill.save_usd(save_bytes, daly_s=optimal_interval_s(save_cost_s, self.mtbf_s))

    def auto_interval_s(
        self, save_cost_s: float | None, upload_s: float | None = None, save_bytes: int | None = None
    ) -> float:
        """The auto interval in seconds for a save that blocked training for `save_cost_s`.

        With no measured cost yet, `first_auto_s` as it stands. Otherwise Daly's optimum, raised
        to `upload_s` (the last upload's duration) where that is longer, then clamped to
        [`min_interval_s`, `max_interval_s`]; the clamp wins over the upload floor. Where the
        save's `save_bytes` cost dollars (`bill`), the dollar-optimal interval
        (`SaveBill.interval_s`, restored in `upload_s`), held by the plan's cap alone.
        """
        if save_cost_s is None:
            return self.first_auto_s
        upper_s = self.max_interval_s
        if self.bill is not None and save_bytes and self.save_usd(save_cost_s, save_bytes) > 0:
            interval_s = self.bill.interval_s(
                stall_s=save_cost_s, save_bytes=save_bytes, mtbf_s=self.mtbf_s, restore_s=upload_s or 0.0
            )
            upper_s = max(upper_s, interval_s)
        else:
            interval_s = optimal_interval_s(save_cost_s, self.mtbf_s)
        return min(max(interval_s, upload_s or 0.0, self.min_interval_s), upper_s)


class CheckpointSchedule:
    """Decides, step by step, whether a checkpoint is due. Time is passed in (pure)."""

    def __init__(self, policy: IntervalPolicy, *, start_step: int, start_s: float) -> None:
        self.policy = policy
        self.last_step = start_step
        self.last_s = start_s
        self.interval_s: float | None = policy.every_s if policy.mode == "seconds" else None
        if policy.mode == "auto":
            self.interval_s = policy.first_auto_s
        self.save_usd: float | None = None
        """What the last measured save cost in transfer (auto with a bill); None before one."""
        _log_interval("checkpoint interval: %s", self.describe())

    def due(self, step: int, now_s: float) -> bool:
        """Whether to checkpoint at `step`: `every_steps` steps, or the current interval in
        seconds, since the last save (or the start). `now_s` must come from the same clock as
        `start_s`; the runtime passes `time.monotonic()`."""
        if self.policy.every_steps is not None:
            return step - self.last_step >= self.policy.every_steps
        return self.interval_s is not None and now_s - self.last_s >= self.interval_s

    def saved(
        self,
        step: int,
        now_s: float,
        *,
        save_cost_s: float | None = None,
        upload_s: float | None = None,
        save_bytes: int | None = None,
    ) -> None:
        """Record a save; in auto mode, re-derive the interval from the measured cost (and, with
        the policy's bill, the bytes the last committed checkpoint moved)."""
        self.last_step = step
        self.last_s = now_s
        if self.policy.mode == "auto" and save_cost_s is not None:
            if self.policy.bill is not None and save_bytes:
                self.save_usd = self.policy.save_usd(save_cost_s, save_bytes)
            new_s = self.policy.auto_interval_s(save_cost_s, upload_s, save_bytes)
            if self.interval_s is None or abs(new_s - self.interval_s) > 0.1 * self.interval_s:
                self.interval_s = new_s
                _log_interval("checkpoint interval: %s (save cost %.3f s)", self.describe(), save_cost_s)
            else:
                self.interval_s = new_s

    def cost_meta(self) -> dict[str, float]:
        """For a commit's meta: `checkpoint_save_usd`, what the last measured save cost in
        transfer, where the auto interval weighed it; empty otherwise."""
        return {} if self.save_usd is None else {"checkpoint_save_usd": round(self.save_usd, 6)}

    def describe(self) -> str:
        """The interval in words for the log: "every 500 steps", "every 600 s", or the auto
        interval with the preemption rate it assumes and, where bytes cost, what a save costs."""
        if self.policy.mode == "steps":
            return f"every {self.policy.every_steps} steps"
        if self.policy.mode == "seconds":
            return f"every {self.interval_s:g} s"
        rate = f"{self.policy.preemptions_per_hour:g} preemptions/hour assumed"
        bill = self.policy.bill
        if bill is None or not self.save_usd:
            return f"auto, every {self.interval_s:.0f} s (Daly, {rate})"
        return (
            f"auto, every {self.interval_s:.0f} s (least total cost: a save moves ${self.save_usd:.4g} of bytes "
            f"{bill.describe()}, {rate})"
        )
