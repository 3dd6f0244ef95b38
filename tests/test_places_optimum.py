"""The multi-place optimum: equal to the single-place optimum with one place and free moves,
pays egress and changeover on every move, and reproduces SkyNomad's published Optimal."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from skygreen.deadline.optimum import optimal_costs
from skygreen.places.moves import MoveTerms, move_costs
from skygreen.places.optimum import OD, SPOT, optimum
from skygreen.places.place import Market, Place
from skygreen.places.rates import egress_usd_per_gb
from skygreen.places.traces import load_market


def _market(avail, spot, od, *, regions=None, tick_s=3600.0) -> Market:
    avail = np.asarray(avail, dtype=bool)
    n = avail.shape[0]
    regions = regions or [f"us-east{i + 1}" for i in range(n)]
    places = tuple(Place(cloud="gcp", region=r, zone=f"{r}-a") for r in regions)
    spot = np.broadcast_to(np.asarray(spot, dtype=float).reshape(n, -1), avail.shape).copy()
    return Market(places=places, tick_s=tick_s, available=avail, spot_usd_per_hour=spot,
                  on_demand_usd_per_hour=np.asarray(od, dtype=float))  # fmt: skip


def test_one_place_with_free_moves_equals_the_single_place_optimum():
    rng = np.random.default_rng(7)
    for case in range(40):
        horizon = int(rng.integers(8, 40))
        work = int(rng.integers(1, horizon))
        k = int(rng.integers(1, 4))
        avail = rng.random(horizon) < rng.uniform(0.2, 0.95)
        spot, od = float(rng.uniform(0.5, 2)), float(rng.uniform(2, 6))
        expected = optimal_costs(avail[None], compute_steps=work, deadline_steps=horizon, changeover_steps=k,
                                 spot_step=spot, od_step=od)[0]  # fmt: skip
        got = optimum(_market(avail[None], spot, [od]), MoveTerms(checkpoint_gb=0, changeover_s=k * 3600.0),
                      work_ticks=work, deadline_ticks=horizon)  # fmt: skip
        if math.isinf(expected):
            assert math.isinf(got.cost_usd) and not got.deadline_met, case
        else:
            assert got.cost_usd == pytest.approx(expected, abs=1e-9), case
            assert got.deadline_met and got.finish_tick is not None and got.finish_tick <= horizon


def test_a_move_pays_egress_and_its_changeover():
    # A is cheap for 4 ticks then down for good; B is dearer but stays up: the job starts in A,
    # moves to B (egress 10 GB x $0.02 between two North American regions) and finishes there.
    avail = [[1, 1, 1, 1, 0, 0, 0, 0, 0, 0], [1] * 10]
    market = _market(avail, [[1.0], [2.0]], [9.0, 9.0])
    plan = optimum(market, MoveTerms(checkpoint_gb=10, changeover_s=3600), work_ticks=6, deadline_ticks=10)
    assert plan.deadline_met and plan.moves == 1 and plan.launches == 2
    assert plan.egress_usd == pytest.approx(0.2)
    # A: 1 changeover + 3 work ticks at $1; B: 1 changeover + 3 work at $2
    assert plan.changeover_usd == pytest.approx(1.0 + 2.0)
    assert plan.compute_usd == pytest.approx(3 * 1.0 + 3 * 2.0)
    assert plan.cost_usd == pytest.approx(plan.compute_usd + plan.changeover_usd + plan.egress_usd)
    assert list(plan.place[:4]) == [0] * 4 and set(plan.place[4:8].tolist()) == {1}
    assert plan.mode[0] == SPOT


def test_a_dear_move_is_not_taken():
    # The same market with a 5 TB checkpoint: moving costs $100, so finishing on on-demand in A wins.
    avail = [[1, 1, 1, 1, 0, 0, 0, 0, 0, 0], [1] * 10]
    market = _market(avail, [[1.0], [2.0]], [9.0, 9.0])
    plan = optimum(market, MoveTerms(checkpoint_gb=5000, changeover_s=3600), work_ticks=6, deadline_ticks=10)
    assert plan.moves == 0 and plan.egress_usd == 0
    assert OD in set(plan.mode.tolist()) or plan.cost_usd < 100


def test_per_tick_prices_are_paid_as_they_change():
    avail = [[1] * 6]
    spot = [[5.0, 5.0, 1.0, 1.0, 1.0, 5.0]]
    plan = optimum(_market(avail, spot, [20.0]), MoveTerms(checkpoint_gb=0, changeover_s=3600),
                   work_ticks=2, deadline_ticks=6)  # fmt: skip
    assert plan.cost_usd == pytest.approx(2.0 + 1.0)  # launched at tick 2: a changeover and two work ticks at $1


def test_moves_price_the_checkpoint_by_region():
    a = Place(cloud="aws", region="us-east-1", zone="us-east-1a")
    b = Place(cloud="aws", region="us-east-2", zone="us-east-2a")
    c = Place(cloud="aws", region="us-west-2", zone="us-west-2a")
    same = Place(cloud="aws", region="us-east-1", zone="us-east-1c")
    g = Place(cloud="gcp", region="europe-west1", zone="europe-west1-c")
    assert egress_usd_per_gb(a, same) == 0
    assert egress_usd_per_gb(a, b) == 0.01
    assert egress_usd_per_gb(a, c) == 0.02
    assert egress_usd_per_gb(a, g) == 0.09  # across clouds: AWS internet egress
    market = Market(places=(a, b, c), tick_s=600.0, available=np.ones((3, 2), dtype=bool),
                    spot_usd_per_hour=np.ones((3, 2)), on_demand_usd_per_hour=np.ones(3))  # fmt: skip
    costs = move_costs(market, MoveTerms(checkpoint_gb=100, changeover_s=600, bandwidth_gbit_s=8.0))
    assert costs.egress_usd[0, 1] == pytest.approx(1.0) and costs.egress_usd[0, 2] == pytest.approx(2.0)
    assert costs.changeover_ticks[0, 0] == 1  # same region: no transfer
    assert costs.changeover_ticks[0, 2] == 2  # 600 s + 100 s of transfer, rounded up


def _artifact(shared_traces_dir) -> Path:
    return shared_traces_dir / "skynomad-artifact" / "data"


def test_reproduces_skynomad_h100_global_diverse_optimal(shared_traces_dir):
    market = load_market(_artifact(shared_traces_dir) / "converted_multi_region_aligned_h100_16_merged.tar.gz")
    zones = ("us-central1-a", "us-west1-a", "europe-west1-c", "europe-west3-c", "asia-southeast1-b", "asia-south2-b")
    market = market.subset(zones)
    horizon, work = 311, math.ceil(34.55555555555556 * 3600 / 600 - 1e-9)
    terms = MoveTerms(checkpoint_gb=50, changeover_s=720)
    costs = [optimum(market.window(w * horizon, horizon), terms, work_ticks=work, deadline_ticks=horizon).cost_usd
             for w in range(6)]  # fmt: skip
    assert np.mean(costs) == pytest.approx(571.4, rel=0.02)


def test_reproduces_skynomad_v100_three_zone_optimal(shared_traces_dir):
    market = load_market(_artifact(shared_traces_dir) / "real/availability/2023-02-15/processed")
    market = market.subset(("us-east-1c", "us-east-2b", "us-west-2a"))
    horizon = math.floor(59.90833333333333 * 3600 / 195 + 1e-9)
    work = math.ceil(39.93888888888889 * 3600 / 195 - 1e-9)
    terms = MoveTerms(checkpoint_gb=50, changeover_s=720)
    costs = [optimum(market.window(w * horizon, horizon), terms, work_ticks=work, deadline_ticks=horizon).cost_usd
             for w in (3, 5, 7, 8, 14)]  # fmt: skip
    assert np.mean(costs) == pytest.approx(37.37, rel=0.02)
