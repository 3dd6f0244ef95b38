"""Replay a checkpointed run over a real spot trace, to check the cost model's spot overhead.

The planner prices spot offers with an expected-value model (`skygreen.plan.cost.estimate`): a
preemption rate per running hour, a restart time, and half a checkpoint interval of lost work
per preemption. This module plays the same run against a recorded sequence of spot lifetimes
instead, so the model's assumptions (the default rates above all) can be measured against
real preemptions (`../shared/spot-traces`; `benchmarks/bench_spot_model.py`).

A trace is a list of 0/1 ticks `gap_s` apart, 1 = the spot instance is alive (the
spot-traces convention). Only alive time is billed: while the trace shows 0 the job waits
(or, with SkyPilot, moves elsewhere), which costs time but no instance-hours.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceStats:
    alive_hours: float
    preemptions: int
    """Alive -> dead transitions (the last alive run, cut by the end of the trace, is not one)."""

    @property
    def preemptions_per_alive_hour(self) -> float:
        return self.preemptions / self.alive_hours if self.alive_hours else 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayResult:
    billed_s: float
    """Alive time used: restarts, compute (including work later lost), saves."""
    preemptions: int


def alive_runs_s(ticks: Sequence[int], gap_s: float) -> list[float]:
    """Lengths in seconds of the runs of alive ticks, in order."""
    runs, current = [], 0
    for alive in ticks:
        if alive:
            current += 1
        elif current:
            runs.append(current * gap_s)
            current = 0
    if current:
        runs.append(current * gap_s)
    return runs


def trace_stats(ticks: Sequence[int], gap_s: float) -> TraceStats:
    preemptions = sum(1 for before, after in itertools.pairwise(ticks) if before and not after)
    return TraceStats(alive_hours=sum(1 for t in ticks if t) * gap_s / 3600.0, preemptions=preemptions)


def replay_run(
    lifetimes_s: Sequence[float],
    *,
    work_s: float,
    interval_s: float,
    save_s: float,
    restart_s: float,
    first: int = 0,
) -> ReplayResult:
    """Run `work_s` of compute over successive spot lifetimes, starting with lifetime `first`
    (wrapping around), checkpointing after every `interval_s` of compute at `save_s` each.

    Each lifetime after the first begins with `restart_s` of provisioning and resume; when a
    lifetime ends, the work since the last committed checkpoint is lost.
    """
    if work_s <= 0 or interval_s <= 0 or not lifetimes_s:
        raise ValueError("work_s and interval_s must be > 0 and the trace must have an alive run")
    committed_s, billed_s = 0.0, 0.0
    for k in range(first, first + 100_000 * len(lifetimes_s)):
        lifetime_s = lifetimes_s[k % len(lifetimes_s)]
        used_s = min(restart_s, lifetime_s) if k > first else 0.0
        progress_s = committed_s
        while used_s < lifetime_s:
            chunk_s = min(interval_s, work_s - progress_s)
            if used_s + chunk_s > lifetime_s:
                break
            used_s += chunk_s
            progress_s += chunk_s
            if progress_s >= work_s:
                return ReplayResult(billed_s=billed_s + used_s, preemptions=k - first)
            if used_s + save_s > lifetime_s:
                break
            used_s += save_s
            committed_s = progress_s
        billed_s += lifetime_s
    raise ValueError("the run makes no progress on this trace (lifetimes shorter than a restart plus an interval)")
