"""Deadline policies: given the job and what is true now, where should it run next?

Every policy is a pure function `decide(job, observation) -> Mode`. The observation carries
all the history a policy may use (progress, time, the current mode, spot availability now and
how much of it has been seen so far), so the simulator and a live watcher that reads the same
facts from a run's ledger call the very same code.

The safety rule (`safety_net`) sits on top of every policy and is what guarantees the
deadline: a job that is not running on spot goes to on-demand, and stays there, once its slack
R(t) - C(t) falls below 2d. One changeover d is the price of starting on-demand; the second d
covers a spot attempt that is preempted right after its own changeover. On on-demand slack never
grows again, so "stays there to the end" needs no memory. The paper states the rule for an idle
job; leaving on-demand with less than 2d of slack puts the job in the same place as being idle,
so the rule here also keeps it from leaving (without that, Uniform Progress's hysteresis can
release on-demand near the deadline with too little slack to survive a preemption).

With decisions taken every dt <= d (the simulator's grid), a job that starts with R >= C + 2d
never misses its deadline under any policy here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

_EPS_H = 1e-9


class Mode(str, Enum):
    """Where the job runs during a decision interval: nowhere (no instances), on spot, or on on-demand."""

    IDLE = "idle"
    SPOT = "spot"
    ON_DEMAND = "on_demand"


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """C(0), R(0) and d of the paper, in hours of the whole gang."""

    compute_h: float
    deadline_h: float
    changeover_h: float

    def __post_init__(self) -> None:
        for name in ("compute_h", "deadline_h", "changeover_h"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Observation:
    """What is known at one decision point. A preempted job is IDLE (its instances are gone)."""

    elapsed_h: float
    progress_h: float
    mode: Mode
    spot_available: bool
    spot_seen_h: float = 0.0
    """Hours since the start in which spot was available (the current decision interval included)."""
    spot_runs_seen: int = 0
    """Stretches of availability that began since the start (the current one included)."""
    spot_up_h: float = 0.0
    """How long spot has been available without a break, up to now (0 when it is not)."""

    def remaining_h(self, job: Job) -> float:
        """C(t): the compute hours still to do, never below 0."""
        return max(job.compute_h - self.progress_h, 0.0)

    def time_left_h(self, job: Job) -> float:
        """R(t): the hours until the deadline, negative once it has passed."""
        return job.deadline_h - self.elapsed_h

    def slack_h(self, job: Job) -> float:
        """R(t) - C(t): the hours the job can still afford to spend not progressing."""
        return self.time_left_h(job) - self.remaining_h(job)


class Policy(Protocol):
    """A deadline policy, as the simulator calls it: a name and a decision per interval."""

    @property
    def name(self) -> str:
        """The policy's name in the report and the JSON (`Outcome.policy`)."""
        ...

    def decide(self, job: Job, obs: Observation) -> Mode:
        """The mode for the next decision interval, from the job and what is known now.

        Implementations pass their wish through `safety_net`, and never ask for spot while
        `obs.spot_available` is false (`safety_net` raises ValueError for that).
        """
        ...


def safety_net(job: Job, obs: Observation, wanted: Mode) -> Mode:
    """The policy's wish, unless it would risk the deadline (see the module docstring)."""
    if obs.remaining_h(job) <= _EPS_H:
        return Mode.IDLE  # the thrifty rule: nothing left to do
    if wanted is Mode.SPOT and not obs.spot_available:
        raise ValueError("a policy asked for spot while spot is unavailable")
    if obs.mode is not Mode.SPOT and obs.slack_h(job) <= 2 * job.changeover_h + _EPS_H:
        return Mode.ON_DEMAND
    return wanted


@dataclass(frozen=True, kw_only=True, slots=True)
class Greedy:
    """Spot whenever it is available, otherwise wait; the safety net finishes on on-demand."""

    name: str = "greedy"

    def decide(self, job: Job, obs: Observation) -> Mode:
        """Spot when it is available, else idle; through the safety net."""
        return safety_net(job, obs, Mode.SPOT if obs.spot_available else Mode.IDLE)


@dataclass(frozen=True, kw_only=True, slots=True)
class UniformProgress:
    """Uniform Progress (Wu et al., NSDI'24, §5), parameter-free.

    ep(t) = t C(0)/R(0) is the progress a job going at a uniform rate would have, cp(t) the
    progress it has. (1) Idle and cp < ep: go on-demand. (2) Take spot whenever it is available,
    even when behind, and keep it until preempted. (3) Hysteresis: once on on-demand, stay until
    cp(t) >= ep(t + 2d). The safety net applies on top.
    """

    name: str = "uniform_progress"

    def decide(self, job: Job, obs: Observation) -> Mode:
        """Rules (1) to (3) above, through the safety net."""
        rate = job.compute_h / job.deadline_h
        cp = obs.progress_h
        held = obs.mode is Mode.ON_DEMAND and cp < (obs.elapsed_h + 2 * job.changeover_h) * rate
        if held:
            wanted = Mode.ON_DEMAND
        elif obs.spot_available:
            wanted = Mode.SPOT
        elif cp < obs.elapsed_h * rate:
            wanted = Mode.ON_DEMAND
        else:
            wanted = Mode.IDLE
        return safety_net(job, obs, wanted)


@dataclass(frozen=True, kw_only=True, slots=True)
class ExpectedSpot:
    """skygreen's policy: buy on-demand for the work spot is not expected to do, and only as
    late as the slack allows.

    Uniform Progress asks every job to keep pace with C(0)/R(0), whatever the zone offers: in a
    zone where spot is up 90% of the time it buys on-demand whenever a short outage finds it
    behind, and in a zone up 20% of the time it waits while spot cannot possibly catch up, then
    pays for the rest near the deadline. Greedy never buys early and wastes the spot that comes
    back during its final on-demand stretch. The traces say zones differ that much (AWS V100
    17-90% available, GCP H100 24-100%, mean spot stretches of 0.4-10 h), so this policy learns
    the zone as it runs:

        a     = availability seen so far, blended with a prior worth `prior_weight_h` hours
        L     = mean length of the spot stretches seen so far, blended with a prior stretch
        r     = a x (1 - d / L) x (1 - margin)   expected progress per hour from spot alone
        gap   = C(t) - r x (R(t) - 2d)           work spot is not expected to do in time
        spare = R(t) - C(t) - 2d                 slack beyond the safety net's

    Idle, it buys on-demand once gap > defer x spare (with defer = 1: once the expected
    shortfall is as large as the slack left to absorb it), and holds on-demand until spot is
    expected to do all the rest with 2d to spare (gap <= -2d), so idle does not flip straight
    back. Spot, once on it, is kept until preempted; it is taken from idle when a stretch is
    expected to outlast the break-even kd/(k-1), and from on-demand when it is expected to
    outlast 2kd/(k-1) (the paper's next-lifetime rule, with L for the oracle) and has already
    been up for 2d: each round trip from on-demand costs 2d of slack, and a zone that flickers
    (up one probe, down the next) would spend it all, after which the safety net keeps the job
    on on-demand to the end. The safety net applies on top, so it misses no deadline that the
    safety rule can meet.

    The defaults (prior 70% available in 3 h stretches, worth a day; defer 1; no margin; dwell
    2d) were
    chosen on two start points per trace of the benchmark's traces with d of 0.1 and 0.3 h;
    `benchmarks/bench_deadline.py` measures them on five, and d of 0.5 h too.
    """

    name: str = "skygreen"
    price_ratio: float = 3.0
    """k = on-demand / spot price."""
    prior_availability: float = 0.7
    prior_weight_h: float = 24.0
    prior_stretch_h: float = 3.0
    prior_stretches: float = 2.0
    margin: float = 0.0
    """Fraction of the expected spot progress not counted on (estimates are noisy)."""
    defer: float = 1.0
    """Idle, buy on-demand only once the gap exceeds this fraction of the slack beyond 2d."""
    dwell_changeovers: float = 2.0
    """From on-demand, take spot only once it has been up this many changeovers without a break."""

    def spot_rate(self, job: Job, obs: Observation) -> tuple[float, float]:
        """(r, L): expected progress per hour from spot, and the expected stretch in hours."""
        seen_h = max(obs.elapsed_h, 0.0)
        avail = (obs.spot_seen_h + self.prior_availability * self.prior_weight_h) / (seen_h + self.prior_weight_h)
        stretch_h = (obs.spot_seen_h + self.prior_stretch_h * self.prior_stretches) / (
            obs.spot_runs_seen + self.prior_stretches
        )
        return max(avail * (1.0 - job.changeover_h / stretch_h), 0.0) * (1.0 - self.margin), stretch_h

    def decide(self, job: Job, obs: Observation) -> Mode:
        """The rules above (spot kept until preempted, on-demand bought for the expected shortfall),
        through the safety net."""
        rate, stretch_h = self.spot_rate(job, obs)
        d = job.changeover_h
        left_h = obs.time_left_h(job)
        gap_now = obs.remaining_h(job) - rate * (left_h - 2 * d)
        k = self.price_ratio
        worth_starting = obs.spot_available and (k <= 1 or stretch_h > k * d / (k - 1))
        if obs.mode is Mode.SPOT and obs.spot_available:
            wanted = Mode.SPOT
        elif obs.mode is Mode.ON_DEMAND:
            worth_leaving = obs.spot_available and (k <= 1 or stretch_h > 2 * k * d / (k - 1))
            if worth_leaving and self.dwell_changeovers > 0:
                worth_leaving = obs.spot_up_h >= self.dwell_changeovers * d
            if worth_leaving:
                wanted = Mode.SPOT
            elif gap_now > -2 * d:
                wanted = Mode.ON_DEMAND
            else:  # on-demand is no longer needed
                wanted = Mode.SPOT if worth_starting else Mode.IDLE
        elif worth_starting:
            wanted = Mode.SPOT
        else:
            spare_h = max(obs.slack_h(job) - 2 * d, 0.0)
            wanted = Mode.ON_DEMAND if gap_now > self.defer * spare_h else Mode.IDLE
        return safety_net(job, obs, wanted)


POLICIES: dict[str, type] = {"greedy": Greedy, "uniform_progress": UniformProgress, "skygreen": ExpectedSpot}
"""The policies `skygreen simulate --policy` knows, besides `on_demand` and `optimum`."""
