"""Regenerate skygreen/data/deadline_spot_share.csv from the real spot traces.

    .venv/bin/python scripts/make_deadline_table.py ../shared/spot-traces > skygreen/data/deadline_spot_share.csv

The planner prices a spot offer under a deadline as the mix of spot and on-demand hours that
skygreen's deadline policy (`skygreen.deadline.policy.ExpectedSpot`) ends up buying. Where real
traces exist for the GPU, that mix is measured here, once, by replaying the policy: AWS V100
(p3.2xlarge: the 2-month and 2022-10 availability probes and the 2023-04 preemption traces, 15
zones) and GCP H100 (a3-highgpu-1g, 13 zones, 2025-10). For each slack R/C and changeover d,
a job of C = 24 h from 6 start points per zone spread over the trace: mean spot hours, on-demand
hours and finish time, each per compute hour. The traces themselves are not shipped (no licence
for the spot-traces files); these few numbers are.
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

from skygreen.deadline.policy import ExpectedSpot, Job
from skygreen.deadline.simulate import Prices, make_grid, simulate
from skygreen.plan.replay import load_trace, trace_zones

COMPUTE_H = 24.0
SLACKS = (1.1, 1.25, 1.5, 2.0, 3.0)
CHANGEOVERS_H = (0.1, 0.2, 0.3, 0.5)
STARTS = 6
PRICE_RATIO = {"aws": 3.06 / 0.918, "gcp": 4.35}


def zones(root: Path) -> list[tuple[str, str, list[int], float]]:
    """(cloud, accelerator, 0/1 availability, tick_s) per zone trace."""
    out = []
    for folder in (
        "availability/1-node/aws-02-15-2023",
        "availability/1-node/aws-10-26-2022",
        "preemption/1-node/aws-04-22-2023",
    ):
        for path in sorted((root / folder).glob("*_v100_1.json")):
            trace = load_trace(path)
            out.append(("aws", "V100", trace.available(1), trace.gap_s))
    csv_path = root / "derived" / "gcp_h100_a3-highgpu-1g_x16_capacity_2025-10.csv"
    for zone in trace_zones(csv_path):
        trace = load_trace(csv_path, zone=zone)
        out.append(("gcp", "H100", trace.available(1), trace.gap_s))
    return out


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared" / "spot-traces"
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(["cloud", "accelerator", "slack", "changeover_h", "spot_h_per_compute_h",
                     "on_demand_h_per_compute_h", "finish_h_per_compute_h", "runs"])  # fmt: skip
    traces = zones(root)
    for cloud, accelerator in sorted({(c, a) for c, a, _, _ in traces}):
        mine = [(avail, tick) for c, a, avail, tick in traces if (c, a) == (cloud, accelerator)]
        for slack in SLACKS:
            for d in CHANGEOVERS_H:
                job = Job(compute_h=COMPUTE_H, deadline_h=slack * COMPUTE_H, changeover_h=d)
                policy = ExpectedSpot(price_ratio=PRICE_RATIO[cloud])
                prices = Prices(spot_usd_per_node_hour=1.0, on_demand_usd_per_node_hour=PRICE_RATIO[cloud])
                spot, od, finish = [], [], []
                for avail, tick in mine:
                    room = len(avail) - int(job.deadline_h * 3600 / tick) - 1
                    for i in range(STARTS):
                        out = simulate(
                            policy,
                            make_grid(job, avail, tick_s=tick, start_tick=int(room * (i + 0.5) / STARTS)),
                            prices,
                        )
                        assert out.deadline_met and out.finish_h is not None
                        spot.append(out.spot_h / COMPUTE_H)
                        od.append(out.on_demand_h / COMPUTE_H)
                        finish.append(out.finish_h / COMPUTE_H)
                writer.writerow([cloud, accelerator, slack, d, f"{statistics.fmean(spot):.4f}", f"{statistics.fmean(od):.4f}",
                                 f"{statistics.fmean(finish):.4f}", len(spot)])  # fmt: skip


if __name__ == "__main__":
    main()
