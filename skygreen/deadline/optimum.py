"""The omniscient optimum: the cheapest schedule that meets the deadline knowing the whole trace.

A dynamic program over the simulator's grid (`skygreen.deadline.simulate.Grid`), backwards in
time, vectorised over remaining progress with numpy (and over several start points at once in
the benchmark). V[t, m, p] is the least cost to finish p intervals of work from interval t when
the job arrives in mode m (idle, or warm on spot / on-demand). In each interval it may
- stay idle: V[t+1, idle, p];
- keep a warm instance running: price + V[t+1, m, p-1] (spot only while spot is available);
- start spot or on-demand: a changeover of k intervals billed at the new price with no
  progress, V[t+k, m', p] (spot only when it stays available through all k).
A schedule that would be preempted is never optimal, so the program never starts spot it loses.
This is the paper's omniscient ILP (Eq. 6-10) solved exactly on the grid; costs are the
simulator's, so `cost(policy) / cost(optimum) >= 1` on the same grid.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from skygreen.deadline.simulate import Grid, Outcome, Prices, _outcome

_IDLE, _SPOT, _OD = 0, 1, 2
_INF = 1e30


def optimal_costs(available: np.ndarray, *, compute_steps: int, deadline_steps: int, changeover_steps: int,
                  spot_step: float, od_step: float) -> np.ndarray:
    """Least cost per start point (rows of `available`, bool, shape S x >= deadline_steps);
    inf where the deadline cannot be met."""
    cost, _ = _solve(np.asarray(available, dtype=bool)[:, :deadline_steps], compute_steps, changeover_steps,
                     spot_step, od_step, track=False)
    return cost


def optimum(grid: Grid, prices: Prices) -> Outcome:
    """The optimum on one grid, with its schedule's spot and on-demand hours, switches and finish."""
    dt = grid.dt_h
    spot_step = prices.spot_usd_per_node_hour * prices.nodes * dt
    od_step = prices.on_demand_usd_per_node_hour * prices.nodes * dt
    avail = np.array([grid.available[: grid.deadline_steps]], dtype=bool)
    cost, attrs = _solve(avail, grid.compute_steps, grid.changeover_steps, spot_step, od_step, track=True)
    if not np.isfinite(cost[0]):
        return _outcome("optimum", grid, prices, finish=None, spot_steps=0, od_steps=0, switches=0)
    billed, switches, finish = (int(round(a[0])) for a in attrs)
    # cost = spot x spot_step + on-demand x od_step and spot + on-demand = billed
    if abs(od_step - spot_step) > 1e-12:
        od_steps = int(round((cost[0] - billed * spot_step) / (od_step - spot_step)))
    else:
        od_steps = 0
    return _outcome("optimum", grid, prices, finish=finish * dt, spot_steps=billed - od_steps, od_steps=od_steps,
                    switches=switches)


def _solve(avail: np.ndarray, p_count: int, k: int, spot_step: float, od_step: float, *, track: bool):
    """Backward induction; with `track`, also the billed intervals, switches and finish interval
    of the optimal schedule from the start (among equal costs, the one that acts first)."""
    s_count, horizon = avail.shape
    can_start = _stays_available(avail, k)
    terminal = np.full((3, s_count, p_count + 1), _INF)
    terminal[:, :, 0] = 0.0
    zero = np.zeros_like(terminal)

    def end_attrs(t: int) -> np.ndarray:
        a = np.zeros((3,) + terminal.shape)
        a[2] = t  # finish interval: when the remaining work reached 0
        return a

    later: deque = deque([(terminal, end_attrs(horizon) if track else None)], maxlen=k + 1)
    for t in range(horizon - 1, -1, -1):
        nxt, nxt_a = later[0]
        far, far_a = later[k - 1] if t + k <= horizon else (terminal, end_attrs(horizon) if track else None)
        options = [  # (value array for all modes, attrs, billed, switch, allowed-in-mode mask)
            (nxt[_IDLE], None if not track else nxt_a[:, _IDLE], 0, 0),
            (_shift(nxt[_SPOT], spot_step, avail[:, t]), None if not track else _shift_a(nxt_a[:, _SPOT]), 1, 0),
            (_shift(nxt[_OD], od_step, None), None if not track else _shift_a(nxt_a[:, _OD]), 1, 0),
            (_mask(k * spot_step + far[_SPOT], can_start[:, t]), None if not track else far_a[:, _SPOT], k, 1),
            (k * od_step + far[_OD], None if not track else far_a[:, _OD], k, 1),
        ]
        allowed = {_IDLE: (3, 4, 0), _SPOT: (1, 4, 0), _OD: (2, 3, 0)}  # ties: act now, finish early
        value = np.empty_like(terminal)
        attrs = np.empty((3,) + terminal.shape) if track else None
        for mode, which in allowed.items():
            stack = np.stack([options[i][0] for i in which])
            best = np.argmin(stack, axis=0)
            value[mode] = np.take_along_axis(stack, best[None], axis=0)[0]
            if track:
                for j, (name_i) in enumerate((0, 1, 2)):
                    parts = []
                    for i in which:
                        base = options[i][1][j]
                        extra = (options[i][2] if j == 0 else options[i][3] if j == 1 else 0)
                        parts.append(base + extra)
                    attrs[j, mode] = np.take_along_axis(np.stack(parts), best[None], axis=0)[0]
        value[:, :, 0] = 0.0
        np.minimum(value, _INF, out=value)
        if track:
            attrs[0, :, :, 0] = 0.0
            attrs[1, :, :, 0] = 0.0
            attrs[2, :, :, 0] = t
        later.appendleft((value, attrs))
    first, first_a = later[0]
    cost = first[_IDLE][:, p_count]
    cost = np.where(cost >= _INF / 2, np.inf, cost)
    if not track:
        return cost, None
    return cost, [first_a[j, _IDLE][:, p_count] for j in range(3)]


def _shift(values: np.ndarray, step_cost: float, ok: np.ndarray | None) -> np.ndarray:
    """Keep running one interval: progress one step for `step_cost` (where `ok`)."""
    out = np.full_like(values, _INF)
    out[:, 1:] = step_cost + values[:, :-1]
    if ok is not None:
        out[~ok] = _INF
    return out


def _shift_a(attrs: np.ndarray) -> np.ndarray:
    out = np.zeros_like(attrs)
    out[:, :, 1:] = attrs[:, :, :-1]
    return out


def _mask(values: np.ndarray, ok: np.ndarray) -> np.ndarray:
    out = values.copy()
    out[~ok] = _INF
    return out


def _stays_available(avail: np.ndarray, k: int) -> np.ndarray:
    """[s, t]: spot is available in every interval t .. t+k-1."""
    down = np.concatenate([np.zeros((avail.shape[0], 1), dtype=np.int64), np.cumsum(~avail, axis=1)], axis=1)
    horizon = avail.shape[1]
    out = np.zeros_like(avail)
    if k <= horizon:
        out[:, : horizon - k + 1] = (down[:, k:] - down[:, : horizon - k + 1]) == 0
    return out
