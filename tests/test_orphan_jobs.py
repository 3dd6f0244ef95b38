"""No orphan jobs: a `skygreen up` killed inside the launcher's launch call leaves no paid job
that `status` does not show and `cancel` cannot reach.

The cloud edge is `skygreen.testing.FakeLauncher`: with `SKYGREEN_FAKE_LAUNCHER_HOLD` its launch
has submitted the job and waits for the answer, as SkyPilot's client does, when the test kills
the real `skygreen up` process. Everything else is the real command.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import cloud_task, fake_cloud_env, wait_for
from skygreen.launch.launcher import launch_name
from skygreen.testing import FakeLauncher

REPO = Path(__file__).resolve().parents[1]
CATALOG = str(REPO / "tests" / "data" / "catalog" / "v8")
SKYGREEN = [sys.executable, "-m", "skygreen.cli"]


@pytest.fixture
def env(private_home, tmp_path, s3_bucket) -> dict[str, str]:
    return fake_cloud_env(private_home, tmp_path / "fake-sky")


def skygreen(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SKYGREEN, *args], env=env, capture_output=True, text=True, timeout=120, cwd=REPO)


def test_up_killed_inside_the_launch_leaves_a_job_that_status_adopts_and_cancel_stops(env, tmp_path, s3_bucket):
    hold = tmp_path / "hold"
    hold.mkdir()
    up = subprocess.Popen([*SKYGREEN, "up", str(cloud_task(tmp_path, s3_bucket)), "--no-smoke", "--catalog", CATALOG],
                          env={**env, "SKYGREEN_FAKE_LAUNCHER_HOLD": str(hold)}, cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        wait_for(lambda: (hold / "launching").exists() or up.poll() is not None, "up inside the launch call")
        assert up.poll() is None, up.communicate()[0]
    finally:
        up.send_signal(signal.SIGKILL)
        up.wait(timeout=60)
    fake = FakeLauncher(env["SKYGREEN_FAKE_LAUNCHER_DIR"])
    (job_id,) = fake._jobs()
    assert fake.job(job_id)["state"] == "PENDING"  # a paid job, submitted before `up` died

    listed = skygreen(env, "status", "--json")
    assert listed.returncode == 0, listed.stderr
    (run,) = json.loads(listed.stdout)
    run_id = run["run_id"]
    assert fake.job(job_id)["name"] == launch_name(run_id, 1) == f"{run_id}-1"
    assert run["job_id"] == job_id and run["launches"] == 1 and run["state"] == "PENDING"  # adopted

    cancelled = skygreen(env, "cancel", run_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"cancelled run {run_id}: CANCELLED" in cancelled.stdout
    assert fake.job(job_id)["state"] == "CANCELLED"


def test_a_skygreen_job_no_record_knows_is_shown_as_such_and_cancel_stops_it(env, tmp_path, s3_bucket):
    fake = FakeLauncher(env["SKYGREEN_FAKE_LAUNCHER_DIR"])
    foreign = launch_name("cloud-20261201-060000-beef", 2)  # launched from another machine, or its record lost
    job_id = fake.launch({"run": "python train.py"}, name=foreign)
    fake.launch({"run": "python other.py"}, name="not-ours")  # not skygreen's: not shown
    ended = fake.launch({"run": "python train.py"}, name=launch_name("cloud-20261201-060000-dead", 1))
    fake.set_state(ended, "SUCCEEDED")  # ended jobs cost nothing: not shown

    listed = skygreen(env, "status")
    assert listed.returncode == 0, listed.stderr
    assert (
        f"unknown skygreen job {foreign} (fake job {job_id}, PENDING): no run record here knows it; "
        f"`skygreen cancel {foreign}` stops it"
    ) in listed.stdout
    assert "not-ours" not in listed.stdout and "dead" not in listed.stdout
    (row,) = json.loads(skygreen(env, "status", "--json").stdout)
    assert row == {"unknown_job": True, "name": foreign, "run_id": "cloud-20261201-060000-beef", "launch": 2,
                   "job_id": job_id, "launcher": "fake", "state": "PENDING"}  # fmt: skip

    cancelled = skygreen(env, "cancel", foreign)
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"cancelled unknown skygreen job {foreign} (fake job {job_id})" in cancelled.stdout
    assert fake.job(job_id)["state"] == "CANCELLED"
    assert "unknown skygreen job" not in skygreen(env, "status").stdout
    nothing = skygreen(env, "cancel", "cloud-20261201-060000-0000")
    assert nothing.returncode == 2 and "no run 'cloud-20261201-060000-0000'" in nothing.stderr
