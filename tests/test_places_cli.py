"""`skygreen simulate` on a multi-region trace (a small H100-shaped folder written here)."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from skygreen.cli import app
from skygreen.errors import InputError


def _h100_folder(root, zones):
    rng = np.random.default_rng(5)
    for zone, (spot, od, up) in zones.items():
        folder = root / f"{zone}_h100_16"
        folder.mkdir(parents=True)
        preempted = (rng.random(120) > up).astype(int).tolist()  # SkyNomad's polarity: 1 = preempted
        doc = {"metadata": {"gap_seconds": 600, "start_time": "2025-10-04T00:10:00+00:00",
                            "price_info": {"price": spot, "on_demand_price": od}}, "data": preempted}  # fmt: skip
        (folder / "full.json").write_text(json.dumps(doc))
    return root


def test_simulate_reports_every_arm_against_the_optimum(tmp_path):
    trace = _h100_folder(tmp_path / "h100", {"us-east4-a": (15.0, 80.0, 0.8), "europe-west1-c": (16.0, 90.0, 0.9)})
    args = ["simulate", str(trace), "--hours", "4h", "--deadline", "6h", "--changeover", "0.2h", "--policy", "all",
            "--windows", "2", "--checkpoint-gb", "50"]  # fmt: skip
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["places"] == ["europe-west1-c", "us-east4-a"] and len(report["windows"]) == 2
    total = report["total"]
    assert set(total) == {"on_demand", "up_mean", "up_best", "skygreen_mean", "skygreen_best", "eager_failover",
                          "nomad", "optimum"}  # fmt: skip
    assert all(row["deadlines_met"] == 2 for row in total.values())
    assert total["optimum"]["over_optimum_mean"] == 1.0 and total["nomad"]["over_optimum_mean"] >= 1.0
    text = CliRunner().invoke(app, args)
    assert text.exit_code == 0 and "nomad" in text.output and "window @tick 36" in text.output
    bad = CliRunner().invoke(app, [*args, "--zone", "mars-1a"])
    assert isinstance(bad.exception, InputError) and "mars-1a" in str(bad.exception)  # `skygreen` exits 2 on it
