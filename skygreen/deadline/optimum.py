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


def optimal_costs(
    available: np.ndarray,
    *,
    compute_steps: int,
    deadline_steps: int,
    changeover_steps: int,
    spot_step: float,
    od_step: float,
) -> np.ndarray:
    """Least cost per start point (rows of `available`, bool, shape S x >= deadline_steps);
    inf where the deadline cannot be met."""
    cost, _ = _solve(
        np.asarray(available, dtype=bool)[:, :deadline_steps],
        compute_steps,
        changeover_steps,
        spot_step,
        od_step,
        track=False,
    )
    return cost


def optimum(grid: Grid, prices: Prices) -> Outcome:
    """The optimum on one grid, with its schedule's spot and on-demand hours, switches and finish."""
    dt = grid.dt_h
    spot_step = prices.spot_usd_per_node_hour * prices.nodes * dt
    od_step = prices.on_demand_usd_per_node_hour * prices.nodes * dt
    avail = np.array([grid.available[: grid.deadline_steps]], dtype=bool)
    cost, attrs = _solve(avail, grid.compute_steps, grid.changeover_steps, spot_step, od_step, track=True)
    if attrs is None or not np.isfinite(cost[0]):
        return _outcome("optimum", grid, prices, finish=None, spot_steps=0, od_steps=0, switches=0)
    billed, switches, finish = (round(float(a[0])) for a in attrs)
    # cost = spot x spot_step + on-demand x od_step and spot + on-demand = billed
    if abs(od_step - spot_step) > 1e-12:
        od_steps = round(float((cost[0] - billed * spot_step) / (od_step - spot_step)))
    else:
        od_steps = 0
    return _outcome(
        "optimum", grid, prices, finish=finish * dt, spot_steps=billed - od_steps, od_steps=od_steps, switches=switches
    )


def _solve(
    avail: np.ndarray, p_count: int, k: int, spot_step: float, od_step: float, *, track: bool
) -> tuple[np.ndarray, list[np.ndarray] | None]:
    """Backward induction over intervals; with `track`, also the billed intervals, switches and
    finish interval of the optimal schedule from the start (among equal costs, the one that acts
    first). V[t] for t > now is kept only k + 1 intervals deep."""
    s_count, horizon = avail.shape
    can_start = _stays_available(avail, k)
    shape = (s_count, p_count + 1)
    terminal = np.full((3, *shape), _INF)
    terminal[:, :, 0] = 0.0
    end = _Tail(terminal, np.zeros((3, 3, *shape)) if track else None)
    if end.attrs is not None:
        end.attrs[2] = horizon
    later: deque[_Tail] = deque([end], maxlen=k + 1)  # later[i] = V[t + 1 + i]
    for t in range(horizon - 1, -1, -1):
        nxt = later[0]
        far = later[k - 1] if t + k <= horizon else end
        keep_spot = _keep(nxt, _SPOT, spot_step, avail[:, t])
        keep_od = _keep(nxt, _OD, od_step, None)
        start_spot = _start(far, _SPOT, k, spot_step, can_start[:, t])
        start_od = _start(far, _OD, k, od_step, None)
        idle = (nxt.values[_IDLE], None if nxt.attrs is None else nxt.attrs[:, _IDLE])
        tail = _Tail(np.empty_like(terminal), np.empty_like(end.attrs) if track else None)
        for mode, options in ((_IDLE, (start_spot, start_od, idle)), (_SPOT, (keep_spot, start_od, idle)),
                              (_OD, (keep_od, start_spot, idle))):  # fmt: skip
            _best(tail, mode, options)
        tail.values[:, :, 0] = 0.0
        if tail.attrs is not None:
            tail.attrs[:2, :, :, 0] = 0.0
            tail.attrs[2, :, :, 0] = t
        later.appendleft(tail)
    first = later[0]
    cost = first.values[_IDLE][:, p_count]
    cost = np.where(cost >= _INF / 2, np.inf, cost)
    if first.attrs is None:
        return cost, None
    return cost, [first.attrs[j, _IDLE][:, p_count] for j in range(3)]


class _Tail:
    """V[t] (3 modes x S x P+1) and, when tracking, the attributes of its schedules (billed
    intervals, switches, finish interval: 3 x 3 modes x S x P+1)."""

    __slots__ = ("attrs", "values")

    def __init__(self, values: np.ndarray, attrs: np.ndarray | None) -> None:
        self.values = values
        self.attrs = attrs


_Option = tuple[np.ndarray, "np.ndarray | None"]


def _keep(nxt: _Tail, mode: int, step_cost: float, ok: np.ndarray | None) -> _Option:
    """Keep a warm instance one more interval: one step of progress for `step_cost`."""
    values = np.full_like(nxt.values[mode], _INF)
    np.add(nxt.values[mode][:, :-1], step_cost, out=values[:, 1:])
    if ok is not None:
        values[~ok] = _INF
    if nxt.attrs is None:
        return values, None
    attrs = np.zeros_like(nxt.attrs[:, mode])
    attrs[:, :, 1:] = nxt.attrs[:, mode, :, :-1]
    attrs[0] += 1
    return values, attrs


def _start(far: _Tail, mode: int, k: int, step_cost: float, ok: np.ndarray | None) -> _Option:
    """Start an instance: k intervals of changeover billed, no progress, then warm."""
    values = far.values[mode] + k * step_cost
    if ok is not None:
        values[~ok] = _INF
    if far.attrs is None:
        return values, None
    attrs = far.attrs[:, mode].copy()
    attrs[0] += k
    attrs[1] += 1
    return values, attrs


def _best(tail: _Tail, mode: int, options: tuple[_Option, ...]) -> None:
    """The cheapest option per state; on a tie the earlier option wins."""
    values, attrs = options[0]
    best = values.copy()
    best_attrs = None if attrs is None else attrs.copy()
    for values, attrs in options[1:]:
        if best_attrs is None or attrs is None:
            np.minimum(best, values, out=best)
            continue
        better = values < best
        np.copyto(best, values, where=better)
        np.copyto(best_attrs, attrs, where=better[None])
    tail.values[mode] = best
    if tail.attrs is not None and best_attrs is not None:
        tail.attrs[:, mode] = best_attrs


def _stays_available(avail: np.ndarray, k: int) -> np.ndarray:
    """[s, t]: spot is available in every interval t .. t+k-1."""
    down = np.concatenate([np.zeros((avail.shape[0], 1), dtype=np.int64), np.cumsum(~avail, axis=1)], axis=1)
    horizon = avail.shape[1]
    out = np.zeros_like(avail)
    if k <= horizon:
        out[:, : horizon - k + 1] = (down[:, k:] - down[:, : horizon - k + 1]) == 0
    return out
