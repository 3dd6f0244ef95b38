"""The place replay and its arms on small markets: the nomad pays for moves, follows the cheap
place, and never misses a deadline; the summary reports ratios to the optimum."""

from __future__ import annotations

import numpy as np
import pytest

from skygreen.places.evaluate import Job, run_window, summarise
from skygreen.places.moves import MoveTerms, move_costs
from skygreen.places.nomad import Nomad
from skygreen.places.optimum import OD, optimum
from skygreen.places.place import Market, Place
from skygreen.places.run import replay


def _market(avail, spot, od) -> Market:
    avail = np.asarray(avail, dtype=bool)
    places = tuple(Place(cloud="gcp", region=f"us-east{i + 1}", zone=f"us-east{i + 1}-a") for i in range(len(avail)))
    spot = np.broadcast_to(np.asarray(spot, dtype=float)[:, None], avail.shape).copy()
    return Market(places=places, tick_s=600.0, available=avail, spot_usd_per_hour=spot,
                  on_demand_usd_per_hour=np.asarray(od, dtype=float))  # fmt: skip


def test_the_nomad_leaves_a_preempted_place_for_the_next_cheapest_and_pays_the_move():
    horizon = 60
    avail = np.ones((2, horizon + 40), dtype=bool)
    avail[0, 10:] = False  # the cheap place dies after 10 ticks
    market = _market(avail, [6.0, 12.0], [60.0, 60.0])
    terms = MoveTerms(checkpoint_gb=50, changeover_s=600)
    plan = replay(Nomad(), market, move_costs(market, terms), work_ticks=30, deadline_ticks=horizon)
    best = optimum(market, terms, work_ticks=30, deadline_ticks=horizon)
    assert plan.deadline_met and plan.moves == 1 and plan.egress_usd == pytest.approx(1.0)
    assert best.cost_usd <= plan.cost_usd <= 1.05 * best.cost_usd


def test_with_slack_to_spare_the_nomad_waits_out_an_outage_instead_of_moving_to_a_dearer_place():
    # deadline 1.5 x work, as in SkyNomad's settings: a short outage of the cheap place is cheaper
    # to wait out than to leave (changeover, egress, twice the price), and the optimum waits too
    avail = np.ones((2, 100), dtype=bool)
    avail[0, 10:20] = False
    market = _market(avail, [6.0, 12.0], [60.0, 60.0])
    terms = MoveTerms(checkpoint_gb=50, changeover_s=600)
    plan = replay(Nomad(), market, move_costs(market, terms), work_ticks=40, deadline_ticks=60)
    best = optimum(market, terms, work_ticks=40, deadline_ticks=60)
    assert plan.deadline_met and plan.moves == 0 and set(plan.place[plan.mode != 0].tolist()) == {0}
    assert plan.cost_usd == pytest.approx(best.cost_usd)


def test_the_safety_net_meets_the_deadline_when_spot_never_comes():
    market = _market(np.zeros((2, 80), dtype=bool), [1.0, 1.0], [10.0, 8.0])
    terms = MoveTerms(checkpoint_gb=10, changeover_s=600)
    plan = replay(Nomad(), market, move_costs(market, terms), work_ticks=20, deadline_ticks=30)
    assert plan.deadline_met and plan.safety_net
    assert set(plan.mode[plan.mode != 0].tolist()) == {OD} and set(plan.place[plan.mode == OD].tolist()) == {1}


def test_every_arm_meets_the_deadline_and_the_summary_is_against_the_optimum():
    rng = np.random.default_rng(3)
    avail = rng.random((3, 200)) < np.array([[0.9], [0.6], [0.3]])
    market = _market(avail, [3.0, 2.0, 1.0], [10.0, 11.0, 12.0])
    job = Job(work_ticks=40, deadline_ticks=60, terms=MoveTerms(checkpoint_gb=20, changeover_s=900))
    windows = [run_window(market, job, s) for s in (0, 50, 100)]
    summary = summarise(windows)
    assert summary["optimum"]["over_optimum_mean"] == 1.0
    for arm, row in summary.items():
        assert row["deadlines_met"] == 3, arm
        assert row["over_optimum_mean"] >= 1.0 - 1e-9, arm
        low, high = row["over_optimum_ci95"]
        assert low <= row["over_optimum_mean"] <= high
    assert windows[0].to_json()["arms"]["nomad"]["over_optimum"] >= 1.0
