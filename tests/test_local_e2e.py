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

from helpers import user_env, wait_for
from local_runs import status_agrees_with_cost
from skygreen.runtime.hold import HOLD_ENV, RELEASE_ENV

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tasks" / "tiny.yaml"
SKYGREEN = [sys.executable, "-m", "skygreen.cli"]

pytestmark = pytest.mark.slow


@pytest.fixture
def env(private_home, tmp_path):
    return user_env(private_home, TINY_STEPS="300")


def skygreen(env, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*SKYGREEN, *args], env=env, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)


def status(env, run_id: str) -> dict:
    out = skygreen(env, "status", run_id, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def runs(env) -> list[dict]:
    return json.loads(skygreen(env, "status", "--json").stdout)


def run_json(env, run_id: str) -> Path:
    return Path(env["XDG_DATA_HOME"]) / "skygreen" / "runs" / run_id / "run.json"


def training_pid(env, run_id: str) -> int:
    return json.loads(run_json(env, run_id).read_text())["launches"][-1]["pid"]


def kill_training(env, run_id: str) -> None:
    """SIGKILL the whole process group, as losing the machine would."""
    os.killpg(training_pid(env, run_id), signal.SIGKILL)
    wait_for(lambda: status(env, run_id)["state"] == "STOPPED", "the run to read as stopped")


def held(env, release_dir: Path, steps: str) -> dict:
    """The environment with the runtime held at `steps` (a checkpoint first), released by files.

    Holding makes the test deterministic on a loaded machine: the run cannot finish, or move
    on, before the test has acted (`skygreen.runtime.hold`).
    """
    release_dir.mkdir(exist_ok=True)
    return {**env, HOLD_ENV: steps, RELEASE_ENV: str(release_dir)}


def launch_log(env, run_id: str) -> str:
    """The output of the run's latest launch so far."""
    job = json.loads(run_json(env, run_id).read_text())["launches"][-1]["job_id"]
    path = Path(env["XDG_DATA_HOME"]) / "skygreen" / "local-jobs" / job / "output.log"
    return path.read_text(errors="replace") if path.exists() else ""


def wait_for_step(env, run_id: str, step: int) -> dict:
    """The run's status once it is held at `step` (`held`); fails at once if it ended first.

    The checkpoint alone is not enough: the runtime commits it in the background and writes its
    ledger segment beside it, so a kill right after the commit could beat the segment. The log's
    "held at step" line comes after both."""

    def at_step():
        s = status(env, run_id)
        assert s["state"] in ("RUNNING", "PENDING", "STARTING"), f"the run ended ({s['state']}) before step {step}"
        return s if s["step"] == step and f"held at step {step} (" in launch_log(env, run_id) else None

    return wait_for(at_step, f"the run held at step {step}")


def test_kill_9_at_any_moment_then_resume_ends_with_the_uninterrupted_weights(env, tmp_path):
    reference = skygreen(env, "up", str(TINY), "--local", "--no-smoke")
    assert reference.returncode == 0, reference.stdout[-2000:] + reference.stderr[-2000:]
    (first,) = runs(env)
    assert first["state"] == "SUCCEEDED" and first["completed"] and first["model_sha256"]

    # Follow a new run in the foreground, then kill the following command itself.
    release = tmp_path / "release"
    gated = held(env, release, "50,150,250")
    foreground = subprocess.Popen([*SKYGREEN, "up", str(TINY), "--local", "--no-smoke"], env=gated, cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    run_id = wait_for(lambda: [r["run_id"] for r in runs(env) if r["run_id"] != first["run_id"]], "the second run")[0]
    wait_for_step(env, run_id, 50)
    foreground.kill()
    foreground.wait(timeout=120)
    (release / "50").touch()
    later = wait_for_step(env, run_id, 150)  # training went on without the terminal
    assert later["state"] == "RUNNING"

    kill_training(env, run_id)
    stopped_at = status(env, run_id)["step"]
    assert stopped_at == 150 and not status(env, run_id)["completed"]

    # Resume detached and kill again after a moment, likely before the next checkpoint commits;
    # the hold at step 250 keeps the run from finishing first.
    resumed = skygreen(gated, "resume", run_id, "--detach")
    assert resumed.returncode == 0, resumed.stderr
    time.sleep(1.5)
    assert status(env, run_id)["state"] == "RUNNING", "the resumed run ended before it could be killed"
    kill_training(env, run_id)

    (release / "150").touch()
    (release / "250").touch()
    final = skygreen(gated, "resume", run_id)
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-2000:]
    logged = [int(line.split()[1]) for line in final.stdout.splitlines() if line.startswith("step ")]
    assert logged and logged[0] > stopped_at  # continued from a checkpoint, not from step 0
    done = status(env, run_id)
    assert done["state"] == "SUCCEEDED" and done["completed"]
    assert done["launches"] == 3 and done["recoveries"] == 2
    assert done["step"] == first["step"]
    assert done["model_sha256"] == first["model_sha256"]

    # The run ledger: the first VM's segment was killed at (or after) its last checkpoint and
    # the last one completed; a local run costs nothing and gets the clouds' estimate instead.
    cost = json.loads(skygreen(env, "cost", run_id, "--json").stdout)
    ends = [s["end"] for s in cost["segments"]]
    assert ends[0] == "killed" and ends[-1] == "completed" and set(ends[1:-1]) <= {"killed"}
    # no SIGTERM reached the runtime, yet status counts the lost VMs, from the ledger, as cost does
    # (a VM killed before it wrote its segment left no trace in either)
    assert done["preemptions"] == cost["preemptions"] == len(ends) - 1 >= 1
    status_agrees_with_cost(env, run_id, preemptions=done["preemptions"])  # energy, CO2e too
    assert cost["segments"][0]["step"] == stopped_at and cost["segments"][-1]["step"] == done["step"]
    assert cost["total_usd"] == 0.0 == done["spend_usd"] and cost["cloud_estimate"]["estimate"] is True
    assert {s["cloud"] for s in cost["segments"]} == {"local"}


def test_cancel_stops_a_local_run_after_a_checkpoint_and_resume_continues(env, tmp_path):
    started = skygreen(held(env, tmp_path / "release", "100"), "up", str(TINY), "--local", "--no-smoke", "--detach")
    assert started.returncode == 0, started.stderr
    (run,) = runs(env)
    run_id = run["run_id"]
    wait_for_step(env, run_id, 100)  # held there until the cancel's SIGTERM
    cancelled = skygreen(env, "cancel", run_id)
    assert cancelled.returncode == 0, cancelled.stderr
    after = status(env, run_id)
    assert after["state"] == "CANCELLED" and not after["completed"]
    assert after["preemptions"] == 0  # the user's cancel is no preemption
    ended = skygreen(env, "cancel", run_id[:12])  # again, by a prefix: it says so and changes nothing
    assert ended.returncode == 0 and "already ended (CANCELLED" in ended.stdout
    logs = skygreen(env, "logs", run_id)
    assert logs.returncode == 0 and "step" in logs.stdout
    resumed = skygreen(env, "resume", run_id)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    done = status(env, run_id)
    assert done["completed"] and done["preemptions"] == 0
