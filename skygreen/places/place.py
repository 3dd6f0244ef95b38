"""A place and a market of places over time.

A place is where one gang of instances can run: a cloud, a region, an optional zone, an offer
(the instance type) and a node count. Regions decide what a move costs (egress, transfer);
zones decide availability. A `Market` holds, for every place and every trace tick, whether spot
is up and what spot costs, plus each place's on-demand price: the V100 traces carry per-tick
spot prices, the H100 traces one list price per zone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, kw_only=True, slots=True)
class Place:
    """One gang's location: cloud, region, optional zone, offer and nodes."""

    cloud: str
    region: str
    zone: str | None = None
    offer: str = ""
    nodes: int = 1

    def __post_init__(self) -> None:
        if not self.cloud or not self.region:
            raise ValueError(f"a place needs a cloud and a region, got cloud={self.cloud!r} region={self.region!r}")
        if self.nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {self.nodes}")

    @property
    def name(self) -> str:
        """The zone where there is one, else the region (how reports name the place)."""
        return self.zone or self.region


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class Market:
    """Places over time: spot availability and price per (place, tick), on-demand price per place.

    Prices are USD per hour for the whole gang of the place. Raises ValueError for shapes that do
    not agree, a negative or non-finite price, or no place.
    """

    places: tuple[Place, ...]
    tick_s: float
    available: np.ndarray
    """bool, places x ticks: spot is up for the whole gang."""
    spot_usd_per_hour: np.ndarray
    """float, places x ticks."""
    on_demand_usd_per_hour: np.ndarray
    """float, places."""
    start_utc: str | None = None

    def __post_init__(self) -> None:
        n = len(self.places)
        if n == 0:
            raise ValueError("a market needs at least one place")
        if not (math.isfinite(self.tick_s) and self.tick_s > 0):
            raise ValueError(f"tick_s must be > 0, got {self.tick_s}")
        avail = np.asarray(self.available, dtype=bool)
        spot = np.asarray(self.spot_usd_per_hour, dtype=float)
        od = np.asarray(self.on_demand_usd_per_hour, dtype=float)
        if avail.ndim != 2 or avail.shape[0] != n or spot.shape != avail.shape or od.shape != (n,):
            raise ValueError(
                f"shapes disagree: {n} places, available {avail.shape}, spot {spot.shape}, on-demand {od.shape}"
            )
        if not (np.all(np.isfinite(spot)) and np.all(spot >= 0) and np.all(np.isfinite(od)) and np.all(od >= 0)):
            raise ValueError("prices must be finite and >= 0")
        object.__setattr__(self, "available", avail)
        object.__setattr__(self, "spot_usd_per_hour", spot)
        object.__setattr__(self, "on_demand_usd_per_hour", od)

    @property
    def ticks(self) -> int:
        """The number of trace ticks."""
        return int(self.available.shape[1])

    @property
    def tick_h(self) -> float:
        """One tick in hours."""
        return self.tick_s / 3600.0

    def window(self, start_tick: int, ticks: int) -> Market:
        """The market from `start_tick` for `ticks` ticks; past the trace's end spot is down at the
        last known price."""
        if start_tick < 0 or start_tick >= self.ticks:
            raise ValueError(f"start tick {start_tick} is outside the trace (0 to {self.ticks - 1})")
        end = start_tick + ticks
        avail = np.zeros((len(self.places), ticks), dtype=bool)
        spot = np.repeat(self.spot_usd_per_hour[:, -1:], ticks, axis=1)
        have = min(end, self.ticks) - start_tick
        avail[:, :have] = self.available[:, start_tick : start_tick + have]
        spot[:, :have] = self.spot_usd_per_hour[:, start_tick : start_tick + have]
        return Market(
            places=self.places,
            tick_s=self.tick_s,
            available=avail,
            spot_usd_per_hour=spot,
            on_demand_usd_per_hour=self.on_demand_usd_per_hour,
        )

    def subset(self, names: tuple[str, ...]) -> Market:
        """Only the places with these names (zone, else region), in that order. Raises ValueError
        naming an unknown one."""
        index = {p.name: i for i, p in enumerate(self.places)}
        missing = [n for n in names if n not in index]
        if missing:
            raise ValueError(f"unknown place(s) {', '.join(missing)}; known: {', '.join(index)}")
        rows = [index[n] for n in names]
        return Market(
            places=tuple(self.places[i] for i in rows),
            tick_s=self.tick_s,
            available=self.available[rows],
            spot_usd_per_hour=self.spot_usd_per_hour[rows],
            on_demand_usd_per_hour=self.on_demand_usd_per_hour[rows],
            start_utc=self.start_utc,
        )
