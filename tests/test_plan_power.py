"""The plan's energy and carbon take the task's power cap into account, and it says what a
night start would save; through the real `skygreen plan --json` command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from skygreen.plan.cost import RunModel, estimate
from skygreen.power.model import model_energy_ratio, planned_energy_ratio

CATALOG = Path(__file__).resolve().parent / "data" / "catalog" / "v8"


def plan_json(tmp_path: Path, power: str) -> dict:
    task = tmp_path / f"task-{abs(hash(power))}.yaml"
    task.write_text(f"skygreen: {{gpus: [L4, T4, A100], power: {power}}}\nrun: python train.py\n")
    out = subprocess.run(
        [sys.executable, "-m", "skygreen.cli", "plan", str(task), "--catalog", str(CATALOG), "--json"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def by_offer(plan: dict) -> dict:
    return {(c["cloud"], c["region"], c["instance_type"], c["spot"]): c for c in plan["candidates"]}


def test_a_cap_lowers_the_plans_energy_and_carbon_by_the_models_ratio(tmp_path):
    off, capped, auto = (by_offer(plan_json(tmp_path, p)) for p in ("{cap: off}", "{cap: 0.6}", "{cap: auto}"))
    assert off.keys() == capped.keys()
    for key, c in off.items():
        assert capped[key]["energy_kwh"] == pytest.approx(c["energy_kwh"] * 0.863, rel=1e-9)
        assert capped[key]["co2e_kg"] == pytest.approx(c["co2e_kg"] * 0.863, rel=1e-9)
        assert capped[key]["est_cost_usd"] == c["est_cost_usd"]  # the slowdown is left to the runtime's profile
        assert auto[key]["energy_kwh"] < c["energy_kwh"]


def test_the_plan_says_what_a_night_start_would_save(tmp_path):
    plan = plan_json(tmp_path, "{cap: 0.6}")
    best = plan["candidates"][0]
    assert plan["night_hint"].startswith(f"Can it wait? Started at night in {best['region']}")
    assert "10%-33%" in plan["night_hint"] and "arXiv 2205.09646" in plan["night_hint"]
    assert any("power cap's ratio (cap 0.6 of the default limit" in a for a in plan["assumptions"])


def test_planned_ratio_by_cap_mode():
    assert planned_energy_ratio("off", None, tdp_w=300) == 1.0
    assert planned_energy_ratio("fraction", 0.6, tdp_w=300) == pytest.approx(0.863)
    assert planned_energy_ratio("watts", 180, tdp_w=300) == pytest.approx(0.863)
    assert planned_energy_ratio("watts", 50, tdp_w=300) == model_energy_ratio(0.4)  # clamped to the board's minimum
    assert 0.8 < planned_energy_ratio("auto", None, tdp_w=300) < 0.9
    model = RunModel(work_gpu_hours=10, power_cap_mode="fraction", power_cap_value=0.6)
    base = RunModel(work_gpu_hours=10)
    capped = estimate(model, cloud="gcp", gpu="A100", gpus_per_node=1, spot=False)
    uncapped = estimate(base, cloud="gcp", gpu="A100", gpus_per_node=1, spot=False)
    assert capped is not None and uncapped is not None
    assert capped.energy_kwh == pytest.approx(uncapped.energy_kwh * 0.863) and capped.est_hours == uncapped.est_hours
