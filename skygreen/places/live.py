"""The nomad policy run live: one watcher poll's choice of mode and place for a run.

`skygreen watch` of a run with several places (the regions its plan offered, or the places of
a replayed multi-region market) asks this module, every poll, where the run should be. It lays
the poll over the simulator's terms, one tick of `tick_s`: the run's work and time left in whole
ticks, each place's prices now as a one-tick `Market`, and what the run has seen of each place
(`PlaceSeen`: spot hours run there, preemptions, the last launch that found no capacity). Then it
asks the very `Nomad` that `skygreen simulate` replays, and takes the first of its options that
can be had: a spot launch where a market reading says spot is down fails for free, as in the
replay, and the next option is tried. A move's dollars are the whole bill's transfer rates
(`skygreen.bill.rates.transfer_usd`) for the checkpoint's bytes, the same rate the ledger later
prices the measured move with.

Pure: prices, availability and the clock are passed in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from skygreen.deadline.policy import Mode
from skygreen.places.journey import PlaceSeen
from skygreen.places.moves import MoveCosts, MoveTerms, changeover_s
from skygreen.places.nomad import Nomad
from skygreen.places.optimum import IDLE, OD, SPOT
from skygreen.places.place import Market, Place
from skygreen.places.rates import bill_egress_usd
from skygreen.places.run import Now, Seen

LIVE_TICK_S = 600.0
"""The tick a live decision counts in where no market sets one (the GCP trace's ten minutes):
a changeover of a few minutes is one tick, as in the simulations the nomad was tuned on."""
_MODE_INT = {Mode.IDLE: IDLE, Mode.SPOT: SPOT, Mode.ON_DEMAND: OD}
_INT_MODE = {IDLE: Mode.IDLE, SPOT: Mode.SPOT, OD: Mode.ON_DEMAND}


@dataclass(frozen=True, kw_only=True, slots=True)
class PlacePrice:
    """One place a run may go and its prices now, USD per hour for the run's whole gang."""

    place: Place
    spot_usd_per_hour: float
    on_demand_usd_per_hour: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Situation:
    """Everything one poll knows: the places, the run, its history."""

    places: tuple[PlacePrice, ...]
    available: tuple[bool | None, ...]
    """Per place: spot up now by a market reading; None where nothing tells (assumed up)."""
    at: int
    """Where the run is, or was last (index into `places`); -1 before it landed anywhere."""
    mode: Mode
    work_left_h: float
    time_left_h: float
    changeover_h: float
    checkpoint_gb: float
    seen: tuple[PlaceSeen, ...]
    now_s: float
    latched: bool = False
    """The safety net fired at an earlier poll: on-demand to the end."""
    changeover_s_by_cloud: Mapping[str, float] = field(default_factory=dict)
    """Changeovers measured by earlier runs of the task, per cloud (`skygreen.costs.changeovers`),
    in place of `changeover_h` for a launch there."""
    preempted: bool = False
    tick_s: float = LIVE_TICK_S

    def __post_init__(self) -> None:
        n = len(self.places)
        if n == 0 or len(self.available) != n or len(self.seen) != n:
            raise ValueError(f"{n} places, {len(self.available)} readings, {len(self.seen)} histories: they must agree")
        if not -1 <= self.at < n:
            raise ValueError(f"at must be -1 or a place index below {n}, got {self.at}")
        if self.at < 0 and self.mode is not Mode.IDLE:
            raise ValueError(f"a run on {self.mode.value} must be at a place")


@dataclass(frozen=True, kw_only=True, slots=True)
class PlaceChoice:
    """The poll's answer: the mode and place the run should be in, and why."""

    mode: Mode
    place: int
    """Index into the situation's places; -1 for idle."""
    reason: str
    scores_usd_per_hour: Mapping[str, float | None] = field(default_factory=dict)
    """Per place name: what a useful hour there costs if the run went now (its price over the
    predicted lifetime, plus the move amortised); None where the lifetime does not outlast a changeover."""
    accept_usd_per_hour: float = 0.0
    """The most the run will pay for a useful hour now (deadline pressure)."""
    pressure: float = 0.0
    """rho: work left over time left less two changeovers."""
    latched: bool = False
    found_down: tuple[int, ...] = ()
    """Places whose spot a market reading showed down when the choice tried them."""


def live_moves(places: Sequence[Place], terms: MoveTerms, tick_s: float) -> MoveCosts:
    """Egress (whole-bill rates) and changeover ticks between the places, as `move_costs` lays them out."""
    n = len(places)
    egress = np.zeros((n, n))
    ticks = np.zeros((n, n), dtype=np.int64)
    first = np.zeros(n, dtype=np.int64)
    for j, dst in enumerate(places):
        first[j] = _ticks(changeover_s(terms, None, dst), tick_s)
        for i, src in enumerate(places):
            egress[i, j] = bill_egress_usd(src, dst, terms.checkpoint_gb)
            ticks[i, j] = _ticks(changeover_s(terms, src, dst), tick_s)
    return MoveCosts(egress_usd=egress, changeover_ticks=ticks, first_ticks=first)


def _ticks(seconds: float, tick_s: float) -> int:
    return max(1, math.ceil(seconds / tick_s - 1e-9))


def choose(s: Situation, *, nomad: Nomad | None = None) -> PlaceChoice:
    """The nomad's choice for this poll (module docstring). An empty option list keeps the run
    where and as it is."""
    nomad = nomad or Nomad()
    places = tuple(p.place for p in s.places)
    tick_h = s.tick_s / 3600.0
    market = Market(
        places=places,
        tick_s=s.tick_s,
        available=np.ones((len(places), 1), dtype=bool),  # the nomad never reads it
        spot_usd_per_hour=np.array([[p.spot_usd_per_hour] for p in s.places], dtype=float),
        on_demand_usd_per_hour=np.array([p.on_demand_usd_per_hour for p in s.places], dtype=float),
    )
    terms = MoveTerms(checkpoint_gb=s.checkpoint_gb, changeover_s=s.changeover_h * 3600.0,
                      changeover_s_by_cloud=s.changeover_s_by_cloud)  # fmt: skip
    moves = live_moves(places, terms, s.tick_s)
    work = max(math.ceil(s.work_left_h / tick_h - 1e-9), 1)
    time_left = math.floor(s.time_left_h / tick_h + 1e-9)
    nomad.reset(market, moves, work, time_left)
    if s.latched:
        nomad.latch()
    mode = _MODE_INT[s.mode]
    at = s.at if s.at >= 0 else -1
    now = Now(tick=0, work_left=work, time_left=time_left, mode=mode, at=at, checkpoint=at, changeover_left=0,
              preempted=s.preempted)  # fmt: skip
    seen = [_seen(h, s.now_s, s.tick_s) for h in s.seen]
    options = nomad.decide(now, seen)
    scores = nomad.useful_tick_usd(now, seen)
    accept = nomad.accept_tick_usd(now)
    rho = work / max(time_left - 2 * moves.max_ticks, 1)
    named = {p.name: (None if not math.isfinite(c) else c / tick_h) for p, c in zip(places, scores, strict=True)}
    down: list[int] = []
    wanted, where = s.mode, s.at
    for option_mode, r in options:
        if option_mode == SPOT and s.available[r] is False:
            down.append(r)
            continue
        wanted, where = _INT_MODE[option_mode], r
        break
    if wanted is Mode.IDLE:
        where = -1
    choice = PlaceChoice(mode=wanted, place=where, reason="", scores_usd_per_hour=named,
                         accept_usd_per_hour=accept / tick_h, pressure=rho, latched=nomad.net_fired,
                         found_down=tuple(down))  # fmt: skip
    return _with_reason(choice, s, places)


def _seen(h: PlaceSeen, now_s: float, tick_s: float) -> Seen:
    failed = -(10**9) if h.failed_at_s is None else -math.floor(max(now_s - h.failed_at_s, 0.0) / tick_s)
    return Seen(run_h=h.run_h, preemptions=h.preemptions, last_failed_tick=failed)


def _with_reason(c: PlaceChoice, s: Situation, places: tuple[Place, ...]) -> PlaceChoice:
    """The choice with its reason in one line: what decided it, in the scores it was decided on."""

    def score(r: int) -> str:
        value = c.scores_usd_per_hour.get(places[r].name)
        return "-" if value is None else f"${value:.2f}/useful h"

    here = places[s.at].name if s.at >= 0 else None
    down = ", ".join(places[r].name for r in c.found_down)
    pressure = f"pressure {c.pressure:.2f}, accept up to ${c.accept_usd_per_hour:.2f}/h"
    if c.latched:
        reason = f"safety net: slack within two changeovers; on-demand at {places[c.place].name} to the end"
    elif c.mode is Mode.ON_DEMAND and s.mode is not Mode.ON_DEMAND:
        reason = f"pressure: on-demand at {places[c.place].name} ({pressure})"
    elif c.mode is Mode.SPOT and c.place != s.at and s.mode is Mode.SPOT:
        price = s.places[s.at].spot_usd_per_hour
        reason = f"price: {places[c.place].name} at {score(c.place)} beats {here} at ${price:.2f}/h by the margin"
    elif c.mode is Mode.SPOT and (c.place != s.at or s.mode is not Mode.SPOT):
        why = f"availability: {down} down; " if down else ("availability: preempted; " if s.preempted else "")
        reason = f"{why}{places[c.place].name} at {score(c.place)} ({pressure})"
    elif c.mode is Mode.IDLE and s.mode is not Mode.SPOT:
        best = min(range(len(places)), key=lambda r: c.scores_usd_per_hour[places[r].name] or math.inf)
        downs = f"{down} down; " if down else ""
        reason = f"wait: {downs}cheapest {places[best].name} at {score(best)} ({pressure})"
    elif c.mode is Mode.ON_DEMAND:
        reason = f"stay on on-demand at {here}: pressure {c.pressure:.2f} too high to leave"
    else:
        reason = f"stay at {here or 'no place'}: nothing better by the margin ({pressure})"
    return PlaceChoice(mode=c.mode, place=c.place, reason=reason, scores_usd_per_hour=c.scores_usd_per_hour,
                       accept_usd_per_hour=c.accept_usd_per_hour, pressure=c.pressure, latched=c.latched,
                       found_down=c.found_down)  # fmt: skip
