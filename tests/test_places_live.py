"""The nomad run live, its pure parts: one poll's choice, the pinned relaunch, the journey and
its measured moves, and which runs have several places."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import yaml

from skygreen.bill.rates import Place as BillPlace
from skygreen.bill.rates import transfer_usd
from skygreen.deadline.live import DeadlineTerms
from skygreen.deadline.policy import Mode
from skygreen.errors import InputError
from skygreen.launch.registry import Launch, RunRecord
from skygreen.launch.render import to_yaml
from skygreen.ledger.place import current_place
from skygreen.ledger.records import Place as LedgerPlace
from skygreen.ledger.records import Segment
from skygreen.places.journey import Journey, Move, PlaceSeen, measure, place_json
from skygreen.places.live import PlacePrice, Situation, choose
from skygreen.places.pin import bucket_for, pinned_task
from skygreen.places.place import Market, Place
from skygreen.places.rates import bill_egress_usd
from skygreen.places.watcher import market_places, offer_places, run_places

CENTRAL = Place(cloud="gcp", region="us-central1", zone="us-central1-a")
EAST = Place(cloud="gcp", region="us-east4", zone="us-east4-a")
EUROPE = Place(cloud="gcp", region="europe-west4", zone="europe-west4-a")
D_H = 0.1007  # the tiny task's changeover: a restart of 360 s and half a 5 s interval


def prices(europe: float, central: float = 1.9, east: float = 2.0) -> tuple[PlacePrice, ...]:
    return tuple(
        PlacePrice(place=p, spot_usd_per_hour=s, on_demand_usd_per_hour=10.0)
        for p, s in ((EUROPE, europe), (CENTRAL, central), (EAST, east))
    )


def situation(**kw) -> Situation:
    base = dict(places=prices(3.0), available=(True, True, True), at=1, mode=Mode.SPOT, work_left_h=6.0,
                time_left_h=12.0, changeover_h=D_H, checkpoint_gb=0.001, seen=(PlaceSeen(),) * 3, now_s=0.0)  # fmt: skip
    return Situation(**{**base, **kw})


def test_a_run_on_the_cheapest_spot_stays():
    c = choose(situation())
    assert (c.mode, c.place) == (Mode.SPOT, 1)
    assert c.reason.startswith("stay at us-central1-a: nothing better by the margin")


def test_after_a_preemption_it_moves_to_a_place_within_its_price_and_says_why():
    seen = (PlaceSeen(), PlaceSeen(run_h=2.5, preemptions=1), PlaceSeen())
    c = choose(situation(available=(True, False, True), mode=Mode.IDLE, work_left_h=4.0, time_left_h=9.5,
                         seen=seen, now_s=9000.0, preempted=True))  # fmt: skip
    assert (c.mode, c.place, c.found_down) == (Mode.SPOT, 2, (1,))  # us-central1-a tried first: down
    assert c.reason.startswith("availability: us-central1-a down; us-east4-a at $2.09/useful h")
    east = c.scores_usd_per_hour["us-east4-a"]
    assert east is not None and east == pytest.approx(2.087, abs=1e-3) and east <= c.accept_usd_per_hour


def test_a_changeover_measured_on_a_cloud_makes_a_move_there_dearer():
    seen = (PlaceSeen(), PlaceSeen(run_h=2.5, preemptions=1), PlaceSeen())
    after = dict(available=(True, False, True), mode=Mode.IDLE, work_left_h=4.0, time_left_h=9.5, seen=seen,
                 now_s=9000.0, preempted=True)  # fmt: skip
    slow = choose(situation(**after, changeover_s_by_cloud={"gcp": 3600.0}))  # earlier runs took an hour there
    quick = choose(situation(**after))
    east_slow, east_quick = slow.scores_usd_per_hour["us-east4-a"], quick.scores_usd_per_hour["us-east4-a"]
    assert east_slow is not None and east_quick is not None and east_slow > east_quick
    assert (quick.mode, slow.mode) == (Mode.SPOT, Mode.IDLE)  # the hour-long changeover is not worth it yet


def test_it_waits_for_the_cheap_place_while_slack_allows_rather_than_pay_more():
    c = choose(situation(places=prices(3.0, east=2.6), available=(True, False, True), mode=Mode.IDLE,
                         work_left_h=4.0, time_left_h=9.5, now_s=9000.0))  # fmt: skip
    assert (c.mode, c.place) == (Mode.IDLE, -1)
    assert c.reason.startswith("wait: us-central1-a down; cheapest us-central1-a")


def test_on_spot_it_moves_only_for_a_place_cheaper_by_the_margin():
    moved = choose(situation(places=prices(1.0), at=2, work_left_h=3.0, time_left_h=7.5))
    assert (moved.mode, moved.place) == (Mode.SPOT, 0)
    assert moved.reason.startswith("price: europe-west4-a at $1.06/useful h beats us-east4-a at $2.00/h")
    kept = choose(situation(places=prices(1.9), at=2, work_left_h=3.0, time_left_h=7.5))
    assert (kept.mode, kept.place) == (Mode.SPOT, 2)


def test_the_safety_net_takes_on_demand_where_it_finishes_cheapest_and_holds():
    od = (PlacePrice(place=EUROPE, spot_usd_per_hour=1.0, on_demand_usd_per_hour=9.0),
          PlacePrice(place=CENTRAL, spot_usd_per_hour=1.9, on_demand_usd_per_hour=8.0),
          PlacePrice(place=EAST, spot_usd_per_hour=2.0, on_demand_usd_per_hour=10.0))  # fmt: skip
    c = choose(situation(places=od, available=(False, False, False), mode=Mode.IDLE, work_left_h=4.0, time_left_h=4.4))
    assert (c.mode, c.place, c.latched) == (Mode.ON_DEMAND, 1, True)
    assert c.reason.startswith("safety net")
    later = choose(situation(places=od, mode=Mode.ON_DEMAND, work_left_h=1.0, time_left_h=9.0, latched=True))
    assert (later.mode, later.place) == (Mode.ON_DEMAND, 1)  # latched: no way back to spot
    pressed = choose(situation(places=od, mode=Mode.ON_DEMAND, work_left_h=5.0, time_left_h=6.0))
    assert (pressed.mode, pressed.place) == (Mode.ON_DEMAND, 1)
    assert pressed.reason.startswith("stay on on-demand at us-central1-a: pressure")


def test_a_situation_that_does_not_add_up_is_refused():
    with pytest.raises(ValueError, match="must agree"):
        situation(available=(True,))
    with pytest.raises(ValueError, match="must be at a place"):
        situation(at=-1)


def test_a_move_is_priced_at_the_whole_bills_transfer_rates():
    gb = 50.0
    assert bill_egress_usd(CENTRAL, EAST, gb) == transfer_usd(BillPlace(cloud="gcp", region="us-central1"),
                                                              BillPlace(cloud="gcp", region="us-east4"), gb)  # fmt: skip
    assert bill_egress_usd(EAST, EUROPE, gb) > bill_egress_usd(CENTRAL, EAST, gb) > 0
    assert bill_egress_usd(CENTRAL, Place(cloud="gcp", region="us-central1", zone="us-central1-b"), gb) == 0


def test_a_relaunch_is_pinned_to_its_place_keeping_only_the_candidates_there():
    task: dict[str, Any] = {
        "resources": {"use_spot": True, "ordered": [
            {"infra": "gcp/us-east4", "accelerators": "L4:1"},
            {"infra": "gcp/us-central1", "accelerators": "L4:1"},
            {"cloud": "gcp", "region": "us-east4", "accelerators": "T4:1"},
            {"infra": "aws/us-east-1", "accelerators": "L4:1"},
        ]},
        "envs": {"SKYGREEN_RUN_ID": "r"},
    }  # fmt: skip
    pinned = pinned_task(task, EAST, bucket=bucket_for(EAST, "s3://b/runs"))
    assert pinned["resources"]["ordered"] == [
        {"infra": "gcp/us-east4/us-east4-a", "accelerators": "L4:1"},
        {"infra": "gcp/us-east4/us-east4-a", "accelerators": "T4:1"},
    ]
    assert pinned["envs"] == {"SKYGREEN_RUN_ID": "r", "SKYGREEN_PLACE": "gcp/us-east4/us-east4-a",
                              "SKYGREEN_BUCKET": "s3://b/runs"}  # fmt: skip
    assert task["resources"]["ordered"][0] == {"infra": "gcp/us-east4", "accelerators": "L4:1"}  # a copy
    nowhere = pinned_task(task, EUROPE, bucket="s3://b/runs")  # no candidate there: the GPUs are kept
    assert nowhere["resources"]["ordered"] == [
        {"infra": "gcp/europe-west4/europe-west4-a", "accelerators": "L4:1"},
        {"infra": "gcp/europe-west4/europe-west4-a", "accelerators": "T4:1"},
    ]
    back = pinned_task(pinned, CENTRAL, bucket="s3://b/runs", rendered=task)  # every candidate again
    assert back["resources"]["ordered"] == [{"infra": "gcp/us-central1/us-central1-a", "accelerators": "L4:1"}]
    on_demand = {**pinned, "resources": {**pinned["resources"], "use_spot": False}}
    assert pinned_task(on_demand, CENTRAL, bucket="s3://b/runs", rendered=task)["resources"]["use_spot"] is False
    local = pinned_task({"resources": {}, "run": "python train.py"}, EUROPE, bucket="/tmp/b")
    assert local["resources"] == {"infra": "gcp/europe-west4/europe-west4-a"}


def test_skypilot_accepts_a_pinned_relaunch(sky):
    task = {"name": "t", "run": "python train.py", "envs": {"SKYGREEN_RUN_ID": "r"}, "resources": {
        "use_spot": True, "ordered": [{"infra": "gcp/us-east4", "accelerators": "L4:1", "use_spot": True},
                                      {"infra": "aws/us-east-1", "accelerators": "L4:1", "use_spot": True}]}}  # fmt: skip
    pinned = pinned_task(task, EAST, bucket="s3://b/runs")
    parsed = sky.Task.from_yaml_config(copy.deepcopy(yaml.safe_load(to_yaml(pinned))))
    assert [(str(r.cloud), r.region, r.zone, r.use_spot) for r in parsed.resources] == [
        ("GCP", "us-east4", "us-east4-a", True)
    ]
    assert parsed.envs["SKYGREEN_PLACE"] == "gcp/us-east4/us-east4-a"


def segment(started_at: float, **kw) -> Segment:
    return Segment(run_id="r", key=f"ledger/20260101T000000000Z-{int(started_at):08x}.json",
                   place=LedgerPlace(cloud="local"), started_at=started_at, updated_at=started_at + 60, **kw)  # fmt: skip


def test_a_move_is_measured_from_the_new_lifes_first_step():
    move = Move(number=1, launch=2, job_id="j", src=place_json(CENTRAL), dst=place_json(EUROPE), mode="spot",
                reason="why", stopped_at=1000.0, launched_at=1010.0, price_usd_per_hour=3.6)  # fmt: skip
    earlier = segment(500.0, first_step_at=510.0, restore_bytes=None)
    assert measure(move, [earlier]) == move and not move.measured  # the new life has not stepped yet
    new = segment(1012.0, first_step_at=1030.0, restore_bytes=2_000_000_000, restore_s=4.0)
    done = measure(move, [earlier, new])
    assert done.changeover_s == 30.0 and done.restore_bytes == 2_000_000_000 and done.restore_s == 4.0
    assert done.egress_usd == pytest.approx(bill_egress_usd(CENTRAL, EUROPE, 2.0))
    assert done.changeover_usd == pytest.approx(3.6 * 30 / 3600)
    assert done.egress_usd is not None and done.changeover_usd is not None
    assert done.usd == pytest.approx(done.egress_usd + done.changeover_usd)
    journey = Journey(place=place_json(EUROPE), mode="spot", seen={"us-central1-a": PlaceSeen(run_h=2.0, preemptions=1)},
                      moves=(done,))  # fmt: skip
    assert Journey.from_json(journey.to_json()) == journey


def test_a_local_lifes_ledger_place_says_which_region_it_stood_for():
    here = current_place({"SKYGREEN_PLACE": "gcp/us-east4/us-east4-a", "SKYGREEN_CAPACITY": "spot"}, gpu=None)
    assert (here.cloud, here.region, here.zone, here.spot) == ("local", "us-east4", "us-east4-a", True)
    assert (current_place({}, gpu=None).region, current_place({}, gpu=None).zone) == (None, None)


def market() -> Market:
    ticks = 10
    up = [[t >= 3 for t in range(ticks)], [t < 2 for t in range(ticks)], [True] * ticks]
    spot = [[3.0] * ticks, [1.9] * ticks, [2.0] * 5 + [2.5] * 5]
    return Market(places=(EUROPE, CENTRAL, EAST), tick_s=600.0, available=np.array(up), spot_usd_per_hour=np.array(spot),
                  on_demand_usd_per_hour=np.full(3, 10.0))  # fmt: skip


TERMS = DeadlineTerms(started_at_s=0.0, deadline_at_s=43200.0, changeover_h=D_H, policy="skygreen", compute_h=6.0)


def test_a_replayed_market_gives_each_places_price_and_spot_now_and_where_a_first_launch_lands():
    now = market_places(market(), TERMS, now_s=3000.0, launched_at_s=0.0)  # tick 5
    assert [p.spot_usd_per_hour for p in now.prices] == [3.0, 1.9, 2.5]
    assert now.available == (True, False, True)
    assert now.landed == 1  # the cheapest with spot up at launch
    assert now.index(EAST) == 2 and now.index(place_json(EUROPE)) == 0
    late = market_places(market(), TERMS, now_s=1e6, launched_at_s=1500.0)
    assert late.available == (False, False, False) and late.landed == 2  # past the trace: spot is gone


def test_a_plans_offers_give_one_place_per_region_at_its_best_price():
    offers = [
        {"cloud": "aws", "region": "us-east-1", "instance_type": "g6.xlarge", "spot_price_usd_per_hour": 0.5,
         "on_demand_price_usd_per_hour": 0.8, "compute_hours": 10.0},
        {"cloud": "aws", "region": "us-east-1", "instance_type": "g4dn.xlarge", "spot_price_usd_per_hour": 0.3,
         "on_demand_price_usd_per_hour": 0.5, "compute_hours": 20.0},
        {"cloud": "gcp", "region": "us-central1", "instance_type": "g2-standard-4", "spot_price_usd_per_hour": 0.3,
         "on_demand_price_usd_per_hour": 0.7, "num_nodes": 2, "compute_hours": 10.0},
    ]  # fmt: skip
    places = offer_places(offers)
    assert places is not None  # per hour of the run's work: the T4 is cheaper per hour, dearer per work
    assert [(p.place.region, p.place.offer, p.spot_usd_per_hour) for p in places.prices] == [
        ("us-east-1", "g6.xlarge", 0.5),
        ("us-central1", "g2-standard-4", 0.6),
    ]
    assert places.available == (None, None)
    assert offer_places(offers[:2]) is None  # one region: the single-place policy


def record(**kw) -> RunRecord:
    base = dict(run_id="r", task_path="t.yaml", task_name="t", mode="cloud", launcher="fake", bucket="s3://b/runs",
                task_yaml="task.yaml", spec_snapshot={"skygreen": {"regions": None}}, created_at="",
                state="RUNNING", launches=(Launch(at="", job_id="1", started_at_s=0.0),))  # fmt: skip
    return RunRecord(**{**base, **kw})


def test_a_task_that_names_fewer_than_two_regions_keeps_the_single_place_policy(tmp_path):
    offers = [
        {"cloud": "aws", "region": r, "spot_price_usd_per_hour": 0.4, "on_demand_price_usd_per_hour": 1.0}
        for r in ("us-east-1", "us-west-2", "eu-west-1")
    ]
    summary = {"offers": offers}
    assert run_places(record(plan_summary=summary), TERMS, {}, now_s=0.0) is None
    named = record(plan_summary=summary, spec_snapshot={"skygreen": {"regions": ["us-east-1", "us-west-2"]}})
    places = run_places(named, TERMS, {}, now_s=0.0)
    assert places is not None and [p.place.region for p in places.prices] == ["us-east-1", "us-west-2"]
    assert run_places(record(mode="local"), TERMS, {}, now_s=0.0) is None
    single = tmp_path / "trace.json"
    single.write_text('{"metadata": {"gap_seconds": 3600}, "data": [1, 1]}')
    assert run_places(record(mode="local"), TERMS, {"SKYGREEN_TEST_SPOT_TRACE": str(single)}, now_s=0.0) is None
    broken = tmp_path / "market" / "us-east4-a_h100_16"
    broken.mkdir(parents=True)
    (broken / "full.json").write_text('{"data": [0]}')  # no metadata
    with pytest.raises(InputError, match=r"SKYGREEN_TEST_SPOT_TRACE=.*not a multi-region market"):
        run_places(record(mode="local"), TERMS, {"SKYGREEN_TEST_SPOT_TRACE": str(broken.parent)}, now_s=0.0)
