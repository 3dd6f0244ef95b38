"""Replay a spot availability trace against a deadline policy, and price what it did.

Time runs on a grid of decision intervals dt = tick / m: every trace tick split into m equal
intervals, m the smallest that makes dt <= d and the changeover, rounded up to whole
intervals, at most 10% longer than asked (the policies are given that rounded changeover, so
the safety rule stays sound; see `skygreen.deadline.policy`). The simulator and the optimum
(`skygreen.deadline.optimum`) price exactly the same model. An interval has spot when its tick
shows all `nodes` of the gang available (the paper's polarization rule); after the trace ends
spot is unavailable. Costs count every node: (spot hours x spot price + on-demand hours x
on-demand price) x nodes, changeovers included (billed at the new instance's price).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from skygreen.deadline.policy import Job, Mode, Observation, Policy

MAX_SPLIT = 12
ROUNDING = 1.1


@dataclass(frozen=True, kw_only=True, slots=True)
class Prices:
    """What the simulator charges: USD per node-hour on spot and on on-demand, and the gang's node
    count that every hour is billed for. Raises ValueError for a negative or non-finite price, or
    fewer than one node.
    """

    spot_usd_per_node_hour: float
    on_demand_usd_per_node_hour: float
    nodes: int = 1

    def __post_init__(self) -> None:
        for name in ("spot_usd_per_node_hour", "on_demand_usd_per_node_hour"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if self.nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {self.nodes}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Grid:
    """The decision grid of one job over one trace, in whole intervals of `dt_h`."""

    dt_h: float
    compute_steps: int
    deadline_steps: int
    changeover_steps: int
    available: tuple[bool, ...]
    """Spot per interval from the start, long enough to finish on on-demand past the deadline."""
    job: Job
    """The job as the grid sees it: compute and changeover rounded up, the deadline down, to
    whole intervals (what the policies are told, so that the safety rule holds on the grid)."""
    zones: tuple[tuple[bool, ...], ...] = ()
    """Several zones (`make_multizone_grid`): spot per zone; `available` is then "in any zone"."""

    @property
    def horizon_steps(self) -> int:
        """The intervals the grid covers: past the deadline, long enough to finish on on-demand after it."""
        return len(self.available)


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """What one policy did on the grid: the cost in USD for all nodes, the finish and whether it met
    the deadline (hours from the job's start), hours per node on spot and on on-demand, and the
    changeovers paid.
    """

    policy: str
    cost_usd: float
    finish_h: float | None
    """None: not finished (only a job that could not finish on on-demand from the start)."""
    deadline_met: bool
    spot_h: float
    """Hours billed on spot, per node (changeovers included)."""
    on_demand_h: float
    switches: int
    """Changeovers paid: every start of a spot or on-demand stretch, the first one included."""

    def to_json(self) -> dict:
        """The outcome for `skygreen simulate --json`, hours and cost rounded to 4 decimals."""
        return {
            "policy": self.policy,
            "cost_usd": round(self.cost_usd, 4),
            "finish_h": None if self.finish_h is None else round(self.finish_h, 4),
            "deadline_met": self.deadline_met,
            "spot_h": round(self.spot_h, 4),
            "on_demand_h": round(self.on_demand_h, 4),
            "switches": self.switches,
        }


def split_per_tick(changeover_h: float, tick_s: float) -> int:
    """m: decision intervals per trace tick (see the module docstring)."""
    d_s = changeover_h * 3600.0
    for m in range(1, MAX_SPLIT + 1):
        dt_s = tick_s / m
        if dt_s <= d_s + 1e-9 and math.ceil(d_s / dt_s - 1e-9) * dt_s <= ROUNDING * d_s + 1e-9:
            return m
    return MAX_SPLIT


def make_grid(job: Job, available: Sequence[int], *, tick_s: float, start_tick: int = 0) -> Grid:
    """The job's grid over a 0/1 availability series (`SpotTrace.available(nodes)`) from tick
    `start_tick`."""
    m = split_per_tick(job.changeover_h, tick_s)
    dt_h = tick_s / m / 3600.0
    compute_steps = math.ceil(job.compute_h / dt_h - 1e-9)
    deadline_steps = math.floor(job.deadline_h / dt_h + 1e-9)
    changeover_steps = math.ceil(job.changeover_h / dt_h - 1e-9)
    horizon = max(deadline_steps, 0) + compute_steps + 2 * changeover_steps + 1
    n = len(available)
    ticks = [start_tick + j // m for j in range(horizon)]
    return Grid(
        dt_h=dt_h,
        compute_steps=compute_steps,
        deadline_steps=deadline_steps,
        changeover_steps=changeover_steps,
        available=tuple(0 <= i < n and bool(available[i]) for i in ticks),
        job=Job(compute_h=compute_steps * dt_h, deadline_h=deadline_steps * dt_h, changeover_h=changeover_steps * dt_h),
    )


def make_multizone_grid(job: Job, zones: Sequence[Sequence[int]], *, tick_s: float, start_tick: int = 0) -> Grid:
    """A grid over several zones' series (same ticks): spot is available when any zone has it;
    a job on spot runs in one zone and is preempted when that zone loses it, even if another
    zone still has spot (moving there is a new changeover)."""
    if not zones:
        raise ValueError("no zones")
    grids = [make_grid(job, z, tick_s=tick_s, start_tick=start_tick) for z in zones]
    per_zone = tuple(g.available for g in grids)
    anywhere = tuple(any(column) for column in zip(*per_zone, strict=True))
    return replace(grids[0], available=anywhere, zones=per_zone)


def simulate(policy: Policy, grid: Grid, prices: Prices) -> Outcome:
    """Run the policy over the grid until the job is done (or the horizon ends)."""
    dt = grid.dt_h
    job = grid.job
    mode = Mode.IDLE
    progress = changeover_left = spot_steps = od_steps = switches = seen = stretches = 0
    before = False
    finish: float | None = None
    zone = up_steps = 0
    up_since = [0] * len(grid.zones)
    for j, avail in enumerate(grid.available):
        if progress >= grid.compute_steps:
            break
        if avail:
            seen += 1
            stretches += 0 if before else 1
        up_steps = up_steps + 1 if avail else 0
        before = avail
        for z, series in enumerate(grid.zones):
            if not series[j]:
                up_since[z] = j + 1
        here = grid.zones[zone][j] if grid.zones else avail
        if mode is Mode.SPOT and not here:
            mode, changeover_left = Mode.IDLE, 0  # preempted: the instances are gone
            stretches += 1 if avail else 0  # spot elsewhere is a new stretch for this job
        obs = Observation(
            elapsed_h=j * dt,
            progress_h=progress * dt,
            mode=mode,
            spot_available=avail,
            spot_seen_h=seen * dt,
            spot_runs_seen=stretches,
            spot_up_h=up_steps * dt,
        )
        wanted = policy.decide(job, obs)
        if wanted is not mode:
            if wanted is Mode.SPOT and grid.zones:  # the zone up the longest so far
                zone = min((z for z in range(len(grid.zones)) if grid.zones[z][j]), key=lambda z: up_since[z])
            mode = wanted
            changeover_left = grid.changeover_steps if wanted is not Mode.IDLE else 0
            switches += wanted is not Mode.IDLE
        if mode is Mode.IDLE:
            continue
        if mode is Mode.SPOT:
            spot_steps += 1
        else:
            od_steps += 1
        if changeover_left:
            changeover_left -= 1
        else:
            progress += 1
            if progress >= grid.compute_steps:
                finish = (j + 1) * dt
    return _outcome(
        policy.name, grid, prices, finish=finish, spot_steps=spot_steps, od_steps=od_steps, switches=switches
    )


def on_demand_only(grid: Grid, prices: Prices) -> Outcome:
    """The baseline: on-demand from the first minute to the end, one changeover."""
    steps = grid.changeover_steps + grid.compute_steps
    return _outcome("on_demand", grid, prices, finish=steps * grid.dt_h, spot_steps=0, od_steps=steps, switches=1)


def _outcome(
    name: str, grid: Grid, prices: Prices, *, finish: float | None, spot_steps: int, od_steps: int, switches: int
) -> Outcome:
    dt = grid.dt_h
    spot_h, od_h = spot_steps * dt, od_steps * dt
    cost = (spot_h * prices.spot_usd_per_node_hour + od_h * prices.on_demand_usd_per_node_hour) * prices.nodes
    met = finish is not None and finish <= grid.deadline_steps * dt + 1e-9
    return Outcome(
        policy=name,
        cost_usd=cost,
        finish_h=finish,
        deadline_met=met,
        spot_h=spot_h,
        on_demand_h=od_h,
        switches=switches,
    )
