"""The cost model's spot overhead against replays over real preemption traces.

    .venv/bin/python benchmarks/bench_spot_model.py [--traces ../shared/spot-traces]

For V100 runs of several sizes on AWS spot, the planner's expected wall hours
(`skygreen.plan.cost.estimate`: preemption rate per alive hour, restart, half an interval lost,
Daly's interval) beside the mean billed hours of the same run replayed (`skygreen.replay`)
from every start point of the four real AWS p3.2xlarge preemption traces (2023-04, one week
each), with the model's own interval, save cost and restart time. Also the same with the
rate skygreen assumed before it was derived from these traces (0.25 per hour), for contrast.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from skygreen.checkpoint.interval import PREEMPTION_RATE_PER_HOUR
from skygreen.gpus import GPUS
from skygreen.plan.cost import RunModel, estimate
from skygreen.plan.replay import alive_runs_s, replay_run, trace_stats

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "spot-traces"
WORK_HOURS = (1.0, 4.0, 12.0, 48.0)


def load(traces: Path) -> dict[str, tuple[list[int], float]]:
    folder = traces / "preemption" / "1-node" / "aws-04-22-2023"
    out = {}
    for path in sorted(folder.glob("*_v100_1.json")):
        data = json.loads(path.read_text())
        out[path.name.split("_")[0]] = (data["data"], float(data["metadata"]["gap_seconds"]))
    return out


def replayed_hours(traces, model: RunModel, est) -> dict[str, float]:
    per_zone = {}
    for zone, (ticks, gap_s) in traces.items():
        lifetimes = alive_runs_s(ticks, gap_s)
        runs = [
            replay_run(lifetimes, work_s=est.compute_hours * 3600.0, interval_s=est.checkpoint_interval_s,
                       save_s=model.checkpoint_cost_s, restart_s=model.restart_s, first=first).billed_s / 3600.0
            for first in range(len(lifetimes))
        ]  # fmt: skip
        per_zone[zone] = statistics.fmean(runs)
    return per_zone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=TRACES)
    args = parser.parse_args()
    traces = load(args.traces)
    for zone, (ticks, gap_s) in traces.items():
        s = trace_stats(ticks, gap_s)
        print(
            f"{zone}: {s.preemptions} preemptions in {s.alive_hours:.1f} alive h = {s.preemptions_per_alive_hour:.2f}/h"
        )
    print()
    print(
        f"{'rate/h':>6} {'work h':>6} {'interval min':>12} {'model h':>8} {'replay h':>9} {'model/replay':>12}  replay per zone"
    )
    for rate in (PREEMPTION_RATE_PER_HOUR["aws"], 0.25):
        for work_h in WORK_HOURS:
            model = RunModel(
                work_gpu_hours=work_h * GPUS["V100"].relative_speed, preemption_rate_per_hour={"aws": rate}
            )
            est = estimate(model, cloud="aws", gpu="V100", gpus_per_node=1, spot=True)
            assert est is not None and est.checkpoint_interval_s is not None
            per_zone = replayed_hours(traces, model, est)
            mean_h = statistics.fmean(per_zone.values())
            zones = " ".join(f"{h:.2f}" for h in per_zone.values())
            print(f"{rate:>6.2f} {work_h:>6.0f} {est.checkpoint_interval_s / 60:>12.1f} {est.est_hours:>8.2f} "
                  f"{mean_h:>9.2f} {est.est_hours / mean_h:>12.3f}  {zones}")  # fmt: skip


if __name__ == "__main__":
    main()
