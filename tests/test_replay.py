"""The spot trace replay, and the cost model's preemption rates checked against real traces."""

from __future__ import annotations

import csv
import json

import pytest

from skygreen.checkpoint.interval import PREEMPTION_RATE_PER_HOUR
from skygreen.gpus import GPUS
from skygreen.plan.cost import RunModel, estimate
from skygreen.plan.replay import alive_runs_s, replay_run, trace_stats

# -- the replay on hand-made traces ---------------------------------------------------------


def test_alive_runs_and_stats():
    ticks = [0, 1, 1, 1, 0, 0, 1, 1, 0, 1]
    assert alive_runs_s(ticks, 10.0) == [30.0, 20.0, 10.0]
    stats = trace_stats(ticks, 3600.0)
    assert (stats.alive_hours, stats.preemptions) == (6.0, 2)  # the cut-off last run is no preemption
    assert stats.preemptions_per_alive_hour == pytest.approx(2 / 6)


def test_a_run_that_fits_one_lifetime_pays_its_saves_only():
    result = replay_run([1000.0], work_s=300.0, interval_s=100.0, save_s=5.0, restart_s=60.0)
    assert (result.billed_s, result.preemptions) == (300.0 + 2 * 5.0, 0)  # no save after the last chunk


def test_a_preemption_loses_the_work_since_the_last_commit_and_pays_a_restart():
    # Lifetime 1 (250 s): compute 100, save 5, compute 100, save 5, compute 40 -> preempted, 40 lost.
    # Lifetime 2: restart 60, then the remaining 100 s of compute.
    result = replay_run([250.0, 1000.0], work_s=300.0, interval_s=100.0, save_s=5.0, restart_s=60.0)
    assert result.preemptions == 1
    assert result.billed_s == 250.0 + 60.0 + 100.0


def test_starting_at_another_lifetime_wraps_around():
    result = replay_run([250.0, 1000.0], work_s=300.0, interval_s=100.0, save_s=5.0, restart_s=60.0, first=1)
    assert (result.billed_s, result.preemptions) == (310.0, 0)


def test_lifetimes_too_short_to_progress_are_an_error():
    with pytest.raises(ValueError, match="no progress"):
        replay_run([50.0], work_s=300.0, interval_s=100.0, save_s=5.0, restart_s=60.0)


# -- the model's defaults against the real traces -------------------------------------------


def aws_v100_traces(traces_dir):
    files = sorted((traces_dir / "preemption" / "1-node" / "aws-04-22-2023").glob("*_v100_1.json"))
    assert len(files) == 4
    return [(json.loads(f.read_text()), f.name) for f in files]


def test_the_aws_rate_is_the_pooled_rate_of_the_real_v100_preemption_traces(shared_traces_dir):
    stats = [trace_stats(d["data"], d["metadata"]["gap_seconds"]) for d, _ in aws_v100_traces(shared_traces_dir)]
    pooled = sum(s.preemptions for s in stats) / sum(s.alive_hours for s in stats)
    assert PREEMPTION_RATE_PER_HOUR["aws"] == pytest.approx(pooled, abs=0.01)


def test_the_gcp_rate_is_the_pooled_rate_of_the_real_h100_probes(shared_traces_dir):
    with open(shared_traces_dir / "derived" / "gcp_h100_gang_summary.csv") as f:
        zones = [row for row in csv.DictReader(f) if row["gang_threshold"] == "1"]
    events = sum(int(z["avail_to_unavail_events"]) for z in zones)
    alive_h = sum(float(z["span_hours"]) * float(z["frac_available"]) for z in zones)
    assert len(zones) == 13
    assert PREEMPTION_RATE_PER_HOUR["gcp"] == pytest.approx(events / alive_h, abs=0.01)


@pytest.mark.parametrize("work_h", [4.0, 48.0])
def test_the_models_spot_hours_match_a_replay_over_the_real_aws_traces(shared_traces_dir, work_h):
    """Expected wall hours of a V100 run under the model vs the mean over every start point of
    the four real AWS V100 traces, with the model's own interval, save cost and restart time."""
    model = RunModel(work_gpu_hours=work_h * GPUS["V100"].relative_speed, work_on="A100")
    est = estimate(model, cloud="aws", gpu="V100", gpus_per_node=1, spot=True)
    assert est is not None and est.checkpoint_interval_s is not None
    replayed = []
    for data, _ in aws_v100_traces(shared_traces_dir):
        lifetimes = alive_runs_s(data["data"], data["metadata"]["gap_seconds"])
        for first in range(len(lifetimes)):
            run = replay_run(
                lifetimes,
                work_s=est.compute_hours * 3600.0,
                interval_s=est.checkpoint_interval_s,
                save_s=model.checkpoint_cost_s,
                restart_s=model.restart_s,
                first=first,
            )
            replayed.append(run.billed_s / 3600.0)
    mean_h = sum(replayed) / len(replayed)
    assert est.est_hours > est.compute_hours  # spot costs something
    assert est.est_hours == pytest.approx(mean_h, rel=0.06)
