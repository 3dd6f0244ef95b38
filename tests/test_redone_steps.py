"""Honest figures after a kill -9, through the real `skygreen` command and a real local run of
tasks/tiny.py: the killed VM's time past its last checkpoint is billed, the steps it trained
past that checkpoint count as redone in what the preemption cost, and `status` and `cost`
agree on the preemptions and on the checkpoint's step.

The run is held at step 30 (a checkpoint first), released, and killed once its ledger heartbeat
shows it well past 30; with checkpoints an hour apart none can land in between.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import user_env, wait_for
from skygreen.checkpoint.local_store import LocalStore
from skygreen.ledger import read_ledger
from skygreen.runtime.hold import HOLD_ENV, RELEASE_ENV

REPO = Path(__file__).resolve().parents[1]
SKYGREEN = [sys.executable, "-m", "skygreen.cli"]

pytestmark = pytest.mark.slow


def skygreen(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SKYGREEN, *args], env=env, capture_output=True, text=True, timeout=300, cwd=REPO)


def status(env, run_id: str) -> dict:
    out = skygreen(env, "status", run_id, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_kill_between_checkpoints_counts_the_redone_steps_and_the_time(private_home, tmp_path):
    spec = yaml.safe_load((REPO / "tasks" / "tiny.yaml").read_text())
    spec["skygreen"]["checkpoint"] = {"every": "1h", "keep": 3, "bucket": str(tmp_path / "bucket")}
    spec["skygreen"].pop("early_stopping", None)
    spec["workdir"] = str(REPO / "tasks")
    task = tmp_path / "tiny.yaml"
    task.write_text(yaml.safe_dump(spec))
    release = tmp_path / "release"
    release.mkdir()
    env = user_env(private_home, TINY_STEPS="120", SKYGREEN_LEDGER_HEARTBEAT_S="0.2")
    held = {**env, HOLD_ENV: "30", RELEASE_ENV: str(release)}
    up = skygreen(held, "up", str(task), "--local", "--no-smoke", "--detach")
    assert up.returncode == 0, up.stderr
    (run,) = json.loads(skygreen(env, "status", "--json").stdout)
    run_id = run["run_id"]
    store = LocalStore(str(tmp_path / "bucket" / run_id))

    def at_30():
        s = status(env, run_id)
        assert s["state"] == "RUNNING", f"the run ended ({s['state']}) before step 30"
        return s["step"] == 30

    wait_for(at_30, "the checkpoint at step 30")
    (release / "30").touch()

    def past_45():
        assert status(env, run_id)["state"] == "RUNNING", "the run ended before it could be killed"
        segments = read_ledger(store)
        return segments and (segments[-1].reached_step or 0) >= 45

    wait_for(past_45, "the ledger's heartbeat past step 45")
    pid = json.loads((Path(env["XDG_DATA_HOME"]) / "skygreen" / "runs" / run_id / "run.json").read_text())
    os.killpg(pid["launches"][-1]["pid"], signal.SIGKILL)
    wait_for(lambda: status(env, run_id)["state"] == "STOPPED", "the run to read as stopped")
    assert status(env, run_id)["step"] == 30  # the only checkpoint

    resumed = skygreen(env, "resume", run_id)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    done = status(env, run_id)
    assert done["state"] == "SUCCEEDED" and done["completed"]
    cost = json.loads(skygreen(env, "cost", run_id, "--json").stdout)
    killed, finished = cost["segments"]
    assert killed["end"] == "killed" and killed["step"] == 30 and killed["reached_step"] >= 45
    assert finished["start_step"] == 30
    assert done["preemptions"] == cost["preemptions"] == 1  # status and cost agree after a SIGKILL
    first, second = read_ledger(store)
    assert killed["duration_s"] == pytest.approx(first.duration_s)  # billed to its last heartbeat
    assert first.updated_at > first.first_step_at  # which came after its training started
    redone = first.reached_step - 30
    assert cost["lost_s"] == pytest.approx(second.startup_s + redone / first.steps_per_s)
    assert redone >= 15 and cost["lost_s"] > second.startup_s  # the redone steps count, not just the restart
