"""Deadline policies on the real spot traces: cost, misses, and ratios to Uniform Progress and the optimum.

    .venv/bin/python benchmarks/bench_deadline.py [--traces ../shared/spot-traces] [--starts 5]

Every AWS V100 trace (1-node availability 2022-10 and 2023-02, 16-node availability, 1-node and
4-node preemption; N-node files as gangs of N) and the 13 GCP H100 zones (2025-10, a zone counts
as available when one a3-highgpu-1g launched), a job of C = 48 h, deadlines R = slack x C for
slack 1.1 to 3, changeovers d of 0.1, 0.3 and 0.5 h, from `--starts` start points per trace
spread evenly over where the whole deadline fits. Prices are k = 3.33 (p3.2xlarge, $3.06 vs
$0.918) for AWS and k = 4.35 (a3-highgpu-8g spot vs on-demand, the SkyNomad price cache) for
GCP; costs are shown relative to all on-demand, so only k matters.

Traces sampled faster than every 180 s (the 32 s preemption files) are pooled to ticks of
~3 min (spot available in a pooled tick only if it was in every sample), to keep the optimum's
dynamic program small; every policy and the optimum see the same pooled trace.

Then the paper's own setting ("Can't Be Late" §6.4, ML: RoBERTa on p3.2xlarge us-west-2b, 72 h
of compute, deadlines 84 h and 100 h, d = 0.3 h) on the 2023-04 us-west-2b preemption trace,
over every start point ~4 h apart.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import statistics
import time
from pathlib import Path

import numpy as np

from skygreen.deadline.optimum import optimal_costs
from skygreen.deadline.policy import ExpectedSpot, Greedy, Job, Policy, UniformProgress
from skygreen.deadline.simulate import Prices, make_grid, make_multizone_grid, on_demand_only, simulate
from skygreen.plan.replay import SpotTrace, load_trace, trace_zones

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "spot-traces"
COMPUTE_H = 48.0
SLACKS = (1.1, 1.25, 1.5, 2.0, 3.0)
CHANGEOVERS_H = (0.1, 0.3, 0.5)
PRICE_RATIO = {"aws": 3.06 / 0.918, "gcp": 4.35}
POOL_BELOW_S = 180.0
H100_CSV = "derived/gcp_h100_a3-highgpu-1g_x16_capacity_2025-10.csv"


def pooled(trace: SpotTrace, nodes: int) -> tuple[list[int], float]:
    """The 0/1 availability of an N-node gang, pooled to >= POOL_BELOW_S ticks."""
    avail = trace.available(nodes)
    factor = max(1, round(POOL_BELOW_S / trace.gap_s)) if trace.gap_s < POOL_BELOW_S else 1
    if factor == 1:
        return avail, trace.gap_s
    return [min(avail[i : i + factor]) for i in range(0, len(avail) - factor + 1, factor)], trace.gap_s * factor


def all_traces(root: Path) -> list[tuple[str, str, list[int], float]]:
    """(label, cloud, availability, tick_s) for every AWS V100 and GCP H100 trace."""
    out = []
    groups = [
        ("availability/1-node/aws-02-15-2023", "*_v100_1.json", 1),
        ("availability/1-node/aws-10-26-2022", "*_v100_*.json", 1),
        ("availability/16-node/aws-08-27-2023", "*_v100_1.json", 16),
        ("preemption/1-node/aws-04-22-2023", "*_v100_1.json", 1),
        ("preemption/4-node/aws-08-03-2023", "*_v100_1.json", 4),
    ]
    for folder, pattern, nodes in groups:
        for path in sorted((root / folder).glob(pattern)):
            avail, tick_s = pooled(load_trace(path), nodes)
            out.append((f"{folder.split('/')[-1]}/{path.stem} x{nodes}", "aws", avail, tick_s))
    for zone in trace_zones(root / H100_CSV):
        avail, tick_s = pooled(load_trace(root / H100_CSV, zone=zone), 1)
        out.append((f"gcp-h100/{zone}", "gcp", avail, tick_s))
    return out


def starts_for(n_ticks: int, tick_s: float, deadline_h: float, count: int) -> list[int]:
    room = n_ticks - int(deadline_h * 3600 / tick_s) - 1
    if room <= 0:
        return []
    return sorted({int(room * (i + 0.5) / count) for i in range(count)})


def run_case(avail, tick_s, k_ratio, job, starts):
    """Costs relative to on-demand for each policy and the optimum over the start points."""
    prices = Prices(spot_usd_per_node_hour=1.0, on_demand_usd_per_node_hour=k_ratio)
    policies: list[Policy] = [Greedy(), UniformProgress(), ExpectedSpot(price_ratio=k_ratio)]
    grids = [make_grid(job, avail, tick_s=tick_s, start_tick=s) for s in starts]
    rows: dict[str, list[float]] = {p.name: [] for p in policies}
    misses = {p.name: 0 for p in policies}
    for grid in grids:
        base = on_demand_only(grid, prices).cost_usd
        for p in policies:
            out = simulate(p, grid, prices)
            rows[p.name].append(out.cost_usd / base)
            misses[p.name] += not out.deadline_met
    g0 = grids[0]
    opt = optimal_costs(
        np.array([g.available for g in grids], dtype=bool),
        compute_steps=g0.compute_steps,
        deadline_steps=g0.deadline_steps,
        changeover_steps=g0.changeover_steps,
        spot_step=g0.dt_h,
        od_step=k_ratio * g0.dt_h,
    )
    rows["optimum"] = [c / on_demand_only(g, prices).cost_usd for c, g in zip(opt, grids, strict=True)]
    return rows, misses


def pct(values, q):
    return float(np.percentile(np.array(values), q)) if values else float("nan")


def summary_table(results) -> None:
    names = ("greedy", "uniform_progress", "skygreen", "optimum")
    up, opt = results["uniform_progress"], results["optimum"]
    print(
        f"{'policy':<17} {'cost/OD mean':>12} {'p90':>6} {'misses':>6} {'vs UP mean':>10} {'vs UP p90':>9} {'vs opt mean':>11} {'vs opt p90':>10}"
    )
    for name in names:
        costs = results[name]
        vs_up = [c / u for c, u in zip(costs, up, strict=True)]
        vs_opt = [c / o for c, o in zip(costs, opt, strict=True)]
        miss = results.get(f"{name}:misses", 0)
        print(
            f"{name:<17} {statistics.fmean(costs):12.3f} {pct(costs, 90):6.3f} {miss:6d} {statistics.fmean(vs_up):10.3f} "
            f"{pct(vs_up, 90):9.3f} {statistics.fmean(vs_opt):11.3f} {pct(vs_opt, 90):10.3f}"
        )


def grid_benchmark(traces, n_starts: int) -> dict:
    results: dict = {"greedy": [], "uniform_progress": [], "skygreen": [], "optimum": []}
    by_slack: dict = {}
    cases = 0
    for _label, cloud, avail, tick_s in traces:
        for slack in SLACKS:
            starts = starts_for(len(avail), tick_s, slack * COMPUTE_H, n_starts)
            if not starts:
                continue
            for d in CHANGEOVERS_H:
                job = Job(compute_h=COMPUTE_H, deadline_h=slack * COMPUTE_H, changeover_h=d)
                rows, misses = run_case(avail, tick_s, PRICE_RATIO[cloud], job, starts)
                cases += len(starts)
                for name, values in rows.items():
                    results[name].extend(values)
                    by_slack.setdefault((slack, name), []).extend(values)
                for name, m in misses.items():
                    results[f"{name}:misses"] = results.get(f"{name}:misses", 0) + m
    results["cases"] = cases
    results["by_slack"] = by_slack
    return results


def paper_setting(root: Path) -> None:
    trace = load_trace(root / "preemption/1-node/aws-04-22-2023/us-west-2b_v100_1.json")
    avail, tick_s = pooled(trace, 1)
    k_ratio = PRICE_RATIO["aws"]
    for deadline_h in (84.0, 100.0):
        job = Job(compute_h=72.0, deadline_h=deadline_h, changeover_h=0.3)
        room_h = len(avail) * tick_s / 3600 - deadline_h
        starts = [int(h * 3600 / tick_s) for h in np.arange(0.0, room_h, 4.0)]
        rows, misses = run_case(avail, tick_s, k_ratio, job, starts)
        parts = ", ".join(f"{name} {1 - statistics.fmean(v):.0%}" for name, v in rows.items())
        print(
            f"  C 72 h, R {deadline_h:g} h, d 0.3 h, {len(starts)} starts: savings vs on-demand: {parts}; "
            f"misses {sum(misses.values())}"
        )


US_H100_ZONES = ("us-central1-a", "us-central1-b", "us-central1-c", "us-east4-a", "us-east4-b", "us-east5-a",
                 "us-west1-a", "us-west1-b")  # fmt: skip


def multizone(root: Path, n_starts: int) -> None:
    """Gangs of 16 H100s: each US zone alone vs free to move between the 8 US zones."""
    path = root / H100_CSV
    series = [load_trace(path, zone=z).available(16) for z in US_H100_ZONES]
    tick_s = load_trace(path, zone=US_H100_ZONES[0]).gap_s
    k_ratio = PRICE_RATIO["gcp"]
    prices = Prices(spot_usd_per_node_hour=1.0, on_demand_usd_per_node_hour=k_ratio)
    for slack in (1.25, 2.0):
        job = Job(compute_h=24.0, deadline_h=24.0 * slack, changeover_h=0.3)
        starts = starts_for(len(series[0]), tick_s, job.deadline_h, n_starts)
        policies: list[Policy] = [Greedy(), UniformProgress(), ExpectedSpot(price_ratio=k_ratio)]
        alone: dict[str, list[float]] = {p.name: [] for p in policies}
        moving: dict[str, list[float]] = {p.name: [] for p in policies}
        for s in starts:
            for avail in series:
                grid = make_grid(job, avail, tick_s=tick_s, start_tick=s)
                base = on_demand_only(grid, prices).cost_usd
                for p in policies:
                    alone[p.name].append(simulate(p, grid, prices).cost_usd / base)
            grid = make_multizone_grid(job, series, tick_s=tick_s, start_tick=s)
            base = on_demand_only(grid, prices).cost_usd
            for p in policies:
                out = simulate(p, grid, prices)
                assert out.deadline_met
                moving[p.name].append(out.cost_usd / base)
        cells = ", ".join(f"{n} {statistics.fmean(alone[n]):.3f} -> {statistics.fmean(moving[n]):.3f}" for n in alone)
        print(f"  C 24 h, slack {slack:g}, d 0.3 h, {len(starts)} starts: cost/OD one zone -> 8 zones: {cells}")


def time_of_day(root: Path) -> None:
    """Spot availability by 6-hour block of the UTC day, from the timestamped traces."""
    blocks = ("00-06", "06-12", "12-18", "18-24")
    print(f"{'zone':<28} " + " ".join(f"{b:>6}" for b in blocks))
    h100 = root / H100_CSV
    with open(h100, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    hours = [datetime.datetime.fromisoformat(r["scheduled_at_utc"].replace("Z", "+00:00")).hour // 6 for r in rows]
    for zone in US_H100_ZONES:
        cells = [[int(r[zone]) >= 16 for r, h in zip(rows, hours, strict=True) if h == b] for b in range(4)]
        print(f"{'gcp H100 x16 ' + zone:<28} " + " ".join(f"{statistics.fmean(c):6.2f}" for c in cells))
    folder = root / "skynomad-artifact/data/real/availability/2023-02-15/processed"
    for path in sorted(folder.glob("*_v100_1.csv")):
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        by_block: list[list[int]] = [[] for _ in range(4)]
        for r in rows:
            by_block[datetime.datetime.fromisoformat(r["date"]).hour // 6].append(int(float(r["availability"])))
        name = "aws V100 " + path.name.split("_")[0]
        print(f"{name:<28} " + " ".join(f"{statistics.fmean(c):6.2f}" for c in by_block))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=TRACES)
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--multizone-only", action="store_true", help="Only the multi-zone comparison.")
    parser.add_argument("--time-of-day", action="store_true", help="Only availability by time of day.")
    args = parser.parse_args()
    began = time.perf_counter()
    if args.time_of_day:
        time_of_day(args.traces)
        return
    if args.multizone_only:
        print("GCP H100 gangs of 16 (2025-10), 8 US zones:")
        multizone(args.traces, args.starts)
        print(f"\n({time.perf_counter() - began:.0f} s)")
        return
    traces = all_traces(args.traces)
    results = grid_benchmark(traces, args.starts)
    print(
        f"{len(traces)} traces x slack {SLACKS} x d {CHANGEOVERS_H} h, C {COMPUTE_H:g} h, "
        f"up to {args.starts} starts each: {results['cases']} runs per policy"
    )
    summary_table(results)
    print("\nmean cost / on-demand by slack (R / C):")
    print(f"{'slack':>5} " + " ".join(f"{n:>16}" for n in ("greedy", "uniform_progress", "skygreen", "optimum")))
    for slack in SLACKS:
        cells = [
            statistics.fmean(results["by_slack"].get((slack, n), [float("nan")]))
            for n in ("greedy", "uniform_progress", "skygreen", "optimum")
        ]
        print(f"{slack:5.2f} " + " ".join(f"{c:16.3f}" for c in cells))
    print("\nthe paper's ML setting on AWS p3.2xlarge us-west-2b (2023-04 preemption trace):")
    paper_setting(args.traces)
    print("\nGCP H100 gangs of 16 (2025-10), 8 US zones:")
    multizone(args.traces, args.starts)
    print(f"\n({time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
