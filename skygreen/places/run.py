"""Replay a market against a place policy, tick by tick, and price what it did.

Each tick a policy names the options it wants, in order: (mode, place) pairs, or idle. The
first that can be had is taken: staying where the job is, going idle (the checkpoint stays
where it was last written), or a launch. A spot launch where spot is down fails at no cost, as
a failed spot request does, and the policy is told; on-demand always launches. A launch pays
its changeover (whole ticks at the new price, no progress) and, in a region other than the
checkpoint's, the checkpoint's egress. A gang on spot is preempted when its place goes down.
Probes (launch and cancel at once) are billed one minute of the place's spot price when they
land. The policy never reads availability; it learns it from launches, runs and probes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from skygreen.places.moves import MoveCosts
from skygreen.places.optimum import IDLE, SPOT, Schedule
from skygreen.places.place import Market

PROBE_S = 60.0
Option = tuple[int, int]
"""(mode, place): (SPOT, r), (OD, r), or (IDLE, -1)."""


@dataclass(kw_only=True, slots=True)
class Now:
    """What a policy knows at one tick: the job's state and its history so far."""

    tick: int
    work_left: int
    time_left: int
    mode: int
    at: int
    """Where the gang is (or was last, when idle); -1 before the first launch."""
    checkpoint: int
    """Where the last checkpoint lives; -1 before any work."""
    changeover_left: int
    preempted: bool = False
    """The gang was preempted at the start of this tick."""


@dataclass(kw_only=True, slots=True)
class Seen:
    """What the run itself observed of one place: spot hours run there, preemptions, probes."""

    run_h: float = 0.0
    preemptions: int = 0
    last_failed_tick: int = -(10**9)
    probe_up_since: int | None = None
    probe_run_h: float = 0.0
    probe_failures: int = 0
    last_probe_tick: int = -(10**9)


class PlacePolicy(Protocol):
    """A policy over places, as `replay` calls it."""

    name: str

    def reset(self, market: Market, moves: MoveCosts, work_ticks: int, deadline_ticks: int) -> None:
        """Start a new job (prices and moves are public; availability is not)."""
        ...

    def decide(self, now: Now, seen: list[Seen]) -> list[Option]:
        """Options to try, best first; an empty list means: keep doing what the job does."""
        ...

    def probes(self, now: Now, seen: list[Seen]) -> list[int]:
        """Places to probe this tick (billed); usually none."""
        ...


@dataclass(kw_only=True, slots=True)
class _Bill:
    compute: float = 0.0
    changeover: float = 0.0
    egress: float = 0.0
    probe: float = 0.0
    launches: int = 0
    moves: int = 0
    net: bool = False
    place: list[int] = field(default_factory=list)
    mode: list[int] = field(default_factory=list)


def replay(policy: PlacePolicy, market: Market, moves: MoveCosts, *, work_ticks: int, deadline_ticks: int) -> Schedule:
    """Run `policy` from tick 0 of `market` until the work is done or the trace runs out."""
    policy.reset(market, moves, work_ticks, deadline_ticks)
    n = len(market.places)
    horizon = min(market.ticks, deadline_ticks + work_ticks + 4 * moves.max_ticks + 2)
    spot_tick = market.spot_usd_per_hour * market.tick_h
    od_tick = market.on_demand_usd_per_hour * market.tick_h
    seen = [Seen() for _ in range(n)]
    now = Now(tick=0, work_left=work_ticks, time_left=deadline_ticks, mode=IDLE, at=-1, checkpoint=-1,
              changeover_left=0)  # fmt: skip
    bill = _Bill()
    finish = None
    for t in range(horizon):
        now.tick, now.time_left, now.preempted = t, deadline_ticks - t, False
        if now.mode == SPOT and not market.available[now.at, t]:
            seen[now.at].preemptions += 1
            now.mode, now.changeover_left, now.preempted = IDLE, 0, True
        for r in policy.probes(now, seen):
            _probe(seen[r], r, t, market, spot_tick, bill)
        for mode, place in policy.decide(now, seen):
            if _take(now, mode, place, t, market, moves, seen, bill, spot_tick):
                break
        if getattr(policy, "net_fired", False):
            bill.net = True
        bill.place.append(now.at)
        bill.mode.append(now.mode)
        if now.mode == IDLE:
            continue
        price = spot_tick[now.at, t] if now.mode == SPOT else od_tick[now.at]
        if now.mode == SPOT:
            seen[now.at].run_h += market.tick_h
        if now.changeover_left:
            bill.changeover += price
            now.changeover_left -= 1
            continue
        bill.compute += price
        now.checkpoint = now.at
        now.work_left -= 1
        if now.work_left == 0:
            finish = t + 1
            break
    pad = deadline_ticks - len(bill.place)
    place_at = np.array(bill.place + [bill.place[-1] if bill.place else -1] * max(pad, 0), dtype=np.int64)
    mode_at = np.array(bill.mode + [IDLE] * max(pad, 0), dtype=np.int8)
    return Schedule(
        arm=policy.name,
        cost_usd=bill.compute + bill.changeover + bill.egress + bill.probe,
        compute_usd=bill.compute,
        changeover_usd=bill.changeover,
        egress_usd=bill.egress,
        probe_usd=bill.probe,
        finish_tick=finish,
        deadline_met=finish is not None and finish <= deadline_ticks,
        launches=bill.launches,
        moves=bill.moves,
        place=place_at,
        mode=mode_at,
        safety_net=bill.net,
    )


def _take(now: Now, mode: int, place: int, t: int, market: Market, moves: MoveCosts, seen: list[Seen],
          bill: _Bill, spot_tick: np.ndarray) -> bool:  # fmt: skip
    """Try one option; True when the job now does it."""
    if mode == IDLE:
        now.mode, now.changeover_left = IDLE, 0
        return True
    if mode == now.mode and place == now.at:
        return True
    if mode == SPOT and not market.available[place, t]:
        seen[place].last_failed_tick = t
        return False
    src = now.checkpoint
    if src < 0:
        k = int(moves.first_ticks[place])
    else:
        k = int(moves.changeover_ticks[src, place])
        bill.egress += float(moves.egress_usd[src, place])
        bill.moves += market.places[src].region != market.places[place].region
    bill.launches += 1
    now.mode, now.at, now.changeover_left = mode, place, k
    return True


def _probe(seen: Seen, r: int, t: int, market: Market, spot_tick: np.ndarray, bill: _Bill) -> None:
    """Launch and cancel: billed a minute of spot when it lands; a virtual run for the lifetimes."""
    seen.last_probe_tick = t
    if market.available[r, t]:
        bill.probe += spot_tick[r, t] * PROBE_S / market.tick_s
        if seen.probe_up_since is None:
            seen.probe_up_since = t
        return
    seen.last_failed_tick = t
    if seen.probe_up_since is not None:
        seen.probe_run_h += (t - seen.probe_up_since) * market.tick_h
        seen.probe_failures += 1
        seen.probe_up_since = None
