"""What a move between places costs: the checkpoint's egress in dollars and the changeover in ticks.

A move is a launch at a place whose region is not the checkpoint's: the checkpoint's bytes pay
the egress rate (`skygreen.places.rates`), the transfer takes bytes / bandwidth, and the new
gang needs its changeover (provisioning, setup, restore: the figure `costs/changeovers.py`
measures per cloud and GPU). A launch in the checkpoint's own region pays only the changeover.
With `overlap_transfer` the copy into the target's bucket runs while the target provisions
(pre-staging), so the changeover is the longer of the two, not their sum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from skygreen.places.place import Market, Place
from skygreen.places.rates import egress_usd_per_gb


@dataclass(frozen=True, kw_only=True, slots=True)
class MoveTerms:
    """The job's side of a move: checkpoint size, changeover per launch, bandwidth between regions.

    `changeover_s_by_cloud` overrides `changeover_s` per cloud (measured changeovers);
    `bandwidth_gbit_s` None means the transfer is not timed (it overlaps provisioning, as in
    SkyNomad's sweeps)."""

    checkpoint_gb: float
    changeover_s: float
    changeover_s_by_cloud: Mapping[str, float] = field(default_factory=dict)
    bandwidth_gbit_s: float | None = None
    overlap_transfer: bool = False

    def __post_init__(self) -> None:
        for name in ("checkpoint_gb", "changeover_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if self.bandwidth_gbit_s is not None and not self.bandwidth_gbit_s > 0:
            raise ValueError(f"bandwidth_gbit_s must be > 0, got {self.bandwidth_gbit_s}")


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class MoveCosts:
    """Per pair of places (checkpoint at i, launch at j): egress USD and changeover ticks; and the
    ticks of a first launch (no checkpoint yet) per place."""

    egress_usd: np.ndarray
    changeover_ticks: np.ndarray
    first_ticks: np.ndarray

    @property
    def max_ticks(self) -> int:
        """The longest changeover of any launch."""
        return int(max(self.changeover_ticks.max(), self.first_ticks.max()))


def changeover_s(terms: MoveTerms, src: Place | None, dst: Place) -> float:
    """Seconds from asking for `dst` to its first step, the checkpoint coming from `src`."""
    base = terms.changeover_s_by_cloud.get(dst.cloud, terms.changeover_s)
    if src is None or src.region == dst.region or terms.bandwidth_gbit_s is None:
        return base
    transfer = terms.checkpoint_gb * 8.0 / terms.bandwidth_gbit_s
    return max(base, transfer) if terms.overlap_transfer else base + transfer


def move_costs(market: Market, terms: MoveTerms) -> MoveCosts:
    """Egress and changeover ticks for every launch in this market (ticks rounded up)."""
    places = market.places
    n = len(places)
    egress = np.zeros((n, n))
    ticks = np.zeros((n, n), dtype=np.int64)
    first = np.zeros(n, dtype=np.int64)
    for j, dst in enumerate(places):
        first[j] = _ticks(changeover_s(terms, None, dst), market.tick_s)
        for i, src in enumerate(places):
            egress[i, j] = terms.checkpoint_gb * egress_usd_per_gb(src, dst)
            ticks[i, j] = _ticks(changeover_s(terms, src, dst), market.tick_s)
    return MoveCosts(egress_usd=egress, changeover_ticks=ticks, first_ticks=first)


def _ticks(seconds: float, tick_s: float) -> int:
    """Whole ticks, rounded up, at least one (a launch never makes progress in its own tick)."""
    return max(1, math.ceil(seconds / tick_s - 1e-9))
