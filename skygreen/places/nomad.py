"""The nomad policy: each tick, run where a useful hour of work costs least, counting the move.

For every place r it prices one useful tick of work if the job went there now:

    life_r = predicted spot lifetime at r, in ticks, capped at what the job still needs
    cost_r = (spot price_r x life_r + egress(checkpoint -> r)) / (life_r - changeover_r)

The lifetime is learned from the run's own history at r (hours run there, preemptions seen) and
from billed probes (launch-and-cancel: a virtual run per place), blended with a prior worth
`prior_runs` runs of `prior_lifetime_h`: an exponential lifetime's estimate with censoring,
(hours up + prior hours) / (ends seen + prior runs). A move's egress and changeover are thus
amortised over the lifetime the place is expected to give.

The price the job is willing to pay for a useful tick rises with deadline pressure
rho = work left / (time left - 2 changeovers): from `relaxed` x the cheapest spot price listed
right now (anywhere) when rho is low, up to the cheapest on-demand as rho reaches 1, as
rho ** `pressure_power`. The curve is steep on purpose: a job with deadline 1.5 x its work
starts at rho ~ 0.68, and a gentle curve (power 3) then accepts any spot at once, so after a
preemption it leaves the cheapest place for a dearer one (paying a changeover and egress) when
waiting for the cheap place to come back costs only slack it can spare. The offline optimum
almost never moves on these traces; it waits. With power 12 the premium over the cheapest is
about 1% of the gap to on-demand at rho 0.68 and 14% at rho 0.85: it spends slack on waiting
first and money on moving only as idle ticks push rho up. Chosen on the training part of both
traces (power 3, 6, 12; `benchmarks/bench_nomad.py`). On spot it stays unless another place is cheaper by the hysteresis margin
(a fraction plus a dollar floor per hour); idle or preempted, it tries acceptable places
cheapest first; it takes on-demand once rho passes `od_pressure` and leaves it below
`leave_pressure`. A place that just failed a launch is not retried for `retry_ticks`.

The safety net guarantees the deadline: off spot, once the slack is down to two of the longest
changeovers plus one tick, it goes to on-demand at the place where on-demand plus the move
there costs least, and stays. What differs from SkyNomad: lifetimes are a censored exponential
estimate with a prior rather than Nelson-Aalen with a burst factor; the value of progress is a
pressure curve over the cheapest listed prices, not a Taylor expansion; a failed launch is
free and doubles as a probe; regions whose best listed price cannot beat the current option
are never tried.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from skygreen.places.moves import MoveCosts
from skygreen.places.optimum import IDLE, OD, SPOT
from skygreen.places.place import Market
from skygreen.places.run import Now, Option, Seen


@dataclass(kw_only=True)
class Nomad:
    """The multi-place policy described in the module docstring; its knobs are its fields."""

    name: str = "nomad"
    prior_lifetime_h: float = 4.0
    prior_runs: float = 1.0
    margin: float = 0.1
    """Move off running spot only for a place cheaper by this fraction ..."""
    floor_usd_per_hour: float = 0.0
    """... and by at least this much per hour."""
    relaxed: float = 1.15
    pressure_power: float = 12.0
    """How late deadline pressure raises the price it will pay (module docstring)."""
    od_pressure: float = 0.97
    leave_pressure: float = 0.85
    retry_ticks: int = 1
    probe_every_ticks: int | None = None
    net_fired: bool = False
    _market: Market | None = None
    _moves: MoveCosts | None = None
    _latched: bool = False
    _od_tick_best: float = 0.0
    _spot_tick: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))

    def reset(self, market: Market, moves: MoveCosts, work_ticks: int, deadline_ticks: int) -> None:
        """Start a new job."""
        self._market, self._moves, self._latched, self.net_fired = market, moves, False, False
        self._spot_tick = market.spot_usd_per_hour * market.tick_h

    def lifetime_ticks(self, seen: Seen) -> float:
        """Predicted spot lifetime at a place, in ticks (see the module docstring)."""
        assert self._market is not None
        hours = seen.run_h + seen.probe_run_h + self.prior_lifetime_h * self.prior_runs
        ends = seen.preemptions + seen.probe_failures + self.prior_runs
        return hours / ends / self._market.tick_h

    def _ticks(self, src: int, dst: int) -> int:
        assert self._moves is not None
        return int(self._moves.first_ticks[dst] if src < 0 else self._moves.changeover_ticks[src, dst])

    def _egress(self, src: int, dst: int) -> float:
        assert self._moves is not None
        return 0.0 if src < 0 else float(self._moves.egress_usd[src, dst])

    def _od_target(self, now: Now) -> tuple[int, float]:
        """The place where finishing on on-demand costs least, moves included; its cost per work tick."""
        market = self._market
        assert market is not None
        od_tick = market.on_demand_usd_per_hour * market.tick_h
        totals = [od_tick[r] * (now.work_left + self._ticks(now.checkpoint, r)) + self._egress(now.checkpoint, r)
                  for r in range(len(market.places))]  # fmt: skip
        best = int(np.argmin(totals))
        return best, totals[best] / max(now.work_left, 1)

    def _spot_cost(self, now: Now, seen: list[Seen], r: int) -> float:
        k = self._ticks(now.checkpoint, r)
        life = min(self.lifetime_ticks(seen[r]), now.work_left + k)
        useful = life - k
        if useful <= 0.5:
            return np.inf
        return (self._spot_tick[r, now.tick] * life + self._egress(now.checkpoint, r)) / useful

    def latch(self) -> None:
        """Hold the safety net from the start: it fired at an earlier look at a live run."""
        self._latched = self.net_fired = True

    def useful_tick_usd(self, now: Now, seen: list[Seen]) -> list[float]:
        """Per place, what one useful tick there costs if the job went there now (inf where the
        predicted lifetime does not outlast the changeover): the scores `decide` ranks by, which
        a live watcher shows as the reason for a move."""
        assert self._market is not None
        return [float(self._spot_cost(now, seen, r)) for r in range(len(self._market.places))]

    def accept_tick_usd(self, now: Now) -> float:
        """The most the job will pay for a useful tick now (deadline pressure; module docstring)."""
        market, moves = self._market, self._moves
        assert market is not None and moves is not None
        rho = now.work_left / max(now.time_left - 2 * moves.max_ticks, 1)
        cheapest = float(self._spot_tick[:, now.tick].min())
        od_cost = self._od_target(now)[1]
        return cheapest * self.relaxed + (od_cost - cheapest * self.relaxed) * min(rho, 1.0) ** self.pressure_power

    def decide(self, now: Now, seen: list[Seen]) -> list[Option]:
        """The options to try this tick, best first."""
        market, moves = self._market, self._moves
        assert market is not None and moves is not None
        n = len(market.places)
        od_place, od_cost = self._od_target(now)
        slack = now.time_left - now.work_left
        guard = 2 * moves.max_ticks + 1
        if self._latched or (now.mode != SPOT and slack <= guard):
            self._latched = self.net_fired = True
            return [] if now.mode == OD else [(OD, od_place)]
        rho = now.work_left / max(now.time_left - 2 * moves.max_ticks, 1)
        cheapest = float(self._spot_tick[:, now.tick].min())
        accept = cheapest * self.relaxed + (od_cost - cheapest * self.relaxed) * min(rho, 1.0) ** self.pressure_power
        costs = [self._spot_cost(now, seen, r) for r in range(n)]
        fresh = [r for r in range(n) if now.tick - seen[r].last_failed_tick >= self.retry_ticks]
        if now.mode == SPOT:
            here = float(self._spot_tick[now.at, now.tick])
            bar = min(here * (1 - self.margin), here - self.floor_usd_per_hour * market.tick_h)
            better = sorted((r for r in fresh if r != now.at and costs[r] < bar), key=lambda r: costs[r])
            return [(SPOT, r) for r in better]
        options = sorted((r for r in fresh if costs[r] <= accept), key=lambda r: costs[r])
        if now.mode == OD:
            if rho >= self.leave_pressure:
                return []
            return [(SPOT, r) for r in options]
        tail: list[Option] = [(OD, od_place)] if rho >= self.od_pressure else [(IDLE, -1)]
        return [(SPOT, r) for r in options] + tail

    def probes(self, now: Now, seen: list[Seen]) -> list[int]:
        """Places due a probe (billed), when probing is on."""
        if self.probe_every_ticks is None or self._market is None:
            return []
        return [r for r in range(len(self._market.places))
                if r != now.at and now.tick - seen[r].last_probe_tick >= self.probe_every_ticks]  # fmt: skip
