"""Deadline policies and the trace simulator: hand-made traces with known answers, the pure
decision rules of the paper, the optimum as a lower bound, and the real traces where present."""

from __future__ import annotations

import json
import random

import pytest

from skygreen.deadline.optimum import optimum
from skygreen.deadline.policy import ExpectedSpot, Greedy, Job, Mode, Observation, UniformProgress
from skygreen.deadline.simulate import Prices, make_grid, on_demand_only, simulate
from skygreen.plan.replay import load_trace, trace_zones

HOUR_S = 3600.0
PRICES = Prices(spot_usd_per_node_hour=1.0, on_demand_usd_per_node_hour=3.0)
POLICIES = (Greedy(), UniformProgress(), ExpectedSpot(price_ratio=3.0))


def grid_over(ticks, *, compute_h, deadline_h, changeover_h, tick_s=HOUR_S / 2, start_tick=0):
    job = Job(compute_h=compute_h, deadline_h=deadline_h, changeover_h=changeover_h)
    return make_grid(job, ticks, tick_s=tick_s, start_tick=start_tick)


# -- the simulator on traces with known answers ----------------------------------------------


def test_spot_all_the_way_costs_compute_plus_one_changeover_at_spot_price():
    grid = grid_over([1] * 40, compute_h=4.0, deadline_h=8.0, changeover_h=0.5)
    for policy in POLICIES:
        out = simulate(policy, grid, PRICES)
        assert (out.spot_h, out.on_demand_h, out.switches) == (4.5, 0.0, 1), policy.name
        assert out.cost_usd == pytest.approx(4.5) and out.finish_h == pytest.approx(4.5) and out.deadline_met


def test_no_spot_at_all_greedy_waits_then_the_safety_net_finishes_on_demand_on_time():
    grid = grid_over([0] * 40, compute_h=4.0, deadline_h=8.0, changeover_h=0.5)
    out = simulate(Greedy(), grid, PRICES)
    # idle while slack R - C > 2d: from 4 h of slack down to 1 h, then 0.5 h changeover + 4 h
    assert out.on_demand_h == pytest.approx(4.5) and out.spot_h == 0.0
    assert out.finish_h == pytest.approx(3.0 + 4.5) and out.deadline_met
    assert out.cost_usd == pytest.approx(4.5 * 3.0)


def test_a_preemption_pays_a_second_changeover_and_the_job_resumes_on_spot():
    # spot for 2 h, gone for 1 h, back: 0.5 + 1.5 progress, preempted, 0.5 + 2.5 progress
    ticks = [1] * 4 + [0] * 2 + [1] * 40
    out = simulate(Greedy(), grid_over(ticks, compute_h=4.0, deadline_h=12.0, changeover_h=0.5), PRICES)
    assert (out.switches, out.spot_h, out.on_demand_h) == (2, 5.0, 0.0)
    assert out.finish_h == pytest.approx(2.0 + 1.0 + 3.0)


def test_a_gang_counts_spot_only_when_all_its_nodes_are_there(tmp_path):
    path = tmp_path / "aws-08-27-2023" / "us-east-2b_v100_1.json"
    path.parent.mkdir()
    path.write_text(
        json.dumps({"metadata": {"gap_seconds": 1800, "nodes": 4}, "data": [4, 4, 3, 4, 4, 4, 4, 4, 4, 4] * 4})
    )
    trace = load_trace(path)
    assert trace.nodes == 4 and trace.cloud == "aws" and trace.instance_type == "p3.2xlarge"
    job = Job(compute_h=2.0, deadline_h=10.0, changeover_h=0.5)
    gang = simulate(
        Greedy(),
        make_grid(job, trace.available(4), tick_s=1800),
        Prices(spot_usd_per_node_hour=1.0, on_demand_usd_per_node_hour=3.0, nodes=4),
    )
    single = simulate(Greedy(), make_grid(job, trace.available(1), tick_s=1800), PRICES)
    assert single.switches == 1 and single.spot_h == 2.5
    assert gang.switches == 2  # the tick with 3 of 4 preempts the gang
    assert gang.cost_usd == pytest.approx(gang.spot_h * 4)  # every node is billed


def test_the_changeover_is_rounded_up_to_the_grid_and_the_policies_are_told():
    grid = grid_over([1] * 100, compute_h=4.0, deadline_h=8.0, changeover_h=0.3, tick_s=600.0)
    assert grid.dt_h <= 0.3 and grid.job.changeover_h >= 0.3 and grid.job.changeover_h <= 0.33 + 1e-9
    assert grid.changeover_steps * grid.dt_h == pytest.approx(grid.job.changeover_h)


def test_on_demand_only_is_one_changeover_plus_the_compute():
    out = on_demand_only(grid_over([1] * 40, compute_h=4.0, deadline_h=8.0, changeover_h=0.5), PRICES)
    assert (out.on_demand_h, out.cost_usd, out.switches) == (4.5, 13.5, 1)


# -- the rules, as pure decisions ------------------------------------------------------------

JOB = Job(compute_h=10.0, deadline_h=20.0, changeover_h=0.5)


def obs(t, progress, mode, spot):
    return Observation(elapsed_h=t, progress_h=progress, mode=mode, spot_available=spot)


def test_uniform_progress_goes_on_demand_when_idle_and_behind_only():
    up = UniformProgress()
    assert up.decide(JOB, obs(4.0, 2.0, Mode.IDLE, False)) is Mode.IDLE  # cp = ep(4) = 2
    assert up.decide(JOB, obs(4.0, 1.9, Mode.IDLE, False)) is Mode.ON_DEMAND
    assert up.decide(JOB, obs(4.0, 1.0, Mode.IDLE, True)) is Mode.SPOT  # takes risks
    assert up.decide(JOB, obs(4.0, 1.0, Mode.SPOT, True)) is Mode.SPOT  # exploitation


def test_uniform_progress_holds_on_demand_until_ahead_of_the_line_two_changeovers_on():
    up = UniformProgress()
    # ep(t + 2d) = (4 + 1) / 2 = 2.5
    assert up.decide(JOB, obs(4.0, 2.4, Mode.ON_DEMAND, True)) is Mode.ON_DEMAND
    assert up.decide(JOB, obs(4.0, 2.5, Mode.ON_DEMAND, True)) is Mode.SPOT
    assert up.decide(JOB, obs(4.0, 2.5, Mode.ON_DEMAND, False)) is Mode.IDLE


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_the_safety_net_commits_to_on_demand_below_two_changeovers_of_slack(policy):
    # R(t) - C(t) = (20 - 14) - (10 - 5) = 1.0 = 2d: not on spot -> on-demand, and it never leaves
    for mode in (Mode.IDLE, Mode.ON_DEMAND):
        for spot in (True, False):
            assert policy.decide(JOB, obs(14.0, 5.0, mode, spot)) is Mode.ON_DEMAND
    assert policy.decide(JOB, obs(14.0, 5.0, Mode.SPOT, True)) is Mode.SPOT  # running spot continues
    assert policy.decide(JOB, obs(14.0, 10.0, Mode.ON_DEMAND, True)) is Mode.IDLE  # done


def test_a_policy_cannot_ask_for_spot_that_is_not_there():
    class Broken:
        name = "broken"

        def decide(self, job, o):
            from skygreen.deadline.policy import safety_net

            return safety_net(job, o, Mode.SPOT)

    with pytest.raises(ValueError, match="unavailable"):
        simulate(Broken(), grid_over([0] * 40, compute_h=4.0, deadline_h=10.0, changeover_h=0.5), PRICES)


def test_expected_spot_learns_the_zone():
    sky = ExpectedSpot(price_ratio=3.0)
    good = Observation(
        elapsed_h=24.0, progress_h=20.0, mode=Mode.IDLE, spot_available=False, spot_seen_h=22.0, spot_runs_seen=4
    )
    bad = Observation(
        elapsed_h=24.0, progress_h=2.0, mode=Mode.IDLE, spot_available=False, spot_seen_h=2.0, spot_runs_seen=8
    )
    job = Job(compute_h=40.0, deadline_h=80.0, changeover_h=0.3)
    assert sky.spot_rate(job, good)[0] > 0.6 > 0.3 > sky.spot_rate(job, bad)[0]
    assert sky.decide(job, good) is Mode.IDLE  # spot will do the rest: wait for it
    assert sky.decide(job, bad) is Mode.ON_DEMAND  # spot will not: buy the gap now


# -- guarantees over random traces -----------------------------------------------------------


def random_ticks(rng, n, up_mean, down_mean):
    ticks: list[int] = []
    state = rng.random() < 0.5
    while len(ticks) < n:
        length = max(1, int(rng.expovariate(1 / (up_mean if state else down_mean))))
        ticks.extend([int(state)] * length)
        state = not state
    return ticks[:n]


@pytest.mark.parametrize("seed", range(12))
def test_no_policy_misses_a_feasible_deadline_and_none_beats_the_optimum(seed):
    rng = random.Random(seed)
    ticks = random_ticks(rng, 400, up_mean=rng.choice([2, 6, 20]), down_mean=rng.choice([2, 6, 20]))
    compute_h = rng.choice([3.0, 6.0])
    d = rng.choice([0.25, 0.5, 1.0])
    deadline_h = compute_h * rng.choice([1.0, 1.3, 2.0, 3.0]) + 2 * d
    grid = grid_over(ticks, compute_h=compute_h, deadline_h=deadline_h, changeover_h=d, tick_s=900.0)
    best = optimum(grid, PRICES)
    assert best.deadline_met
    for policy in POLICIES:
        out = simulate(policy, grid, PRICES)
        assert out.deadline_met, (policy.name, out)
        assert out.cost_usd >= best.cost_usd - 1e-6, (policy.name, out, best)
    assert best.cost_usd <= on_demand_only(grid, PRICES).cost_usd + 1e-6
    assert best.spot_h + best.on_demand_h >= grid.job.compute_h


def test_the_optimum_schedule_adds_up():
    ticks = [0] * 6 + [1] * 10 + [0] * 4 + [1] * 40
    grid = grid_over(ticks, compute_h=6.0, deadline_h=12.0, changeover_h=0.5)
    best = optimum(grid, PRICES)
    assert best.cost_usd == pytest.approx(best.spot_h * 1.0 + best.on_demand_h * 3.0)
    assert best.spot_h + best.on_demand_h == pytest.approx(6.0 + best.switches * 0.5)
    assert best.finish_h is not None and best.finish_h <= 12.0


# -- trace files -----------------------------------------------------------------------------


def test_reads_the_capacity_csv_by_zone_and_the_timestamped_csv(tmp_path):
    wide = tmp_path / "gcp_h100_a3-highgpu-1g_x16_capacity_2025-10.csv"
    wide.write_text(
        "scheduled_at_utc,run_id,us-east4-a,us-west1-b\n"
        "2025-10-04T00:10:00Z,a,16,0\n2025-10-04T00:20:00Z,b,7,3\n2025-10-04T00:30:00Z,c,16,16\n"
    )
    assert trace_zones(wide) == ("us-east4-a", "us-west1-b")
    trace = load_trace(wide, zone="us-east4-a")
    assert (trace.gap_s, trace.counts, trace.cloud, trace.region, trace.instance_type) == (
        600.0,
        (16, 7, 16),
        "gcp",
        "us-east4",
        "a3-highgpu-1g",
    )
    assert trace.available(16) == [1, 0, 1]
    with pytest.raises(ValueError, match="us-east4-a, us-west1-b"):
        load_trace(wide, zone="europe-west4-a")
    narrow = tmp_path / "us-west-2b_v100_1.csv"
    narrow.write_text("date,availability\n2023-02-15 22:08:00,1\n2023-02-15 22:11:15,0\n2023-02-15 22:14:30,1\n")
    trace = load_trace(narrow)
    assert (trace.gap_s, trace.counts, trace.cloud, trace.instance_type) == (195.0, (1, 0, 1), "aws", "p3.2xlarge")


def test_reads_every_real_trace_format(shared_traces_dir):
    v100 = load_trace(shared_traces_dir / "availability/1-node/aws-02-15-2023/us-west-2b_v100_1.json")
    assert (v100.gap_s, len(v100.counts), v100.region) == (195.0, 20158, "us-west-2")
    gang = load_trace(shared_traces_dir / "availability/16-node/aws-08-27-2023/us-west-2c_v100_1.json")
    assert max(gang.counts) == 16 and sum(gang.available(16)) < sum(gang.available(1))
    priced = load_trace(shared_traces_dir / "preemption/1-node/aws-04-22-2023/us-west-2b_v100_1.json")
    assert priced.spot_prices_usd_per_hour and set(priced.spot_prices_usd_per_hour) == {0.918}
    csv_path = shared_traces_dir / "derived/gcp_h100_a3-highgpu-1g_x16_capacity_2025-10.csv"
    assert len(trace_zones(csv_path)) == 13
    h100 = load_trace(csv_path, zone="us-central1-a")
    assert (h100.gap_s, len(h100.counts)) == (600.0, 2104)
    same = load_trace(
        shared_traces_dir / "skynomad-artifact/data/real/availability/2023-02-15/processed/us-west-2b_v100_1.csv"
    )
    assert same.counts == v100.counts  # the timestamped copy is the same series


def test_several_zones_a_preemption_in_one_moves_the_job_to_another_for_a_new_changeover():
    from skygreen.deadline.simulate import make_multizone_grid

    a = [1] * 4 + [0] * 40
    b = [0] * 2 + [1] * 42
    job = Job(compute_h=4.0, deadline_h=12.0, changeover_h=0.5)
    grid = make_multizone_grid(job, [a, b], tick_s=HOUR_S / 2)
    assert grid.available[:6] == (True,) * 6 and len(grid.zones) == 2
    out = simulate(Greedy(), grid, PRICES)
    # zone a for 2 h (0.5 changeover + 1.5 progress), then b: 0.5 + 2.5
    assert (out.switches, out.spot_h, out.on_demand_h) == (2, 5.0, 0.0)
    assert out.finish_h == pytest.approx(5.0)
    alone = simulate(Greedy(), grid_over(a, compute_h=4.0, deadline_h=12.0, changeover_h=0.5), PRICES)
    assert alone.on_demand_h > 0 and alone.cost_usd > out.cost_usd
    assert optimum(grid, PRICES).cost_usd <= out.cost_usd  # zone moves free: a lower bound


def test_expected_spot_leaves_on_demand_only_for_spot_that_has_stayed_up():
    job = Job(compute_h=40.0, deadline_h=80.0, changeover_h=0.3)

    def on_demand_with_spot_up(up_h: float) -> Observation:
        return Observation(elapsed_h=24.0, progress_h=2.0, mode=Mode.ON_DEMAND, spot_available=True,
                           spot_seen_h=12.0, spot_runs_seen=4, spot_up_h=up_h)  # fmt: skip

    sky = ExpectedSpot(price_ratio=3.0)
    assert sky.spot_rate(job, on_demand_with_spot_up(0.3))[0] * (80 - 24 - 0.6) < 38  # on-demand still needed
    assert sky.decide(job, on_demand_with_spot_up(0.3)) is Mode.ON_DEMAND  # flickering: up one probe
    assert sky.decide(job, on_demand_with_spot_up(0.6)) is Mode.SPOT
    assert ExpectedSpot(price_ratio=3.0, dwell_changeovers=0).decide(job, on_demand_with_spot_up(0.0)) is Mode.SPOT


def test_a_flickering_zone_does_not_burn_the_slack():
    ticks = [1, 0] * 200  # up one tick, down the next
    grid = grid_over(ticks, compute_h=10.0, deadline_h=11.0, changeover_h=0.5, tick_s=HOUR_S / 2)
    out = simulate(ExpectedSpot(price_ratio=3.0), grid, PRICES)
    assert out.deadline_met and out.switches <= 3
