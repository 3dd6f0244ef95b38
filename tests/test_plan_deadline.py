"""Planning under a deadline: `deadline:` and `plan --deadline`, offers too slow dropped (and why
when none is left), spot priced with its on-demand fallback from traces or the model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skygreen.deadline.cost import DeadlineCost, Share, share_at, trace_shares, under_deadline
from skygreen.errors import SpecError
from skygreen.task.spec import parse_spec_text

FIXTURE_CATALOG = Path(__file__).resolve().parent / "data" / "catalog" / "v8"
TASK = "skygreen:\n  gpus: [V100, L4, H100]\n  work: {gpu_hours: 20, gpu: A100}\n{extra}run: python train.py\n"


def skygreen(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKY_", "SKYPILOT_", "SKYGREEN_"))}
    env.update(HOME=str(cwd), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "skygreen.cli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120)  # fmt: skip


def plan_json(tmp_path: Path, *flags: str, extra: str = "") -> subprocess.CompletedProcess:
    path = tmp_path / "task.yaml"
    path.write_text(TASK.replace("{extra}", extra))
    return skygreen(tmp_path, "plan", str(path), "--catalog", str(FIXTURE_CATALOG), "--json", *flags)


def test_without_a_deadline_every_offer_shows_its_wall_time_and_slow_ones_stay(tmp_path):
    out = plan_json(tmp_path)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["candidates"]
    assert all(r["est_hours"] > 0 for r in rows)
    assert max(r["est_hours"] for r in rows) > 50  # the L4 takes days


def test_a_deadline_drops_the_offers_that_cannot_make_it_and_prices_the_fallback(tmp_path):
    slow = json.loads(plan_json(tmp_path).stdout)["candidates"]
    out = plan_json(tmp_path, "--deadline", "60h")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    rows = plan["candidates"]
    assert rows and all(r["est_hours"] <= 60 for r in rows)
    assert len(rows) < len(slow)
    assert not any(r["accelerator"] == "L4" for r in rows)
    v100 = [r for r in rows if r["accelerator"] == "V100" and r["spot"] and r["cloud"] == "aws"]
    assert v100 and all(r["deadline_source"] == "traces" for r in v100)
    line = next(line for line in plan["assumptions"] if "deadline 60 h" in line)
    assert "does not yet move" not in line and "`skygreen up --deadline` moves the run" in line  # it does now
    # the same deadline from the task file
    same = plan_json(tmp_path, extra="  deadline: 60h\n")
    assert json.loads(same.stdout)["candidates"] == rows


def test_no_offer_in_time_exits_2_with_the_fastest_and_the_deadline_it_needs(tmp_path):
    out = plan_json(tmp_path, "--deadline", "2h")
    assert out.returncode == 2
    assert "skygreen.deadline: no offer can finish within 2 h" in out.stderr
    assert "fix: set a deadline of at least" in out.stderr and "Traceback" not in out.stderr
    assert out.stdout == ""


def test_a_bad_deadline_is_an_input_error(tmp_path):
    out = plan_json(tmp_path, "--deadline", "tomorrow")
    assert out.returncode == 2 and "--deadline" in out.stderr and "36h" in out.stderr
    with pytest.raises(SpecError, match=r"skygreen\.deadline"):
        parse_spec_text("skygreen: {deadline: -3h}\nrun: x\n")
    assert parse_spec_text("skygreen: {deadline: 90m}\nrun: x\n").green.deadline == 1.5


def test_spot_with_traces_costs_between_all_spot_and_all_on_demand():
    def v100(deadline_h: float) -> DeadlineCost | tuple[float, str]:
        return under_deadline(cloud="aws", accelerator="V100", spot=True, compute_h=24.0, spot_wall_h=30.0,
                              changeover_h=0.2, deadline_h=deadline_h, spot_price=1.0, on_demand_price=3.0, nodes=1)  # fmt: skip

    tight, loose = v100(27.0), v100(72.0)
    assert not isinstance(tight, tuple) and not isinstance(loose, tuple)
    assert tight.source == loose.source == "traces"
    assert 24.0 < loose.est_cost_usd < tight.est_cost_usd < 3.0 * 24.4
    assert tight.est_hours <= 27.0 and loose.est_hours <= 72.0
    assert isinstance(v100(24.3), tuple)  # C + 2d > R


def test_spot_without_traces_uses_the_model_and_buys_the_shortfall_on_demand():
    def l4(deadline_h: float) -> DeadlineCost | tuple[float, str]:
        return under_deadline(cloud="azure", accelerator="L4", spot=True, compute_h=20.0, spot_wall_h=25.0,
                              changeover_h=0.1, deadline_h=deadline_h, spot_price=1.0, on_demand_price=3.0, nodes=2)  # fmt: skip

    roomy, tight = l4(40.0), l4(22.0)
    assert not isinstance(roomy, tuple) and not isinstance(tight, tuple)
    assert roomy.source == "model" and roomy.on_demand_hours == 0.0 and roomy.est_cost_usd == pytest.approx(50.0)
    # rho = 0.8: 0.8 x spot + on-demand = 20 within 21.9 h -> on-demand 12.4 h, spot 9.5 h (+ one changeover)
    assert tight.on_demand_hours == pytest.approx(12.4 + 0.1)
    assert tight.spot_hours == pytest.approx(21.9 - 12.4)
    assert tight.est_cost_usd == pytest.approx(2 * (9.5 * 1.0 + 12.5 * 3.0))


def test_on_demand_offers_need_compute_plus_one_changeover():
    def on_demand(deadline_h: float) -> DeadlineCost | tuple[float, str]:
        return under_deadline(cloud="aws", accelerator="L4", spot=False, compute_h=10.0, spot_wall_h=10.0,
                              changeover_h=0.5, deadline_h=deadline_h, spot_price=None, on_demand_price=2.0, nodes=1)  # fmt: skip

    assert isinstance(on_demand(10.4), tuple)
    ok = on_demand(10.5)
    assert not isinstance(ok, tuple) and ok.est_cost_usd == pytest.approx(21.0)


def test_the_shipped_share_table_is_sane_and_interpolates_in_slack():
    shares = trace_shares()
    assert set(shares) == {("aws", "V100"), ("gcp", "H100")}
    for rows in shares.values():
        for r in rows:
            assert r.spot + r.on_demand >= 1.0  # at least the compute, plus changeovers
            assert 1.0 <= r.finish <= r.slack + 1e-6
    line = [Share(slack=1.0, changeover_h=0.2, spot=0.2, on_demand=0.9, finish=1.0),
            Share(slack=2.0, changeover_h=0.2, spot=0.8, on_demand=0.3, finish=1.8)]  # fmt: skip
    mid = share_at(line, slack=1.5, changeover_h=0.3)
    assert (mid.spot, mid.on_demand, mid.finish) == pytest.approx((0.5, 0.6, 1.4))
    assert share_at(line, slack=9.0, changeover_h=0.2) == line[-1]


def test_the_shipped_share_table_is_what_the_script_measures_on_the_real_traces(shared_traces_dir):
    """The table must be regenerated whenever the policy or the simulator changes."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "make_deadline_table.py"
    out = subprocess.run(
        [sys.executable, str(script), str(shared_traces_dir)], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr
    shipped = (Path(__file__).resolve().parents[1] / "skygreen" / "data" / "deadline_spot_share.csv").read_text()
    assert out.stdout == shipped
