"""A run is paid from its VM's first second: `skygreen cost RUN` on a run launched but not yet
training answers what is known (state, time paid so far, estimated spend) with exit 0.

The cloud edge is `skygreen.testing.FakeLauncher` (its job reports a run time and where it
landed, as SkyPilot's queue does); the bucket is a real S3 (moto) with no ledger in it yet.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import cloud_task, fake_cloud_env
from skygreen.testing import FakeLauncher

REPO = Path(__file__).resolve().parents[1]
CATALOG = str(REPO / "tests" / "data" / "catalog" / "v8")
SKYGREEN = [sys.executable, "-m", "skygreen.cli"]


@pytest.fixture
def env(private_home, tmp_path, s3_bucket) -> dict[str, str]:
    return fake_cloud_env(private_home, tmp_path / "fake-sky")


def skygreen(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SKYGREEN, *args], env=env, capture_output=True, text=True, timeout=120, cwd=REPO)


def test_cost_of_a_run_still_setting_up_says_what_is_known(env, tmp_path, s3_bucket):
    task = cloud_task(tmp_path, s3_bucket)
    up = skygreen(env, "up", str(task), "--no-smoke", "--catalog", CATALOG)
    assert up.returncode == 0, up.stderr
    (run,) = json.loads(skygreen(env, "status", "--json").stdout)
    run_id = run["run_id"]
    offers = json.loads((Path(env["XDG_DATA_HOME"]) / "skygreen" / "runs" / run_id / "run.json").read_text())[
        "plan_summary"
    ]["offers"]
    landed = offers[0]
    # four minutes of setup and restore on a paid VM; the runtime has not written its ledger yet
    FakeLauncher(env["SKYGREEN_FAKE_LAUNCHER_DIR"]).set_state(
        "1", "RUNNING", duration_s=240.0, cloud=landed["cloud"], region=landed["region"]
    )

    shown = skygreen(env, "cost", run_id)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"run {run_id}: RUNNING, launch 1 started ")
    assert "no ledger yet: the runtime writes it when training starts" in shown.stdout
    assert "paid so far: 4.0 min (the launcher's run time)" in shown.stdout
    as_json = skygreen(env, "cost", run_id, "--json")
    assert as_json.returncode == 0, as_json.stderr
    known = json.loads(as_json.stdout)
    price = landed["spot_price_usd_per_hour"] if landed.get("spot") else landed["on_demand_price_usd_per_hour"]
    assert known["state"] == "RUNNING" and known["ledger"] is None and known["paid_s"] == 240.0
    assert known["spend_usd"] == pytest.approx(price * 240.0 / 3600.0)
    assert f"spend so far: ${known['spend_usd']:.4f}" in shown.stdout
