"""Honest states for a script that never commits a checkpoint, through the real `skygreen` command.

A run whose script does not use the runtime (here `python -c`, no torch) has no checkpoint:
`cancel` must not report the "stopped with a checkpoint" code 75, and `resume` says in one
line (and in `--json`) that it restarts from step 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import user_env, wait_for
from skygreen import exit_codes

REPO = Path(__file__).resolve().parents[1]
SKYGREEN = [sys.executable, "-m", "skygreen.cli"]
SLEEPER = "python -c \"import time; print('started', flush=True); time.sleep(600)\""


@pytest.fixture
def env(private_home):
    return user_env(private_home)


def skygreen(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SKYGREEN, *args], env=env, capture_output=True, text=True, timeout=180, cwd=REPO)


def start_sleeper(env, tmp_path: Path) -> str:
    task = tmp_path / "sleeper.yaml"
    task.write_text(f"name: sleeper\nrun: {json.dumps(SLEEPER)}\n")
    up = skygreen(env, "up", str(task), "--local", "--no-smoke", "--detach")
    assert up.returncode == 0, up.stderr
    (row,) = json.loads(skygreen(env, "status", "--json").stdout)
    run_id = row["run_id"]
    wait_for(lambda: "started" in skygreen(env, "logs", run_id).stdout, "the script to start")
    return run_id


def test_cancel_and_resume_of_a_run_without_a_checkpoint_say_so(env, tmp_path):
    run_id = start_sleeper(env, tmp_path)
    cancelled = skygreen(env, "cancel", run_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"cancelled run {run_id}: CANCELLED, last checkpoint at step -" in cancelled.stdout
    shown = skygreen(env, "status", run_id)
    no_checkpoint = exit_codes.for_outcome("CANCELLED", has_checkpoint=False)
    assert no_checkpoint == exit_codes.FAILED
    assert f"CANCELLED - exit code {no_checkpoint}: stopped with no checkpoint to resume from" in shown.stdout, (
        shown.stdout + shown.stderr
    )
    assert "exit code 75" not in shown.stdout

    resumed = skygreen(env, "resume", run_id, "--detach")
    assert resumed.returncode == 0, resumed.stderr
    lines = resumed.stdout.splitlines()
    assert lines[0].startswith(f"resumed run {run_id} (job {run_id}-2, launch 2)")
    assert lines[1].strip().endswith("yet: the run restarts from step 0") and "no checkpoint in " in lines[1]
    assert skygreen(env, "cancel", run_id).returncode == 0

    as_json = skygreen(env, "resume", run_id, "--json")
    assert as_json.returncode == 0, as_json.stderr
    said = json.loads(as_json.stdout)
    assert said["from_step"] is None and said["from_scratch"] is True and said["launch"] == 3
    assert "restarts from step 0" in said["note"]
    assert skygreen(env, "cancel", run_id).returncode == 0
