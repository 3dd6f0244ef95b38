"""skygreen's HF Trainer callback with a real `Trainer` (tasks/hf_trainer.py, a tiny GPT-2 on CPU):
every checkpoint-N committed, SIGKILL at a known checkpoint then a restart that restores from the
bucket and ends bit-identical to an uninterrupted run (dropout on), the smoke test in a scratch
folder, and the precision check. What the HF and Lightning callbacks share (SIGTERM, notices,
budgets, early stopping, cloud buckets) is tested for both in test_trainer_services.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from helpers import user_env, wait_for
from local_runs import (
    HF_TASK,
    SKYGREEN,
    launch_log,
    run_record,
    same_weights,
    skygreen,
    status,
    status_agrees_with_cost,
    wait_for_commit,
)
from skygreen.checkpoint.folders import committed_folder_steps
from skygreen.checkpoint.store import join_url
from skygreen.checkpoint.store_factory import open_store
from skygreen.task.settings import SMOKE_LINE

RUN_ID = HF_TASK.run_id
FINAL = HF_TASK.final
workdir_of = HF_TASK.workdir
env_for = HF_TASK.env
train = HF_TASK.train


@pytest.mark.slow
def test_sigkill_at_a_checkpoint_then_restart_ends_bit_identical(tmp_path):
    alone = workdir_of(tmp_path, "alone")
    proc = train(alone, env_for(tmp_path, tmp_path / "bucket-alone"))
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out
    assert committed_folder_steps(open_store(join_url(str(tmp_path / "bucket-alone"), RUN_ID))) == [8, 12]

    bucket = tmp_path / "bucket"
    store = open_store(join_url(str(bucket), RUN_ID))
    first = workdir_of(tmp_path, "vm1")
    proc = train(first, env_for(tmp_path, bucket, SKYGREEN_TEST_HOLD_AT_STEPS="8"))
    try:
        wait_for_commit(proc, store, 8)  # step 8 is committed and the run holds there
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert not (first / FINAL).exists()

    second = workdir_of(tmp_path, "vm2")  # a new machine: only the bucket survived
    proc = train(second, env_for(tmp_path, bucket))
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out
    assert (second / "out/hf-trainer/checkpoint-8").is_dir()  # restored from the bucket
    same_weights(HF_TASK.weights(second), HF_TASK.weights(alone))  # dropout on: the RNG came back too
    assert committed_folder_steps(store) == [8, 12]


@pytest.mark.slow
def test_smoke_trains_two_steps_in_a_scratch_folder(tmp_path):
    work = workdir_of(tmp_path, "work")
    out = subprocess.run(
        [sys.executable, "-m", "skygreen.cli", "smoke", str(work / "hf-trainer.yaml")],
        cwd=work, env=user_env(tmp_path / "home"), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert SMOKE_LINE in out.stdout + out.stderr
    # the Trainer makes its output_dir when it is built; nothing is saved there
    assert not [p for p in (work / "out").rglob("*") if p.is_file() or p.name.startswith("checkpoint-")]


def test_a_precision_the_training_arguments_contradict_stops_before_training(tmp_path):
    work = workdir_of(tmp_path, "work")
    env = env_for(tmp_path, tmp_path / "bucket", SKYGREEN_PRECISION="bf16")
    proc = train(work, env)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 2, out
    assert "precision: bf16" in out and "TrainingArguments" in out and "bf16=True" in out
    assert "Traceback" not in out
    assert not (work / "out/hf-trainer/checkpoint-4").exists()


# ---------------------------------------------------------------- through the skygreen command


@pytest.mark.slow
def test_up_local_killed_at_a_checkpoint_then_resume_ends_with_the_uninterrupted_weights(tmp_path, private_home):
    env = user_env(private_home, SKYGREEN_TASK_SIZE="small", HF_MAX_STEPS="12", HF_SAVE_STEPS="4")
    env["CUDA_VISIBLE_DEVICES"] = ""
    reference = workdir_of(tmp_path, "reference")
    out = skygreen(env, "up", str(reference / "hf-trainer.yaml"), "--local", "--no-smoke")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]

    def listed() -> list[dict]:
        return json.loads(skygreen(env, "status", "--json", timeout_s=120).stdout)

    earlier = {r["run_id"] for r in listed()}
    work = workdir_of(tmp_path, "run")
    held = {**env, "SKYGREEN_TEST_HOLD_AT_STEPS": "8"}
    follow = subprocess.Popen([*SKYGREEN, "up", str(work / "hf-trainer.yaml"), "--local", "--no-smoke"], env=held,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        run_id = wait_for(lambda: [r["run_id"] for r in listed() if r["run_id"] not in earlier], "the second run", 300)[
            0
        ]

        def held_at_8() -> bool:
            s = status(env, run_id)
            assert s["state"] in ("RUNNING", "PENDING", "STARTING"), f"the run ended ({s['state']}) before step 8"
            return s["step"] == 8 and "held at step 8 (" in launch_log(env, run_id)

        wait_for(held_at_8, "the run held at step 8", 900)
        os.killpg(run_record(env, run_id)["launches"][-1]["pid"], signal.SIGKILL)  # the machine is gone
        wait_for(lambda: status(env, run_id)["state"] == "STOPPED", "the run to read as stopped")
    finally:
        follow.kill()
        follow.wait(timeout=60)
    assert not (work / FINAL).exists()

    resumed = skygreen(env, "resume", run_id)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert status(env, run_id)["state"] == "SUCCEEDED"
    assert "restored checkpoint folder" in launch_log(env, run_id) or (work / "out/hf-trainer/checkpoint-8").is_dir()
    same_weights(HF_TASK.weights(work), HF_TASK.weights(reference))
    status_agrees_with_cost(env, run_id, preemptions=1)
