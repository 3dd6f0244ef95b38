"""Cost quality of `skygreen plan` on the real three-cloud catalog snapshot.

    .venv/bin/python benchmarks/bench_plan_quality.py [--catalog ../shared/catalog/v8]

For each job below, under skygreen's own estimate model (`skygreen.cost`):
- brute force: every offer x (spot, on-demand) in the catalog, filtered by the job's constraints
  and estimated independently of the planner; the ratio plan winner / brute-force best should be
  1.00 (the planner finds the model's optimum);
- SkyPilot's pick for a user who names one GPU type (`accelerators: X:count`, `use_spot`): the
  cheapest offer of X by hourly spot price over the three clouds (within the job's regions, if
  it names some), from the offers `sky.catalog.list_accelerators` itself lists. GPUs that break
  the job's memory floor are not offered to that user ("-"). The ratio SkyPilot pick / plan winner says how much
  more the run would cost there than on skygreen's winner (> 1: skygreen is cheaper).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _sky import SHARED_CATALOG, run_python, seeded_home
from skygreen.plan.catalog import Catalog, load_catalog
from skygreen.plan.cost import estimate
from skygreen.plan.rank import make_candidate, make_plan, run_model
from skygreen.task.spec import TaskSpec, parse_spec_text

JOBS: dict[str, str] = {
    "fine-tune, 2 GPU-h": "{work: {gpu_hours: 2, gpu: A100}}",
    "train, 24 GPU-h": "{work: {gpu_hours: 24, gpu: A100}}",
    "train, 24 GPU-h, spot or on-demand": "{work: {gpu_hours: 24, gpu: A100}, on_demand_fallback: true}",
    "needs 40 GB, 50 GPU-h": "{work: {gpu_hours: 50, gpu: A100}, gpus: {min_memory_gb: 40}}",
    "8-GPU node, 400 GPU-h": "{work: {gpu_hours: 400, gpu: A100}, gpu_count: 8}",
    "US only, 100 GPU-h": "{work: {gpu_hours: 100, gpu: A100}, regions: [us-east-1, us-east-2, us-west-2, us-central1, us-east4, us-west1, eastus, eastus2, westus2, westus3]}",
}
NAMED_GPUS = ("A100", "H100", "L4", "A10G", "T4", "V100")

SKY_PICKS = """
import json, math, sys
from sky import catalog
wanted = json.loads(sys.stdin.read())
picks = {}
for name, count in wanted:
    rows = catalog.list_accelerators(gpus_only=True, name_filter=f'^{name}$', quantity_filter=count,
                                     clouds=['aws', 'gcp', 'azure'], all_regions=True).get(name, [])
    picks[f'{name}:{count}'] = [[r.cloud.lower(), r.region, r.instance_type, r.spot_price, r.price]
                                for r in rows if not math.isnan(r.spot_price)]
print(json.dumps(picks))
"""


def task(section: str) -> TaskSpec:
    return parse_spec_text(f"name: job\nskygreen: {section}\nrun: python train.py\n")


def brute_force_cost(catalog: Catalog, spec: TaskSpec) -> float:
    g, model = spec.green, run_model(spec)
    best = math.inf
    for o in catalog.offers:
        if o.accelerator_count != g.gpu_count or o.cloud not in g.clouds:
            continue
        if g.regions is not None and o.region not in g.regions:
            continue
        if g.gpus.min_memory_gb is not None and _memory_gb(o.accelerator) < g.gpus.min_memory_gb:
            continue
        for spot in (True, False) if g.on_demand_fallback else (True,):
            price = o.price_usd_per_hour(spot)
            est = estimate(model, cloud=o.cloud, gpu=o.accelerator, gpus_per_node=o.accelerator_count, spot=spot)
            if price is not None and est is not None:
                best = min(best, price * est.est_hours * spec.num_nodes)
    return best


def sky_pick(rows: list, spec: TaskSpec) -> list | None:
    """SkyPilot's choice among its listed spot offers: lowest spot price, then on-demand price."""
    regions = spec.green.regions
    rows = [r for r in rows if regions is None or r[1] in regions]
    return min(rows, key=lambda r: (r[3], r[4])) if rows else None


def _memory_gb(gpu: str) -> float:
    from skygreen.gpus import GPUS

    return GPUS[gpu].memory_gb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catalog", type=Path, default=SHARED_CATALOG)
    args = parser.parse_args()
    catalog = load_catalog(args.catalog.resolve(), env={})
    by_key = {(o.cloud, o.region, o.instance_type): o for o in catalog.offers}
    counts = sorted({task(s).green.gpu_count for s in JOBS.values()})
    picks = run_python(
        SKY_PICKS, seeded_home(args.catalog.resolve()), stdin=json.dumps([[n, c] for n in NAMED_GPUS for c in counts])
    )
    print(f"catalog: {args.catalog}; costs are skygreen's estimate of the whole run (USD)")
    header = f"{'job':36} {'plan winner':42} {'est $':>9} {'brute/plan':>10}  " + "  ".join(
        f"{n:>6}" for n in NAMED_GPUS
    )
    print(header)
    ratios_brute, ratios_sky = [], []
    for name, section in JOBS.items():
        spec = task(section)
        plan = make_plan(spec, catalog)
        winner = plan.best
        brute = brute_force_cost(catalog, spec)
        ratios_brute.append(winner.est_cost_usd / brute)
        cells = []
        model = run_model(spec)
        for gpu in NAMED_GPUS:
            pick = sky_pick(picks.get(f"{gpu}:{spec.green.gpu_count}", []), spec)
            if pick is None or (spec.green.gpus.min_memory_gb or 0) > _memory_gb(gpu):
                cells.append(f"{'-':>6}")
                continue
            offer = by_key[(pick[0], pick[1], pick[2])]
            assert offer.spot_price_usd_per_hour is not None and winner is not None
            assert offer.spot_price_usd_per_hour == pick[3] or math.isclose(
                offer.spot_price_usd_per_hour, pick[3], rel_tol=1e-12
            )
            sky_candidate = make_candidate(offer, True, model)
            assert sky_candidate is not None
            ratio = sky_candidate.est_cost_usd / winner.est_cost_usd
            ratios_sky.append(ratio)
            cells.append(f"{ratio:6.2f}")
        label = f"{winner.cloud} {winner.region} {winner.instance_type} ({'spot' if winner.spot else 'od'})"
        print(
            f"{name:36} {label:42} {winner.est_cost_usd:9.2f} {winner.est_cost_usd / brute:10.2f}  " + "  ".join(cells)
        )
    print()
    print(f"plan winner / brute-force best: min {min(ratios_brute):.2f}, max {max(ratios_brute):.2f} (1.00 expected)")
    print(
        f"SkyPilot's cheapest spot offer for a named GPU / plan winner (est. run cost): "
        f"median {statistics.median(ratios_sky):.2f}x, min {min(ratios_sky):.2f}x, max {max(ratios_sky):.2f}x "
        f"over {len(ratios_sky)} (job, GPU) pairs"
    )


if __name__ == "__main__":
    main()
