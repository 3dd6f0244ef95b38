"""Run every arm over windows of a market and summarise them against the optimum.

Arms: on-demand only; single-region Uniform Progress and skygreen's policy (per zone, reported
as the mean and the best zone); eager failover; the nomad; the optimum. Per window each arm's
cost, its ratio to the optimum, deadline met, moves, and the egress and changeover shares of its
cost; in total the mean, p90 and max of cost over optimum, with a bootstrap 95% interval of the
mean over windows (windows resampled with replacement, a fixed seed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from skygreen.deadline.policy import ExpectedSpot, UniformProgress
from skygreen.places.baselines import EagerFailover, OnDemandOnly, SingleRegion
from skygreen.places.moves import MoveTerms, move_costs
from skygreen.places.nomad import Nomad
from skygreen.places.optimum import Schedule, optimum
from skygreen.places.place import Market
from skygreen.places.run import replay

ARMS = ("on_demand", "up_mean", "up_best", "skygreen_mean", "skygreen_best", "eager_failover", "nomad", "optimum")


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """The job in ticks of the market: work, deadline, and the move terms."""

    work_ticks: int
    deadline_ticks: int
    terms: MoveTerms

    @staticmethod
    def from_hours(market: Market, *, compute_h: float, deadline_h: float, terms: MoveTerms) -> Job:
        """Work rounded up and the deadline down to whole ticks."""
        tick_h = market.tick_h
        return Job(work_ticks=math.ceil(compute_h / tick_h - 1e-9), deadline_ticks=math.floor(deadline_h / tick_h + 1e-9),
                   terms=terms)  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class WindowResult:
    """Every arm on one window starting at `start_tick`."""

    start_tick: int
    schedules: dict[str, Schedule]

    def ratio(self, arm: str) -> float:
        """Cost over the optimum's."""
        return self.schedules[arm].cost_usd / self.schedules["optimum"].cost_usd

    def to_json(self) -> dict:
        """The window for `--json`: per arm its record and its ratio to the optimum."""
        return {
            "start_tick": self.start_tick,
            "arms": {a: {**s.to_json(), "over_optimum": round(self.ratio(a), 4)} for a, s in self.schedules.items()},
        }


def run_window(market: Market, job: Job, start_tick: int, *, nomad: Nomad | None = None,
               arms: Sequence[str] = ARMS) -> WindowResult:  # fmt: skip
    """Every arm asked for on the window from `start_tick` (`up_*`/`skygreen_*` run each zone)."""
    win = market.window(start_tick, job.deadline_ticks + job.work_ticks + 64)
    moves = move_costs(win, job.terms)
    kw = {"work_ticks": job.work_ticks, "deadline_ticks": job.deadline_ticks}
    out: dict[str, Schedule] = {}
    if "optimum" in arms:
        out["optimum"] = optimum(win, job.terms, **kw)
    if "on_demand" in arms:
        out["on_demand"] = replay(OnDemandOnly(), win, moves, **kw)
    for family, make in (("up", UniformProgress), ("skygreen", ExpectedSpot)):
        if f"{family}_mean" not in arms and f"{family}_best" not in arms:
            continue
        runs = []
        for r in range(len(win.places)):
            policy = make() if family == "up" else _expected_spot(win, r)
            runs.append(replay(SingleRegion(policy=policy, place=r, name=family), win, moves, **kw))
        best = min(runs, key=lambda s: s.cost_usd)
        out[f"{family}_mean"] = _mean_of(f"{family}_mean", runs)
        out[f"{family}_best"] = _renamed(best, f"{family}_best")
    if "eager_failover" in arms:
        out["eager_failover"] = replay(EagerFailover(), win, moves, **kw)
    if "nomad" in arms:
        out["nomad"] = replay(nomad or Nomad(), win, moves, **kw)
    return WindowResult(start_tick=start_tick, schedules=out)


def _expected_spot(market: Market, r: int) -> ExpectedSpot:
    spot = float(np.mean(market.spot_usd_per_hour[r]))
    return ExpectedSpot(price_ratio=float(market.on_demand_usd_per_hour[r]) / spot if spot > 0 else math.inf)


def _renamed(s: Schedule, arm: str) -> Schedule:
    return Schedule(arm=arm, cost_usd=s.cost_usd, compute_usd=s.compute_usd, changeover_usd=s.changeover_usd,
                    egress_usd=s.egress_usd, probe_usd=s.probe_usd, finish_tick=s.finish_tick,
                    deadline_met=s.deadline_met, launches=s.launches, moves=s.moves, place=s.place, mode=s.mode,
                    safety_net=s.safety_net)  # fmt: skip


def _mean_of(arm: str, runs: list[Schedule]) -> Schedule:
    """The mean over zones (a zone's run is one sample); deadlines met only if every zone met it."""
    first = runs[0]
    return Schedule(
        arm=arm,
        cost_usd=float(np.mean([s.cost_usd for s in runs])),
        compute_usd=float(np.mean([s.compute_usd for s in runs])),
        changeover_usd=float(np.mean([s.changeover_usd for s in runs])),
        egress_usd=0.0,
        probe_usd=0.0,
        finish_tick=max((s.finish_tick or 0) for s in runs),
        deadline_met=all(s.deadline_met for s in runs),
        launches=round(float(np.mean([s.launches for s in runs]))),
        moves=0,
        place=first.place,
        mode=first.mode,
    )


def summarise(results: Sequence[WindowResult], *, seed: int = 0, samples: int = 2000) -> dict[str, dict]:
    """Per arm over windows: mean cost, cost over optimum (mean, p90, max, bootstrap 95% CI of the
    mean), deadlines met, moves, and the shares of egress and changeover in the cost."""
    rng = np.random.default_rng(seed)
    out: dict[str, dict] = {}
    arms = [a for a in ARMS if results and a in results[0].schedules]
    for arm in arms:
        ratios = np.array([w.ratio(arm) for w in results])
        costs = np.array([w.schedules[arm].cost_usd for w in results])
        boot = ratios[rng.integers(0, len(ratios), size=(samples, len(ratios)))].mean(axis=1)
        total = float(costs.sum())
        out[arm] = {
            "windows": len(results),
            "mean_cost_usd": round(float(costs.mean()), 4),
            "over_optimum_mean": round(float(ratios.mean()), 4),
            "over_optimum_p90": round(float(np.percentile(ratios, 90)), 4),
            "over_optimum_max": round(float(ratios.max()), 4),
            "over_optimum_ci95": [
                round(float(np.percentile(boot, 2.5)), 4),
                round(float(np.percentile(boot, 97.5)), 4),
            ],
            "deadlines_met": int(sum(w.schedules[arm].deadline_met for w in results)),
            "moves": int(sum(w.schedules[arm].moves for w in results)),
            "egress_share": round(sum(w.schedules[arm].egress_usd for w in results) / total, 4) if total else 0.0,
            "changeover_share": round(sum(w.schedules[arm].changeover_usd for w in results) / total, 4)
            if total
            else 0.0,
        }
    return out
