"""Honest figures after a kill -9, through the real `skygreen` command and a real local run of
tasks/tiny.py: the killed VM's time past its last checkpoint is billed, the steps it trained
past that checkpoint count as redone in what the preemption cost, and `status` and `cost`
agree on the preemptions and on the checkpoint's step.

The run is held at step 30 (a checkpoint first), released, and killed once its ledger heartbeat
shows it well past 30; with checkpoints an hour apart none can land in between.

A run killed between a save and its commit (the commit's request hangs at a proxy in front of
the bucket, and the kill waits for it) reads the same step in `status` and in `cost`.
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

from faultproxy import FaultProxy
from helpers import user_env, wait_for
from skygreen.checkpoint.local_store import LocalStore
from skygreen.checkpoint.store_factory import open_store
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


def test_a_kill_between_a_save_and_its_commit_reads_one_step_in_status_and_cost(private_home, tmp_path, s3_bucket):
    """The runtime writes its ledger at a save, before the save commits: killed in between, the
    ledger says 40 while the newest checkpoint is 30. `status` and `cost` both say 30, and the
    ten steps past it are reached (and redone by the next VM)."""
    proxy = FaultProxy(os.environ["AWS_ENDPOINT_URL_S3"]).start()  # s3_bucket points boto3 at moto
    try:
        spec = yaml.safe_load((REPO / "tasks" / "tiny.yaml").read_text())
        spec["skygreen"]["checkpoint"] = {"every": 10, "keep": 3, "bucket": f"s3://{s3_bucket}/runs"}
        spec["skygreen"].pop("early_stopping", None)
        spec["workdir"] = str(REPO / "tasks")
        task = tmp_path / "tiny.yaml"
        task.write_text(yaml.safe_dump(spec))
        proxy.inject("hang", times=50, method="PUT", path_contains="/ckpt/000000000040/manifest.json")
        env = user_env(private_home, TINY_STEPS="100", AWS_ENDPOINT_URL_S3=proxy.url)
        up = skygreen({**env, HOLD_ENV: "40"}, "up", str(task), "--local", "--no-smoke", "--detach")
        assert up.returncode == 0, up.stderr
        (run,) = json.loads(skygreen(env, "status", "--json").stdout)
        run_id = run["run_id"]
        ledger = open_store(f"s3://{s3_bucket}/runs/{run_id}")  # straight to the bucket, past the proxy

        def saving_40():
            assert status(env, run_id)["state"] == "RUNNING", "the run ended before its save at step 40"
            segments = read_ledger(ledger)
            return proxy.hung and segments and segments[-1].step == 40

        wait_for(saving_40, "the ledger at step 40 and the commit of step 40 hanging")
        record = json.loads((Path(env["XDG_DATA_HOME"]) / "skygreen" / "runs" / run_id / "run.json").read_text())
        os.killpg(record["launches"][-1]["pid"], signal.SIGKILL)
    finally:
        proxy.stop()
    env = {**env, "AWS_ENDPOINT_URL_S3": os.environ["AWS_ENDPOINT_URL_S3"]}  # the bucket itself from now on
    wait_for(lambda: status(env, run_id)["state"] == "STOPPED", "the run to read as stopped")
    assert read_ledger(ledger)[-1].step == 40  # the ledger as written: one save ahead of the bucket
    shown = status(env, run_id)
    assert shown["step"] == 30
    out = skygreen(env, "cost", run_id, "--json")
    assert out.returncode == 0, out.stderr
    cost = json.loads(out.stdout)
    (segment,) = cost["segments"]
    assert segment["step"] == cost["steps"] == shown["step"] == 30
    assert segment["reached_step"] == 40 and segment["steps_done"] == 30
    table = skygreen(env, "cost", run_id)
    assert table.returncode == 0, table.stderr
    assert "0->30" in table.stdout and "0->40" not in table.stdout, table.stdout
