"""The arms a nomad is measured against: on-demand only, one region under a single-place
deadline policy, and eager failover as SkyPilot's `EAGER_NEXT_REGION` does it.

The single-region arms reuse `skygreen.deadline.policy` unchanged (Uniform Progress and
skygreen's ExpectedSpot); like today's simulator they see their own zone's spot state every
tick. Eager failover runs Uniform Progress over all zones: spot counts as available when any
zone has it; after a preemption it tries zones cheapest-first with the preempted region last,
and it never moves while its spot runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from skygreen.deadline.policy import Job, Mode, Observation, Policy, UniformProgress
from skygreen.places.moves import MoveCosts
from skygreen.places.optimum import IDLE, OD, SPOT
from skygreen.places.place import Market
from skygreen.places.run import Now, Option, Seen

_MODES = {Mode.IDLE: IDLE, Mode.SPOT: SPOT, Mode.ON_DEMAND: OD}
_BACK = {IDLE: Mode.IDLE, SPOT: Mode.SPOT, OD: Mode.ON_DEMAND}


def job_of(market: Market, moves: MoveCosts, work_ticks: int, deadline_ticks: int) -> Job:
    """The single-place policies' job: work and deadline in hours, the longest changeover as d."""
    h = market.tick_h
    return Job(compute_h=work_ticks * h, deadline_h=deadline_ticks * h, changeover_h=moves.max_ticks * h)


@dataclass(kw_only=True)
class OnDemandOnly:
    """On-demand from the first tick at the place with the lowest on-demand price."""

    name: str = "on_demand"
    _place: int = 0

    def reset(self, market: Market, moves: MoveCosts, work_ticks: int, deadline_ticks: int) -> None:
        """Start a new job."""
        self._place = int(np.argmin(market.on_demand_usd_per_hour))

    def decide(self, now: Now, seen: list[Seen]) -> list[Option]:
        """The options to try this tick, best first."""
        return [(OD, self._place)]

    def probes(self, now: Now, seen: list[Seen]) -> list[int]:
        """No probes."""
        return []


@dataclass(kw_only=True)
class _Tracked:
    """The availability history a single-place policy's `Observation` carries."""

    seen_ticks: int = 0
    stretches: int = 0
    up_ticks: int = 0
    before: bool = False

    def update(self, up: bool) -> None:
        self.seen_ticks += up
        self.stretches += up and not self.before
        self.up_ticks = self.up_ticks + 1 if up else 0
        self.before = up


@dataclass(kw_only=True)
class SingleRegion:
    """A single-place deadline policy pinned to one place."""

    policy: Policy
    place: int
    name: str = ""
    _market: Market | None = None
    _job: Job | None = None
    _work: int = 0
    _track: _Tracked = field(default_factory=_Tracked)

    def reset(self, market: Market, moves: MoveCosts, work_ticks: int, deadline_ticks: int) -> None:
        """Start a new job."""
        self._market, self._work, self._track = market, work_ticks, _Tracked()
        self._job = job_of(market, moves, work_ticks, deadline_ticks)

    def decide(self, now: Now, seen: list[Seen]) -> list[Option]:
        """The options to try this tick, best first."""
        assert self._market is not None and self._job is not None
        up = bool(self._market.available[self.place, now.tick])
        self._track.update(up)
        obs = _observation(self._market, self._job, self._work, now, up, self._track)
        wanted = _MODES[self.policy.decide(self._job, obs)]
        return [(wanted, self.place if wanted != IDLE else -1)]

    def probes(self, now: Now, seen: list[Seen]) -> list[int]:
        """No probes."""
        return []


def _observation(market: Market, job: Job, work: int, now: Now, up: bool, track: _Tracked) -> Observation:
    h = market.tick_h
    return Observation(
        elapsed_h=now.tick * h,
        progress_h=(work - now.work_left) * h,
        mode=_BACK[now.mode],
        spot_available=up,
        spot_seen_h=track.seen_ticks * h,
        spot_runs_seen=track.stretches,
        spot_up_h=track.up_ticks * h,
    )


@dataclass(kw_only=True)
class EagerFailover:
    """Uniform Progress over every zone, failing over cheapest-first only after a preemption."""

    name: str = "eager_failover"
    _market: Market | None = None
    _job: Job | None = None
    _work: int = 0
    _avoid_region: str | None = None
    _track: _Tracked = field(default_factory=_Tracked)
    _policy: UniformProgress = field(default_factory=UniformProgress)

    def reset(self, market: Market, moves: MoveCosts, work_ticks: int, deadline_ticks: int) -> None:
        """Start a new job."""
        self._market, self._work, self._avoid_region, self._track = market, work_ticks, None, _Tracked()
        self._job = job_of(market, moves, work_ticks, deadline_ticks)

    def decide(self, now: Now, seen: list[Seen]) -> list[Option]:
        """The options to try this tick, best first."""
        market, job = self._market, self._job
        assert market is not None and job is not None
        if now.preempted:
            self._avoid_region = market.places[now.at].region
        running = now.mode == SPOT
        up_any = running or bool(market.available[:, now.tick].any())
        self._track.update(up_any)
        wanted = _MODES[self._policy.decide(job, _observation(market, job, self._work, now, up_any, self._track))]
        if wanted == SPOT and running:
            return []
        if wanted == SPOT:
            prices = market.spot_usd_per_hour[:, now.tick]
            order = sorted(range(len(market.places)),
                           key=lambda r: (market.places[r].region == self._avoid_region, prices[r]))  # fmt: skip
            return [(SPOT, r) for r in order]
        if wanted == OD:
            return [] if now.mode == OD else [(OD, int(np.argmin(market.on_demand_usd_per_hour)))]
        return [(IDLE, -1)]

    def probes(self, now: Now, seen: list[Seen]) -> list[int]:
        """No probes."""
        return []
