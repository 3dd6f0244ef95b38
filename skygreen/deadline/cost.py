"""Plan under a deadline: drop offers that cannot finish in time, price spot with its fallback.

With a deadline, a spot offer means spot under skygreen's deadline policy
(`skygreen.deadline.policy.ExpectedSpot`): spot while it serves, on-demand of the same offer
when the deadline requires it. Its expected cost is the mix of spot and on-demand hours that
policy buys:

- from the real traces where skygreen has them (AWS V100, GCP H100; one-node jobs):
  `skygreen/data/deadline_spot_share.csv`, made by `scripts/make_deadline_table.py` by replaying
  the policy over every zone's trace; spot and on-demand hours per compute hour, interpolated in
  slack R/C and taken at the nearest changeover d;
- from the preemption model elsewhere (`skygreen.plan.cost`): spot progresses rho = C / wall
  hours of a spot run; if rho x (R - 2d) covers C, the run stays on spot; otherwise the shortfall
  runs on on-demand: o = (C - rho x R') / (1 - rho) hours of it, R' = R - d, and R' - o on spot.

d, the changeover, is the model's loss per preemption: restart plus half a checkpoint interval.
An offer is dropped when even the safety rule cannot finish it: C + 2d > R for spot with an
on-demand price, its expected wall time > R for spot without one, C + d > R for on-demand.
"""

from __future__ import annotations

import csv
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Protocol

SHARE_TABLE = Path(__file__).resolve().parents[1] / "data" / "deadline_spot_share.csv"


@dataclass(frozen=True, kw_only=True, slots=True)
class Share:
    """Spot and on-demand hours the policy bought per compute hour, at one slack and changeover."""

    slack: float
    changeover_h: float
    spot: float
    on_demand: float
    finish: float


@cache
def trace_shares() -> Mapping[tuple[str, str], tuple[Share, ...]]:
    """(cloud, accelerator) -> measured shares, from the shipped table."""
    text = SHARE_TABLE.read_text(encoding="utf-8")
    out: dict[tuple[str, str], list[Share]] = {}
    for row in csv.DictReader(text.splitlines()):
        share = Share(
            slack=float(row["slack"]),
            changeover_h=float(row["changeover_h"]),
            spot=float(row["spot_h_per_compute_h"]),
            on_demand=float(row["on_demand_h_per_compute_h"]),
            finish=float(row["finish_h_per_compute_h"]),
        )
        out.setdefault((row["cloud"], row["accelerator"]), []).append(share)
    return {key: tuple(rows) for key, rows in out.items()}


def share_at(rows: Sequence[Share], *, slack: float, changeover_h: float) -> Share:
    """The measured share at the nearest changeover, linear in slack between the measured ones
    (clamped to the measured range)."""
    nearest_d = min({r.changeover_h for r in rows}, key=lambda d: abs(d - changeover_h))
    line = sorted((r for r in rows if r.changeover_h == nearest_d), key=lambda r: r.slack)
    if slack <= line[0].slack:
        return line[0]
    for low, high in itertools.pairwise(line):
        if slack <= high.slack:
            w = (slack - low.slack) / (high.slack - low.slack)
            return Share(
                slack=slack,
                changeover_h=nearest_d,
                spot=low.spot + w * (high.spot - low.spot),
                on_demand=low.on_demand + w * (high.on_demand - low.on_demand),
                finish=low.finish + w * (high.finish - low.finish),
            )
    return line[-1]


@dataclass(frozen=True, kw_only=True, slots=True)
class DeadlineCost:
    """One offer priced under the deadline policy: its expected wall hours, its USD cost for all
    nodes, and the hours each node is expected to spend on spot and on on-demand."""

    est_hours: float
    est_cost_usd: float
    spot_hours: float
    on_demand_hours: float
    source: str
    """"traces" or "model"."""


def under_deadline(
    *,
    cloud: str,
    accelerator: str,
    spot: bool,
    compute_h: float,
    spot_wall_h: float,
    changeover_h: float,
    deadline_h: float,
    spot_price: float | None,
    on_demand_price: float | None,
    nodes: int,
) -> DeadlineCost | tuple[float, str]:
    """The expected cost and wall time of one offer with the deadline policy, or (the hours it
    needs at least, why) when it cannot finish in time."""
    d = changeover_h
    if not spot:
        wall = compute_h + d
        if wall > deadline_h or on_demand_price is None:
            return wall, f"needs {wall:.1f} h on on-demand"
        return DeadlineCost(est_hours=wall, est_cost_usd=wall * on_demand_price * nodes, spot_hours=0.0,
                            on_demand_hours=wall, source="model")  # fmt: skip
    assert spot_price is not None
    if on_demand_price is None:
        if spot_wall_h > deadline_h:
            return spot_wall_h, f"needs {spot_wall_h:.1f} h on spot and has no on-demand price to fall back on"
        return DeadlineCost(est_hours=spot_wall_h, est_cost_usd=spot_wall_h * spot_price * nodes,
                            spot_hours=spot_wall_h, on_demand_hours=0.0, source="model")  # fmt: skip
    if compute_h + 2 * d > deadline_h:
        return compute_h + 2 * d, f"needs {compute_h + 2 * d:.1f} h even with an on-demand fallback"
    rows = trace_shares().get((cloud, accelerator)) if nodes == 1 else None
    if rows:
        share = share_at(rows, slack=deadline_h / compute_h, changeover_h=d)
        spot_h, od_h = share.spot * compute_h, share.on_demand * compute_h
        wall = min(share.finish * compute_h, deadline_h)
        source = "traces"
    else:
        spot_h, od_h, wall = _model_mix(compute_h, spot_wall_h, d, deadline_h)
        source = "model"
    cost = (spot_h * spot_price + od_h * on_demand_price) * nodes
    return DeadlineCost(est_hours=wall, est_cost_usd=cost, spot_hours=spot_h, on_demand_hours=od_h, source=source)


def _model_mix(compute_h: float, spot_wall_h: float, d: float, deadline_h: float) -> tuple[float, float, float]:
    """(spot h, on-demand h, wall h) from the preemption model's spot progress rate."""
    rho = compute_h / spot_wall_h if spot_wall_h > 0 else 1.0
    if rho * (deadline_h - 2 * d) >= compute_h:
        return spot_wall_h, 0.0, spot_wall_h
    usable = deadline_h - d
    od_h = (compute_h - rho * usable) / (1 - rho) if rho < 1 else 0.0
    od_h = min(max(od_h, 0.0), usable)
    return usable - od_h, od_h + d, deadline_h


def changeover_h(restart_s: float, checkpoint_interval_s: float | None) -> float:
    """d for an offer: restart plus the work lost since the last checkpoint (half an interval)."""
    lost_s = checkpoint_interval_s / 2 if checkpoint_interval_s and math.isfinite(checkpoint_interval_s) else 0.0
    return max((restart_s + lost_s) / 3600.0, 1.0 / 60.0)


class Priced(Protocol):
    """What `assess` reads of a ranked candidate (`skygreen.plan.rank.Candidate`)."""

    @property
    def cloud(self) -> str:
        """The offer's cloud ("aws", "gcp", "azure"), a key of the share table."""
        ...

    @property
    def accelerator(self) -> str:
        """The GPU model as skygreen names it ("V100"), a key of the share table."""
        ...

    @property
    def spot(self) -> bool:
        """True for a spot offer, False for an on-demand one."""
        ...

    @property
    def compute_hours(self) -> float:
        """Hours of uninterrupted training the job needs on this offer."""
        ...

    @property
    def est_hours(self) -> float:
        """Expected wall hours from the estimate model (preemption overhead included on spot),
        before deadline pricing."""
        ...

    @property
    def checkpoint_interval_s(self) -> float | None:
        """Seconds between checkpoints the estimate assumed; None where it assumed none
        (`every: auto` with no preemption expected)."""
        ...

    @property
    def spot_price_usd_per_hour(self) -> float | None:
        """USD per node-hour on spot; None when the catalog lists no spot price."""
        ...

    @property
    def on_demand_price_usd_per_hour(self) -> float | None:
        """USD per node-hour on demand; None when the catalog lists no on-demand price."""
        ...

    @property
    def num_nodes(self) -> int:
        """Nodes the job runs on; the shares measured on traces hold for one node only."""
        ...


def assess(c: Priced, *, deadline_h: float, restart_s: float) -> DeadlineCost | tuple[float, str]:
    """One candidate under the deadline: repriced, or (hours it needs, why it is dropped)."""
    return under_deadline(
        cloud=c.cloud,
        accelerator=c.accelerator,
        spot=c.spot,
        compute_h=c.compute_hours,
        spot_wall_h=c.est_hours,
        changeover_h=changeover_h(restart_s, c.checkpoint_interval_s),
        deadline_h=deadline_h,
        spot_price=c.spot_price_usd_per_hour,
        on_demand_price=c.on_demand_price_usd_per_hour,
        nodes=c.num_nodes,
    )


def no_offer_message(deadline_h: float, dropped: Mapping[str, tuple[float, str]], *, source: str | None) -> str:
    """Every offer is too slow: say so, with the fastest and what deadline it would need."""
    fastest = min(dropped.items(), key=lambda item: item[1][0])
    where = f"{source}: " if source else ""
    return (
        f"{where}skygreen.deadline: no offer can finish within {deadline_h:g} h ({len(dropped)} offers too slow)\n"
        f"  got: {deadline_h:g} h\n"
        f"  fastest: {fastest[0]} {fastest[1][1]}\n"
        f"  fix: set a deadline of at least {math.ceil(fastest[1][0] * 10) / 10:g} h (--deadline or skygreen.deadline), "
        f"or allow faster GPUs or more of them (skygreen.gpus, skygreen.gpu_count)"
    )


def assumption(deadline_h: float, traced: Sequence[str], dropped: Mapping[str, tuple[float, str]]) -> str:
    """The plan's line on deadline pricing: the offers priced from real traces (`traced`, "cloud GPU"
    each, shown once), the preemption model for the rest, how many offers were dropped as too slow,
    and what `skygreen up --deadline` does with the run."""
    sources = sorted(set(traced))
    traced = f"real spot traces for {', '.join(sources)}" if sources else "no real trace for these GPUs"
    return (
        f"deadline {deadline_h:g} h: spot offers fall back to on-demand by skygreen's deadline policy, expected cost "
        f"from {traced}, else the preemption model; {len(dropped)} offer(s) dropped as too slow; "
        f"`skygreen up --deadline` moves the run between spot and on-demand as the policy says"
    )
