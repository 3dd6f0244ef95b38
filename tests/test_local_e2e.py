"""Real local runs of tasks/tiny.yaml through the `skygreen` command, killed with SIGKILL.

An uninterrupted run gives the reference weights digest. A second run of the same task is
followed in the foreground by `skygreen up --local`; that command is killed (training goes
on), then the training process group is killed outright, twice, with `skygreen resume` in
between: the run ends with exactly the reference `model_sha256`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tasks" / "tiny.yaml"
SKYGREEN = [sys.executable, "-m", "skygreen.cli"]

pytestmark = pytest.mark.slow


@pytest.fixture
def env(private_home, tmp_path):
    environ = dict(os.environ)
    environ.update(
        HOME=str(private_home),
        XDG_DATA_HOME=str(private_home / ".local" / "share"),
        OMP_NUM_THREADS="1",
        TINY_STEPS="300",
    )
    for name in ("SKYGREEN_LAUNCHER", "SKYGREEN_DATA_DIR"):
        environ.pop(name, None)
    return environ


def skygreen(env, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*SKYGREEN, *args], env=env, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)


def status(env, run_id: str) -> dict:
    out = skygreen(env, "status", run_id, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def runs(env) -> list[dict]:
    return json.loads(skygreen(env, "status", "--json").stdout)


def wait_for(predicate, what: str, timeout_s: float = 240):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def training_pid(env, run_id: str) -> int:
    data = Path(env["XDG_DATA_HOME"]) / "skygreen" / "runs" / run_id / "run.json"
    return json.loads(data.read_text())["launches"][-1]["pid"]


def kill_training(env, run_id: str) -> None:
    """SIGKILL the whole process group, as losing the machine would."""
    os.killpg(training_pid(env, run_id), signal.SIGKILL)
    wait_for(lambda: status(env, run_id)["state"] == "STOPPED", "the run to read as stopped")


def test_kill_9_at_any_moment_then_resume_ends_with_the_uninterrupted_weights(env):
    reference = skygreen(env, "up", str(TINY), "--local", "--no-smoke")
    assert reference.returncode == 0, reference.stdout[-2000:] + reference.stderr[-2000:]
    (first,) = runs(env)
    assert first["state"] == "SUCCEEDED" and first["completed"] and first["model_sha256"]

    # Follow a new run in the foreground, then kill the following command itself.
    foreground = subprocess.Popen([*SKYGREEN, "up", str(TINY), "--local", "--no-smoke"], env=env, cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    run_id = wait_for(lambda: [r["run_id"] for r in runs(env) if r["run_id"] != first["run_id"]], "the second run")[0]
    first_step = wait_for(lambda: status(env, run_id)["step"], "a first checkpoint")
    foreground.kill()
    foreground.wait(timeout=30)
    later = wait_for(
        lambda: (s := status(env, run_id))["step"] and s["step"] > first_step and s,
        "training to go on without the terminal",
    )
    assert later["state"] == "RUNNING"

    kill_training(env, run_id)
    stopped_at = status(env, run_id)["step"]
    assert stopped_at is not None and not status(env, run_id)["completed"]

    # Resume detached and kill again at once, likely before the next checkpoint commits.
    resumed = skygreen(env, "resume", run_id, "--detach")
    assert resumed.returncode == 0, resumed.stderr
    time.sleep(1.5)
    kill_training(env, run_id)

    final = skygreen(env, "resume", run_id)
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-2000:]
    logged = [int(line.split()[1]) for line in final.stdout.splitlines() if line.startswith("step ")]
    assert logged and logged[0] > stopped_at  # continued from a checkpoint, not from step 0
    done = status(env, run_id)
    assert done["state"] == "SUCCEEDED" and done["completed"]
    assert done["launches"] == 3 and done["recoveries"] == 2
    assert done["step"] == first["step"]
    assert done["model_sha256"] == first["model_sha256"]


def test_cancel_stops_a_local_run_after_a_checkpoint_and_resume_continues(env):
    started = skygreen(env, "up", str(TINY), "--local", "--no-smoke", "--detach")
    assert started.returncode == 0, started.stderr
    (run,) = runs(env)
    run_id = run["run_id"]
    wait_for(lambda: status(env, run_id)["step"], "a first checkpoint")
    cancelled = skygreen(env, "cancel", run_id)
    assert cancelled.returncode == 0, cancelled.stderr
    after = status(env, run_id)
    assert after["state"] == "CANCELLED" and not after["completed"]
    logs = skygreen(env, "logs", run_id)
    assert logs.returncode == 0 and "step" in logs.stdout
    resumed = skygreen(env, "resume", run_id)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert status(env, run_id)["completed"]
