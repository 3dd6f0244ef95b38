"""Ranking offers by cost per run: the estimate model, the constraints, the objectives, the
"no offer" advice, and properties over random catalogs (best first; winner = brute force)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skygreen import api
from skygreen.checkpoint.interval import optimal_interval_s
from skygreen.errors import NoOfferError, SpecError
from skygreen.gpus import GPUS
from skygreen.plan import carbon
from skygreen.plan.catalog import Catalog, Offer, load_catalog
from skygreen.plan.cost import RunModel, compute_hours, estimate
from skygreen.plan.explain import objective_value
from skygreen.plan.rank import Candidate, Plan, make_plan, run_model
from skygreen.task.spec import OBJECTIVES, TaskSpec, parse_spec_text

FIXTURE_CATALOG = Path(__file__).resolve().parent / "data" / "catalog" / "v8"
REQUIRED_JSON_KEYS = {
    "cloud", "region", "instance_type", "accelerator", "accelerator_count", "spot",
    "price_usd_per_hour", "est_hours", "est_cost_usd",
}  # fmt: skip


def spec(section: str = "{}", *, num_nodes: int = 1) -> TaskSpec:
    return parse_spec_text(f"num_nodes: {num_nodes}\nskygreen: {section}\nrun: python train.py\n")


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(FIXTURE_CATALOG, env={})


def plan_of(catalog: Catalog, section: str = "{}", **kw) -> Plan:
    return make_plan(spec(section, **kw), catalog)


# ---------------------------------------------------------------- the estimate model


def test_compute_hours_scale_with_relative_speed_and_gpu_count():
    model = RunModel(work_gpu_hours=12, work_on="A100")
    assert compute_hours(model, "A100", 1) == pytest.approx(12)
    assert compute_hours(model, "L4", 1) == pytest.approx(12 / GPUS["L4"].relative_speed)
    # 4 GPUs: two doublings at 95% efficiency each.
    assert compute_hours(model, "A100", 4) == pytest.approx(12 / (4 * 0.95**2))
    two_nodes = RunModel(work_gpu_hours=12, work_on="A100", num_nodes=2)
    assert compute_hours(two_nodes, "A100", 4) == pytest.approx(12 / (8 * 0.95**3))


def test_on_demand_with_auto_interval_pays_no_overhead():
    model = RunModel(work_gpu_hours=10)
    est = estimate(model, cloud="aws", gpu="A100", gpus_per_node=1, spot=False)
    assert est.est_hours == pytest.approx(est.compute_hours) and est.expected_preemptions == 0
    assert est.checkpoint_interval_s is None


def test_spot_overhead_grows_with_the_preemption_rate():
    hours = [
        estimate(
            RunModel(work_gpu_hours=10, preemption_rate_per_hour={"aws": r}),
            cloud="aws",
            gpu="A100",
            gpus_per_node=1,
            spot=True,
        ).est_hours
        for r in (0.01, 0.1, 0.5, 1.0)
    ]
    assert 10 < hours[0] < hours[1] < hours[2] < hours[3]


def test_an_offer_preempted_faster_than_it_restarts_has_no_estimate():
    model = RunModel(work_gpu_hours=10, preemption_rate_per_hour={"gcp": 20.0}, restart_s=600)
    assert estimate(model, cloud="gcp", gpu="A100", gpus_per_node=1, spot=True) is None


def test_daly_interval_is_near_the_optimum_of_the_wall_time_model():
    rate, save_s = 0.25, 10.0
    tau = optimal_interval_s(save_s, 3600 / rate)

    def wall(interval_s: float) -> float:
        m = RunModel(
            work_gpu_hours=10,
            preemption_rate_per_hour={"aws": rate},
            checkpoint_cost_s=save_s,
            checkpoint_interval_s=interval_s,
        )
        return estimate(m, cloud="aws", gpu="A100", gpus_per_node=1, spot=True).est_hours

    assert 400 < tau < 700  # sqrt(2 x 10 s x 14400 s) = 537 s, less Daly's correction
    assert wall(tau) < wall(tau / 2) and wall(tau) < wall(tau * 2)
    assert wall(tau) <= min(wall(tau * f) for f in (0.8, 0.9, 1.1, 1.25)) + 1e-4


def test_a_fixed_interval_costs_checkpoint_time_even_on_demand():
    model = RunModel(work_gpu_hours=10, checkpoint_cost_s=10, checkpoint_interval_s=100)
    est = estimate(model, cloud="aws", gpu="A100", gpus_per_node=1, spot=False)
    assert est.est_hours == pytest.approx(10 * 1.1)


def test_a_short_fixed_interval_caps_the_assumed_save_cost_at_a_tenth_of_it():
    model = RunModel(work_gpu_hours=10, checkpoint_cost_s=10, checkpoint_interval_s=5)
    assert estimate(model, cloud="aws", gpu="A100", gpus_per_node=1, spot=False).est_hours == pytest.approx(11)


def test_energy_and_carbon_follow_board_power_and_region():
    est = estimate(RunModel(work_gpu_hours=10), cloud="gcp", gpu="A100", gpus_per_node=1, spot=False)
    assert est.energy_kwh == pytest.approx(10 * 400 * 0.8 * 1.10 / 1000)
    low, high = carbon.intensity("gcp", "europe-north1"), carbon.intensity("gcp", "asia-south1")
    assert low.basis == "region" and low.g_co2e_per_kwh < high.g_co2e_per_kwh
    assert carbon.intensity("aws", "us-east-1").basis == "country"
    assert carbon.intensity("aws", "xx-nowhere-9").basis == "assumed"


# ---------------------------------------------------------------- records


def test_candidate_and_plan_records_serialise_to_plain_json(catalog):
    plan = plan_of(catalog, "{on_demand_fallback: true}")
    doc = json.loads(json.dumps(plan.to_json()))
    assert set(doc["candidates"][0]) >= REQUIRED_JSON_KEYS
    assert doc["candidates"][0] == plan.best.to_json()
    assert set(doc["best_per_cloud"]) == {"aws", "gcp", "azure"}


def test_records_reject_impossible_values():
    with pytest.raises(ValueError):
        Offer(cloud="ibm", region="r", instance_type="t", accelerator="A100", accelerator_count=1,
              on_demand_price_usd_per_hour=1.0, spot_price_usd_per_hour=None)  # fmt: skip
    with pytest.raises(ValueError):
        Plan(candidates=(), objective="cost")


# ---------------------------------------------------------------- constraints


def test_default_is_spot_only_and_blank_spot_prices_drop_the_offer(catalog):
    plan = plan_of(catalog)
    assert all(c.spot for c in plan.candidates)
    assert not [c for c in plan.candidates if c.region == "us-west-2"]  # p3.2xlarge: no spot price there


def test_on_demand_fallback_ranks_both_and_on_demand_wins_where_spot_costs_more(catalog):
    plan = plan_of(catalog, "{gpus: [A10G], on_demand_fallback: true}")
    assert [c.spot for c in plan.candidates] == [False, True]
    assert plan.best.price_usd_per_hour == 1.006


def test_spot_false_means_on_demand_only(catalog):
    assert not any(c.spot for c in plan_of(catalog, "{spot: false}").candidates)


def test_gpu_names_memory_count_clouds_regions_filters(catalog):
    assert {c.accelerator for c in plan_of(catalog, "{gpus: [L4, T4]}").candidates} == {"L4", "T4"}
    assert {c.accelerator for c in plan_of(catalog, "{gpus: {min_memory_gb: 40}}").candidates} == {
        "A100",
        "A100-80GB",
        "H100",
    }
    assert {c.accelerator_count for c in plan_of(catalog, "{gpu_count: 8}").candidates} == {8}
    assert {c.cloud for c in plan_of(catalog, "{clouds: [gcp]}").candidates} == {"gcp"}
    assert {c.region for c in plan_of(catalog, "{regions: [eastus, eu-west-1]}").candidates} == {"eastus", "eu-west-1"}


def test_max_price_and_budget_drop_offers(catalog):
    assert all(c.price_usd_per_hour <= 0.2 for c in plan_of(catalog, "{max_price_per_hour: 0.2}").candidates)
    everything = plan_of(catalog)
    budget = sorted(c.est_cost_usd for c in everything.candidates)[2]
    capped = plan_of(catalog, f"{{budget_usd: {budget}}}")
    assert len(capped.candidates) == 3 and all(c.est_cost_usd <= budget for c in capped.candidates)


def test_multi_node_cost_is_per_node_price_times_hours_times_nodes(catalog):
    c = plan_of(catalog, "{gpus: [A100], gpu_count: 8}", num_nodes=2).best
    assert c.num_nodes == 2
    assert c.est_cost_usd == pytest.approx(c.price_usd_per_hour * c.est_hours * 2)


# ---------------------------------------------------------------- objectives


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_candidates_are_best_first_by_the_objective(catalog, objective):
    plan = plan_of(catalog, f"{{objective: {objective}, on_demand_fallback: true}}")
    values = [objective_value(c, objective) for c in plan.candidates]
    assert values == sorted(values)
    assert plan.objective == objective


def test_time_objective_prefers_the_fastest_gpu_over_the_cheapest_run(catalog):
    assert plan_of(catalog, "{objective: time}").best.accelerator == "H100"
    assert plan_of(catalog, "{objective: cost}").best.accelerator != "H100"


def test_speed_override_and_measured_speed_change_the_winner(catalog):
    assert plan_of(catalog).best.accelerator == "T4"  # azure's $0.05/h spot T4
    assert plan_of(catalog, "{speed: {T4: 0.01}}").best.accelerator != "T4"
    measured = make_plan(spec("{speed: {T4: 0.01}}"), catalog, measured_speed={"T4": 0.15})
    assert measured.best.accelerator == "T4"  # measured throughput beats the task's guess


def test_reason_names_the_winner_and_best_per_cloud_is_each_clouds_first(catalog):
    plan = plan_of(catalog)
    assert plan.best.label in plan.reason[0]
    for cloud, best in plan.best_per_cloud.items():
        assert best is next(c for c in plan.candidates if c.cloud == cloud)


# ---------------------------------------------------------------- no offer, unknown region


def no_offer(catalog: Catalog, section: str) -> str:
    with pytest.raises(NoOfferError) as info:
        plan_of(catalog, section)
    return str(info.value)


def test_no_offer_names_the_price_cap_and_the_offer_it_hides(catalog):
    message = no_offer(catalog, "{max_price_per_hour: 0.01}")
    assert "relax skygreen.max_price_per_hour (now 0.01)" in message
    assert "azure eastus Standard_NC4as_T4_v3" in message  # the best offer once the cap goes


def test_no_offer_for_a_gpu_the_catalog_lacks_says_relax_gpus(catalog):
    message = no_offer(catalog, "{gpus: [H200]}")
    assert "relax skygreen.gpus" in message and "relax skygreen.max_price" not in message


def test_no_offer_for_an_odd_gpu_count(catalog):
    assert "relax skygreen.gpu_count (now 3)" in no_offer(catalog, "{gpu_count: 3}")


def test_no_offer_lists_every_single_relaxation_that_works(catalog):
    message = no_offer(catalog, "{clouds: [azure], gpus: [L4]}")
    assert "relax skygreen.clouds" in message and "relax skygreen.gpus" in message


def test_no_offer_when_no_single_relaxation_helps(catalog):
    message = no_offer(catalog, "{clouds: [azure], gpus: [L4], max_price_per_hour: 0.01}")
    assert "no single constraint relaxed alone" in message


def test_no_offer_suggests_allowing_on_demand(catalog):
    assert "relax skygreen.spot" in no_offer(catalog, "{gpus: [V100], regions: [us-west-2]}")


def test_unknown_region_is_a_spec_error_with_did_you_mean(catalog):
    with pytest.raises(SpecError) as info:
        plan_of(catalog, "{regions: [us-east-1, us-eats-1]}")
    assert info.value.field == "skygreen.regions[1]"
    assert "did you mean 'us-east-1'" in str(info.value)


# ---------------------------------------------------------------- properties

GPU_NAMES = sorted(GPUS)


@st.composite
def offers(draw) -> Offer:
    cloud = draw(st.sampled_from(["aws", "gcp", "azure"]))
    on_demand = draw(st.one_of(st.none(), st.floats(0.05, 60)))
    spot = draw(st.one_of(st.none(), st.floats(0.01, 60)))
    return Offer(
        cloud=cloud,
        region=draw(st.sampled_from(["r1", "r2", "r3"])),
        instance_type=f"type-{draw(st.integers(0, 5))}",
        accelerator=draw(st.sampled_from(GPU_NAMES)),
        accelerator_count=draw(st.sampled_from([1, 2, 4, 8])),
        on_demand_price_usd_per_hour=on_demand,
        spot_price_usd_per_hour=spot,
    )


def brute_force_best(cat: Catalog, task: TaskSpec) -> float | None:
    """The best objective value over every offer x (spot, on-demand), recomputed from the
    estimate model and the constraints as the task file states them."""
    g = task.green
    model = run_model(task)
    best = None
    for o in cat.offers:
        if o.cloud not in g.clouds or o.accelerator_count != g.gpu_count:
            continue
        if g.gpus.names is not None and o.accelerator not in g.gpus.names:
            continue
        for spot in (True, False):
            if (spot and not g.spot) or (not spot and g.spot and not g.on_demand_fallback):
                continue
            price = o.spot_price_usd_per_hour if spot else o.on_demand_price_usd_per_hour
            est = estimate(model, cloud=o.cloud, gpu=o.accelerator, gpus_per_node=o.accelerator_count, spot=spot)
            if price is None or est is None:
                continue
            cost = price * est.est_hours * task.num_nodes
            if g.max_price_per_hour is not None and price > g.max_price_per_hour:
                continue
            if g.budget_usd is not None and cost > g.budget_usd:
                continue
            value = {
                "cost": cost,
                "time": est.est_hours,
                "energy": est.energy_kwh,
                "carbon": carbon.co2e_kg(est.energy_kwh, o.cloud, o.region),
            }[g.objective]
            best = value if best is None else min(best, value)
    return best


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    offer_list=st.lists(offers(), min_size=0, max_size=25),
    objective=st.sampled_from(OBJECTIVES),
    gpu_count=st.sampled_from([1, 2, 4, 8]),
    fallback=st.booleans(),
    spot=st.booleans(),
    max_price=st.one_of(st.none(), st.floats(0.05, 50)),
    budget=st.one_of(st.none(), st.floats(1, 2000)),
    gpus=st.one_of(st.none(), st.lists(st.sampled_from(GPU_NAMES), min_size=1, max_size=4, unique=True)),
    nodes=st.sampled_from([1, 2]),
)
def test_plan_is_best_first_and_its_winner_equals_brute_force(
    offer_list, objective, gpu_count, fallback, spot, max_price, budget, gpus, nodes
):
    section = {"objective": objective, "gpu_count": gpu_count, "spot": spot, "on_demand_fallback": fallback and spot}
    if max_price is not None:
        section["max_price_per_hour"] = max_price
    if budget is not None:
        section["budget_usd"] = budget
    if gpus is not None:
        section["gpus"] = gpus
    task = spec(json.dumps(section), num_nodes=nodes)
    cat = Catalog(
        offers=tuple(offer_list), source="generated", regions=dict.fromkeys(("aws", "gcp", "azure"), ("r1", "r2", "r3"))
    )
    expected = brute_force_best(cat, task)
    if expected is None:
        with pytest.raises(NoOfferError):
            make_plan(task, cat)
        return
    plan = make_plan(task, cat)
    values = [objective_value(c, objective) for c in plan.candidates]
    assert values == sorted(values)
    assert math.isclose(values[0], expected, rel_tol=1e-12, abs_tol=1e-12)
    assert all(c.accelerator_count == gpu_count and c.num_nodes == nodes for c in plan.candidates)


def test_real_snapshot_winner_equals_brute_force(shared_catalog_dir):
    cat = load_catalog(shared_catalog_dir, env={})
    for section in ("{}", "{on_demand_fallback: true}", "{gpu_count: 8, objective: time}", "{objective: carbon}"):
        task = spec(section)
        plan = make_plan(task, cat)
        value, best = objective_value(plan.best, task.green.objective), brute_force_best(cat, task)
        assert value is not None and best is not None and math.isclose(value, best, rel_tol=1e-12)


def test_api_plan_reads_the_named_catalog(catalog):
    plan = api.plan(spec("{}"), catalog_dir=FIXTURE_CATALOG)
    assert isinstance(plan.best, Candidate) and plan.catalog_source == str(FIXTURE_CATALOG)
