"""A live run under a deadline: its terms, what the watcher observes, and what it does next.

`skygreen up --deadline` records `DeadlineTerms` with the run. Every poll, `skygreen watch`
(`skygreen.deadline.watch`) reads the run's progress from its ledger, its job's state from the
launcher and, where something can tell, whether spot is available; this module turns those
facts into the simulator's `Observation`, asks the very policy objects `skygreen simulate`
replays (`skygreen.deadline.policy`), and turns the policy's mode into one `Action`. All of it
is pure, so the whole decision is tested without processes, clouds or clocks.

Spot availability, in order of what knows best: a market reading (a replayed trace on a local
run); else the job itself: a spot job that runs says spot is up, one that waits for capacity or
recovers says it is not (one still provisioning within a changeover of a launch the watcher can
date says nothing yet: provisioning is part of d); else (the run is on on-demand or stopped and nothing can tell) spot is
assumed available once `retry_h` has passed since it was last seen unavailable: the policy then
decides whether a try is worth it, and the safety net only lets a run leave on-demand with more
than two changeovers of slack, so a try that finds no capacity costs money, never the deadline.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from skygreen.deadline.policy import POLICIES, Job, Mode, Observation, Policy, safety_net

_RUNNING = "RUNNING"
_PROVISIONING = frozenset({"PENDING", "STARTING"})
_WAITING = _PROVISIONING | {"RECOVERING"}
_ALIVE = _WAITING | {_RUNNING, "CANCELLING"}

RETRY_H = 1.0
"""With nothing to tell whether spot is back, the watcher assumes it is this long after it was
last seen unavailable (see the module docstring)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DeadlineTerms:
    """What a run promised at launch: finish by `deadline_at_s`, switching by `policy`.

    Times are Unix seconds on the watcher's clock; hours are hours of the whole gang.
    """

    started_at_s: float
    deadline_at_s: float
    changeover_h: float
    """d: provisioning, setup and the work lost since the last checkpoint, per switch."""
    policy: str = "skygreen"
    compute_h: float | None = None
    """Hours of compute the run needs on its GPUs; None: measured from the ledger's throughput."""
    spot_usd_per_hour: float | None = None
    on_demand_usd_per_hour: float | None = None
    """Per node; from the plan's best offer (None for a local run)."""
    nodes: int = 1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.deadline_at_s) and self.deadline_at_s > self.started_at_s):
            raise ValueError(f"the deadline must come after the start, got {self.deadline_at_s} <= {self.started_at_s}")
        if not (math.isfinite(self.changeover_h) and self.changeover_h > 0):
            raise ValueError(f"changeover_h must be a finite number > 0, got {self.changeover_h}")
        if self.compute_h is not None and not (math.isfinite(self.compute_h) and self.compute_h > 0):
            raise ValueError(f"compute_h must be a finite number > 0, got {self.compute_h}")
        if self.policy not in POLICIES:
            raise ValueError(f"unknown deadline policy {self.policy!r}; known: {', '.join(POLICIES)}")

    @property
    def deadline_h(self) -> float:
        """R(0): hours from the start to the deadline."""
        return (self.deadline_at_s - self.started_at_s) / 3600.0

    def make_policy(self, *, price_ratio: float | None = None) -> Policy:
        """The policy object; skygreen's own is told the on-demand/spot price ratio when known."""
        factory = POLICIES[self.policy]
        if self.policy == "skygreen" and price_ratio is not None:
            return factory(price_ratio=price_ratio)
        return factory()

    def to_json(self) -> dict[str, Any]:
        """The record's `deadline` object."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DeadlineTerms:
        """Back from `to_json`; unknown keys (from a newer skygreen) are ignored."""
        return cls(**_known(cls, data))


@dataclass(frozen=True, kw_only=True, slots=True)
class Progress:
    """How far a run is, from its ledger: steps done out of the steps its loop runs to."""

    step: int
    total_steps: int | None
    measured_compute_h: float | None = None
    """total_steps at the throughput measured so far, in hours; None before a timed step."""
    timed_train_s: float = 0.0
    """The training seconds that measurement rests on."""

    @property
    def fraction(self) -> float | None:
        """Share of the steps done, None while the runtime has not said how many there are."""
        if not self.total_steps:
            return None
        return min(max(self.step / self.total_steps, 0.0), 1.0)


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of `data` that are fields of the dataclass `cls`."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def progress_from(segments: Sequence[Any]) -> Progress:
    """Progress of a run from its ledger segments (`skygreen.ledger.records.Segment`).

    The step is the furthest any segment reached; the throughput is every segment's timed
    steps over their training seconds, so restarts and checkpoint loads are not counted as
    compute (they are the changeover's part). A killed segment's timed steps run to the step its
    training seconds were measured at, not to the checkpoint its `step` was moved back to: the
    steps it trained past that checkpoint took those seconds too.
    """
    if not segments:
        return Progress(step=0, total_steps=None)
    step = max(s.step for s in segments)
    totals = [s.total_steps for s in sorted(segments, key=lambda s: s.started_at) if s.total_steps]
    total = totals[-1] if totals else None
    timed_steps = sum(s.timed_steps for s in segments if s.train_s > 0)
    train_s = sum(s.train_s for s in segments if s.train_s > 0)
    measured = total * (train_s / timed_steps) / 3600.0 if total and timed_steps and train_s > 0 else None
    return Progress(step=step, total_steps=total, measured_compute_h=measured, timed_train_s=max(train_s, 0.0))


TRUSTED_MEASURE_S = 1800.0
"""Training seconds after which the measured throughput can raise planned compute hours: half an
hour is past start-up, compilation and the first uploads, which make early steps look slow."""


def needed_compute_h(terms: DeadlineTerms, progress: Progress) -> float | None:
    """The compute hours the run needs: the plan's (or `--compute`), raised to the measured figure
    once `TRUSTED_MEASURE_S` of training back it, and the measured figure alone when nothing was
    planned. Raised, never lowered: SkyPilot may land the run on a slower GPU of the plan than its
    best offer, and a run paced for work it cannot do in time misses the deadline, while one paced
    for more than it needs only spends a little more on on-demand."""
    measured = progress.measured_compute_h
    if terms.compute_h is None:
        return measured
    if measured is not None and progress.timed_train_s >= TRUSTED_MEASURE_S:
        return max(terms.compute_h, measured)
    return terms.compute_h


def finished_at_s(segments: Sequence[Any], *, now_s: float, wall_now_s: float) -> float:
    """When a completed run finished, on the watcher's clock: the latest end in its ledger, that
    long before now (the ledger keeps the wall clock `wall_now_s`, the watcher's may be a test's),
    so a watcher that was down when the run ended does not date the end to its own return;
    `now_s` when the ledger has no end."""
    ends = [s.ended_at for s in segments if s.ended_at is not None]
    if not ends:
        return now_s
    return now_s - max(wall_now_s - max(ends), 0.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class Availability:
    """Spot availability seen by the watcher: the moments it changed, from the run's start."""

    changes: tuple[tuple[float, bool], ...] = ()
    """(Unix seconds, available) at each change, oldest first."""

    def record(self, at_s: float, available: bool) -> Availability:
        """This history with one more reading (kept only when it changes the state)."""
        if self.changes and self.changes[-1][1] == available:
            return self
        return Availability(changes=(*self.changes, (at_s, available)))

    @property
    def last(self) -> bool | None:
        """The latest reading; None before any."""
        return self.changes[-1][1] if self.changes else None

    def last_unavailable_s(self) -> float | None:
        """When spot was last seen unavailable (the start of the latest outage), or None."""
        outages = [at for at, up in self.changes if not up]
        return outages[-1] if outages else None

    def stats(self, *, start_s: float, now_s: float) -> tuple[float, int, float]:
        """(hours available since the start, stretches begun, hours up without a break now)."""
        seen_h, stretches, up_since = 0.0, 0, None
        for i, (at, up) in enumerate(self.changes):
            until = self.changes[i + 1][0] if i + 1 < len(self.changes) else now_s
            if up:
                seen_h += max(0.0, min(until, now_s) - max(at, start_s)) / 3600.0
                stretches += 1
                up_since = at
        up_h = (now_s - up_since) / 3600.0 if self.last and up_since is not None else 0.0
        return seen_h, stretches, max(up_h, 0.0)


def current_mode(*, spot: bool | None, state: str, spot_available: bool | None) -> Mode:
    """Where the run is in the policy's terms.

    A running job is on its capacity. On-demand being provisioned is already bought (its
    changeover). A spot job waiting for capacity or recovering makes no progress: idle, unless
    a market reading says spot is there and it is only starting. A job that ended is idle.
    """
    if state == _RUNNING:
        return Mode.SPOT if spot else Mode.ON_DEMAND
    if state in _WAITING:
        if not spot:
            return Mode.ON_DEMAND
        return Mode.SPOT if spot_available and state != "RECOVERING" else Mode.IDLE
    return Mode.IDLE


def spot_reading(
    *,
    market: bool | None,
    spot: bool | None,
    state: str,
    history: Availability,
    now_s: float,
    retry_h: float = RETRY_H,
    launched_at_s: float | None = None,
    changeover_h: float = 0.0,
) -> tuple[bool, bool]:
    """(spot available now, whether that was observed rather than assumed); see the module docstring.

    A spot job launched (at `launched_at_s`, when known) less than one changeover ago and still
    provisioning says nothing yet: provisioning is part of d, as in the simulator, so it reads
    as spot available, assumed, and the run as on spot; a spot VM taking its normal minutes to
    come up is not an outage the policy should react to or learn from. Past d it is one.
    """
    if market is not None:
        return market, True
    if spot and state == _RUNNING:
        return True, True
    young = launched_at_s is not None and now_s - launched_at_s < changeover_h * 3600.0
    if spot and state in _PROVISIONING and young:
        return True, False
    if spot and state in _WAITING:
        return False, True
    if history.last is True:
        return True, False  # last seen up and nothing says otherwise
    lost_s = history.last_unavailable_s()
    return lost_s is None or now_s - lost_s >= retry_h * 3600.0, False


@dataclass(frozen=True, kw_only=True, slots=True)
class Decision:
    """One poll of the watcher: what it saw and what the policy chose."""

    at_s: float
    mode: str
    """The policy's mode (`Mode` value)."""
    current: str
    """The run's mode when the watcher looked."""
    spot_available: bool
    spot_observed: bool
    """False when availability was assumed (nothing could tell; see `spot_reading`)."""
    elapsed_h: float
    deadline_h: float
    progress_h: float
    compute_h: float
    changeover_h: float
    reason: str

    @property
    def slack_h(self) -> float:
        """R(t) - C(t) at this poll."""
        return (self.deadline_h - self.elapsed_h) - max(self.compute_h - self.progress_h, 0.0)

    @property
    def uniform_progress_h(self) -> float:
        """Progress a run going at an even pace to the deadline would have now."""
        return min(self.elapsed_h * self.compute_h / self.deadline_h, self.compute_h)

    def to_json(self) -> dict[str, Any]:
        """The watcher's state file entry."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Decision:
        """Back from `to_json`; unknown keys are ignored."""
        return cls(**_known(cls, data))


def decide(
    terms: DeadlineTerms,
    *,
    now_s: float,
    progress: Progress,
    mode: Mode,
    spot_available: bool,
    spot_observed: bool,
    history: Availability,
) -> Decision | None:
    """The policy's decision now, or None while the run's size is unknown (no total steps yet,
    or no compute hours given and none measured): the run then stays where it is. The compute
    hours are `needed_compute_h`'s (the plan's, raised by a slower measured pace). A run still
    idle with no step in its ledger one changeover after its start (a spot job that never found
    capacity; its provisioning is part of d) has done nothing, whatever its total: the policy
    decides for it, or a run that never starts would never be moved."""
    compute_h = needed_compute_h(terms, progress)
    fraction = progress.fraction
    never_started = progress.step == 0 and mode is Mode.IDLE
    if fraction is None and never_started and now_s - terms.started_at_s > terms.changeover_h * 3600.0:
        fraction = 0.0
    if compute_h is None or fraction is None:
        return None
    job = Job(compute_h=compute_h, deadline_h=terms.deadline_h, changeover_h=terms.changeover_h)
    seen_h, stretches, up_h = history.stats(start_s=terms.started_at_s, now_s=now_s)
    if spot_available and not spot_observed:  # assumed back: up since it was last seen down
        lost_s = history.last_unavailable_s()
        up_h = (now_s - (lost_s if lost_s is not None else terms.started_at_s)) / 3600.0
    obs = Observation(
        elapsed_h=max((now_s - terms.started_at_s) / 3600.0, 0.0),
        progress_h=fraction * compute_h,
        mode=mode,
        spot_available=spot_available,
        spot_seen_h=seen_h,
        spot_runs_seen=stretches,
        spot_up_h=up_h,
    )
    ratio = _price_ratio(terms)
    wanted = terms.make_policy(price_ratio=ratio).decide(job, obs)
    if wanted is Mode.IDLE and obs.remaining_h(job) <= 0:  # the last step is done, not yet saved:
        wanted = mode  # stopping the run now could lose its final checkpoint; it ends by itself
    return Decision(
        at_s=now_s,
        mode=wanted.value,
        current=mode.value,
        spot_available=spot_available,
        spot_observed=spot_observed,
        elapsed_h=obs.elapsed_h,
        deadline_h=job.deadline_h,
        progress_h=obs.progress_h,
        compute_h=compute_h,
        changeover_h=job.changeover_h,
        reason=_reason(job, obs, wanted, terms.policy),
    )


def _price_ratio(terms: DeadlineTerms) -> float | None:
    spot, on_demand = terms.spot_usd_per_hour, terms.on_demand_usd_per_hour
    return on_demand / spot if spot and on_demand else None


def _reason(job: Job, obs: Observation, wanted: Mode, policy: str) -> str:
    """Why this mode, in one line for `skygreen status` and the watcher's log."""
    if obs.remaining_h(job) <= 0:
        return "no work left"
    slack_h, two_d = obs.slack_h(job), 2 * job.changeover_h
    if wanted is Mode.ON_DEMAND and safety_net(job, obs, Mode.IDLE) is Mode.ON_DEMAND:
        return f"slack {slack_h:.2f} h is within two changeovers ({two_d:.2f} h): on-demand to the end"
    spot = "spot available" if obs.spot_available else "spot unavailable"
    return f"{policy} policy, {spot}, slack {slack_h:.2f} h"


MODE_WORDS = {Mode.SPOT.value: "spot", Mode.ON_DEMAND.value: "on-demand", Mode.IDLE.value: "idle"}
"""How a mode reads to a user (idle: no instance running for the run, waiting for spot)."""


class Action(str, enum.Enum):
    """What the watcher does about a decision this poll (one step at a time: a switch is a
    cancel now and a launch at a later poll, once the cancelled job has ended)."""

    NONE = "none"
    CANCEL = "cancel"
    LAUNCH_SPOT = "launch_spot"
    LAUNCH_ON_DEMAND = "launch_on_demand"


def next_action(*, wanted: Mode, spot: bool | None, state: str, queues_for_spot: bool) -> Action:
    """The one step from the job as it is towards the policy's mode.

    `spot`: the capacity of the latest launch; `state`: its job's `JobState` value;
    `queues_for_spot`: the launcher's spot jobs wait for capacity themselves (SkyPilot's
    managed jobs), so "wait for spot" is a launched spot job; a local run waits stopped.
    """
    alive = state in _ALIVE
    if state == "CANCELLING":
        return Action.NONE  # the earlier switch is still stopping the job
    if wanted is Mode.ON_DEMAND:
        if alive:
            return Action.NONE if not spot else Action.CANCEL
        return Action.LAUNCH_ON_DEMAND
    if wanted is Mode.SPOT:
        if alive:
            return Action.NONE if spot else Action.CANCEL
        return Action.LAUNCH_SPOT
    if alive:  # idle: no on-demand bought; a spot job may wait for capacity
        return Action.NONE if spot else Action.CANCEL
    return Action.LAUNCH_SPOT if queues_for_spot else Action.NONE
