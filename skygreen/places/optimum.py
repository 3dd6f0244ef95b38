"""The offline optimum over places: the cheapest schedule that meets the deadline knowing the
whole trace, paying a changeover and the checkpoint's egress on every move.

A backward dynamic program in numpy over ticks x place x mode x work left. The modes at a place
r are: idle with the checkpoint in r, warm on spot in r, warm on on-demand in r; before the
first launch there is no checkpoint anywhere. V[t, m, r, p] is the least cost to do p more
ticks of work from tick t in that state. In each tick the job may
- stay idle where the checkpoint is: V[t+1, idle, r, p];
- keep a warm gang one more tick: price(r, m, t) + V[t+1, m, r, p-1] (spot only while r is up);
- launch mode m' at r' (r' = r included): egress(r -> r') + k(r, r') ticks billed at r''s
  price with no progress, then V[t+k, m', r', p] (spot only when r' stays up through all k).
A checkpoint moves only by launching where it goes (as in SkyNomad's DP). The start of a
launch is chosen over `S[t, r, p] = min over (m', r') of egress + start cost + V`, so a tick costs
R argmins over 2R rows: seconds for 13 zones over two days.

Semantics where they differ from SkyNomad's artifact: both round changeovers up to whole ticks;
their env bills a 0.2 h cold start as 720 s in the replay of the plan, here as whole ticks, so
a figure here is at most one tick's price per launch above theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from skygreen.places.moves import MoveCosts, MoveTerms, move_costs
from skygreen.places.place import Market

IDLE, SPOT, OD = 0, 1, 2
_INF = 1e30


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class Schedule:
    """What a run over a market did (the optimum's plan or a policy's replay)."""

    arm: str
    cost_usd: float
    compute_usd: float
    """Spot and on-demand ticks that made progress."""
    changeover_usd: float
    """Ticks billed while a new gang came up."""
    egress_usd: float
    probe_usd: float
    finish_tick: int | None
    deadline_met: bool
    launches: int
    moves: int
    """Launches in a region other than the checkpoint's (the ones that pay egress or transfer)."""
    place: np.ndarray
    """Per tick: the place index the job was at (-1 before the first launch)."""
    mode: np.ndarray
    """Per tick: IDLE, SPOT or OD (IDLE also while nothing runs)."""
    safety_net: bool = False

    def to_json(self) -> dict:
        """The record `skygreen simulate --json` prints per arm, dollars rounded to 4 decimals."""
        return {
            "arm": self.arm,
            "cost_usd": round(self.cost_usd, 4),
            "compute_usd": round(self.compute_usd, 4),
            "changeover_usd": round(self.changeover_usd, 4),
            "egress_usd": round(self.egress_usd, 4),
            "probe_usd": round(self.probe_usd, 4),
            "finish_tick": self.finish_tick,
            "deadline_met": self.deadline_met,
            "launches": self.launches,
            "moves": self.moves,
            "safety_net": self.safety_net,
        }


def optimum(market: Market, terms: MoveTerms, *, work_ticks: int, deadline_ticks: int) -> Schedule:
    """The cheapest schedule doing `work_ticks` of work by `deadline_ticks` on `market` (whose tick 0
    is the job's start). Infinite cost (and `deadline_met` False) when no schedule meets it."""
    moves = move_costs(market, terms)
    plan = _Plan(market, moves, work_ticks, deadline_ticks)
    plan.solve()
    return plan.follow()


def optimal_cost(market: Market, terms: MoveTerms, *, work_ticks: int, deadline_ticks: int) -> float:
    """The optimum's cost alone (inf when the deadline cannot be met)."""
    return optimum(market, terms, work_ticks=work_ticks, deadline_ticks=deadline_ticks).cost_usd


class _Plan:
    """The program's arrays and its backward pass; `follow` replays the choices forward."""

    def __init__(self, market: Market, moves: MoveCosts, work: int, horizon: int) -> None:
        self.market, self.moves, self.work, self.horizon = market, moves, work, horizon
        m = market.window(0, horizon + moves.max_ticks + 1)
        n = len(market.places)
        self.n = n
        self.avail = m.available
        self.spot_tick = m.spot_usd_per_hour * market.tick_h
        self.od_tick = market.on_demand_usd_per_hour * market.tick_h
        self.cum_spot = np.concatenate([np.zeros((n, 1)), np.cumsum(self.spot_tick, axis=1)], axis=1)
        self.ks = sorted({*moves.changeover_ticks.ravel().tolist(), *moves.first_ticks.tolist()})
        self.k_index = {k: i for i, k in enumerate(self.ks)}
        self.pair_k = np.vectorize(self.k_index.__getitem__)(moves.changeover_ticks)
        self.first_k = np.array([self.k_index[k] for k in moves.first_ticks])
        down = np.concatenate([np.zeros((n, 1), dtype=np.int64), np.cumsum(~self.avail, axis=1)], axis=1)
        self.down = down
        p = work + 1
        self.choice = np.zeros((horizon, 3, n, p), dtype=np.int8)
        self.start_arg = np.zeros((horizon, n, p), dtype=np.int16)
        self.none_arg = np.full((horizon, p), -1, dtype=np.int16)
        self.none_value = np.inf

    def _start_values(self, t: int, later: list[np.ndarray], later_none: list[np.ndarray]) -> np.ndarray:
        """A[kidx, m', r', p]: launching m' at r' at tick t with k ticks of changeover, then V[t+k]."""
        n, p = self.n, self.work + 1
        out = np.full((len(self.ks), 2, n, p), _INF)
        for i, k in enumerate(self.ks):
            if t + k > self.horizon:
                continue
            v = later[k - 1]  # V[t+k]
            spot_cost = self.cum_spot[:, t + k] - self.cum_spot[:, t]
            stays = (self.down[:, t + k] - self.down[:, t]) == 0
            out[i, 0] = np.where(stays[:, None], v[SPOT] + spot_cost[:, None], _INF)
            out[i, 1] = v[OD] + (k * self.od_tick)[:, None]
        return out

    def solve(self) -> None:
        n, p, horizon = self.n, self.work + 1, self.horizon
        end = np.full((3, n, p), _INF)
        end[:, :, 0] = 0.0
        kmax = max(self.ks)
        later = [end] * kmax  # later[i] = V[t + 1 + i]; past the deadline: the terminal values
        none_next = np.full(p, _INF)
        none_next[0] = 0.0
        egress = self.moves.egress_usd
        rows = np.arange(n)
        for t in range(horizon - 1, -1, -1):
            a = self._start_values(t, later, [])
            # S[r, p]: best launch with the checkpoint in r
            starts = np.empty((n, p))
            for r in range(n):
                sel = a[self.pair_k[r], :, rows, :]  # (r', 2, p)
                cand = (sel + egress[r][:, None, None]).reshape(2 * n, p)
                arg = np.argmin(cand, axis=0)
                self.start_arg[t, r] = arg
                starts[r] = np.take_along_axis(cand, arg[None], axis=0)[0]
            first = a[self.first_k, :, rows, :].reshape(2 * n, p)
            first_arg = np.argmin(first, axis=0)
            first_best = np.take_along_axis(first, first_arg[None], axis=0)[0]
            launch_now = first_best < none_next
            self.none_arg[t] = np.where(launch_now, first_arg, -1)
            none_now = np.where(launch_now, first_best, none_next)
            nxt = later[0]
            idle_next = nxt[IDLE]
            keep_spot = np.full((n, p), _INF)
            keep_spot[:, 1:] = nxt[SPOT][:, :-1] + self.spot_tick[:, t][:, None]
            keep_spot[~self.avail[:, t]] = _INF
            keep_od = np.full((n, p), _INF)
            keep_od[:, 1:] = nxt[OD][:, :-1] + self.od_tick[:, None]
            v = np.empty((3, n, p))
            for mode, keep in ((IDLE, None), (SPOT, keep_spot), (OD, keep_od)):
                options = [keep if keep is not None else np.full((n, p), _INF), starts, idle_next]  # ties: act first
                stack = np.stack(options)
                best = np.argmin(stack, axis=0)
                self.choice[t, mode] = best
                v[mode] = np.take_along_axis(stack, best[None], axis=0)[0]
            v[:, :, 0] = 0.0
            none_now[0] = 0.0
            later = [v, *later[:-1]]
            none_next = none_now
        self.none_value = float(none_next[self.work])

    def follow(self) -> Schedule:
        """Replay the optimal choices forward from the start, splitting the cost as it goes."""
        horizon, market, moves = self.horizon, self.market, self.moves
        place = np.full(horizon, -1, dtype=np.int64)
        mode_at = np.zeros(horizon, dtype=np.int8)
        if not self.none_value < _INF / 2:
            return _failed("optimum", place, mode_at)
        t, p, state, at = 0, self.work, None, -1
        compute = changeover = egress = 0.0
        launches = moves_n = 0
        while p > 0 and t < horizon:
            if state is None:
                code = int(self.none_arg[t, p])
                if code < 0:
                    t += 1
                    continue
                target, m = divmod(code, 2)
                k = int(moves.first_ticks[target])
            else:
                option = int(self.choice[t, state, at, p])
                if option == 2:
                    state = IDLE
                    place[t], mode_at[t] = at, IDLE
                    t += 1
                    continue
                if option == 0:
                    compute += self.spot_tick[at, t] if state == SPOT else self.od_tick[at]
                    place[t], mode_at[t] = at, state
                    p -= 1
                    t += 1
                    continue
                target, m = divmod(int(self.start_arg[t, at, p]), 2)
                k = int(moves.changeover_ticks[at, target])
                egress += float(moves.egress_usd[at, target])
                moves_n += market.places[at].region != market.places[target].region
            new_mode = SPOT if m == 0 else OD
            price = self.spot_tick[target, t : t + k] if new_mode == SPOT else np.full(k, self.od_tick[target])
            changeover += float(price.sum())
            place[t : t + k], mode_at[t : t + k] = target, new_mode
            launches += 1
            state, at = new_mode, target
            t += k
        return Schedule(
            arm="optimum",
            cost_usd=compute + changeover + egress,
            compute_usd=compute,
            changeover_usd=changeover,
            egress_usd=egress,
            probe_usd=0.0,
            finish_tick=t,
            deadline_met=p == 0 and t <= horizon,
            launches=launches,
            moves=moves_n,
            place=place,
            mode=mode_at,
        )


def _failed(arm: str, place: np.ndarray, mode: np.ndarray) -> Schedule:
    return Schedule(
        arm=arm,
        cost_usd=float("inf"),
        compute_usd=0.0,
        changeover_usd=0.0,
        egress_usd=0.0,
        probe_usd=0.0,
        finish_tick=None,
        deadline_met=False,
        launches=0,
        moves=0,
        place=place,
        mode=mode,
    )
