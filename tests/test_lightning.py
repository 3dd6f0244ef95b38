"""skygreen's Lightning callback with a real `lightning.Trainer` (tasks/lightning_task.py, a small
regressor on CPU): every checkpoint committed through the storage plugin, SIGKILL at a known
checkpoint then `skygreen resume` ending bit-identical to an uninterrupted run, SIGTERM exiting
with the preempted code after its commit, the smoke test in a scratch folder, and the precision
check."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")

from helpers import user_env, wait_for
from local_runs import SKYGREEN, launch_log, run_record, skygreen, status
from skygreen.checkpoint.folders import committed_folder_steps
from skygreen.checkpoint.store import join_url
from skygreen.checkpoint.store_factory import open_store
from skygreen.exit_codes import PREEMPTED_EXIT_CODE
from skygreen.settings import SMOKE_LINE, RuntimeSettings

REPO = Path(__file__).resolve().parents[1]
TASKS = REPO / "tasks"
RUN_ID = "lt-20260101-000000-abcd"
FINAL = Path("out/lightning/final.pt")
STEPS_PER_EPOCH = 8  # 256 samples, batches of 32 (SKYGREEN_TASK_SIZE=small)


def workdir_of(tmp_path: Path, name: str) -> Path:
    work = tmp_path / name
    work.mkdir()
    shutil.copy(TASKS / "lightning_task.py", work / "lightning_task.py")
    shutil.copy(TASKS / "lightning.yaml", work / "lightning.yaml")
    return work


def env_for(tmp_path: Path, bucket: Path, **extra: str) -> dict[str, str]:
    settings = RuntimeSettings(run_id=RUN_ID, bucket=str(bucket), checkpoint_keep=2, trainer="lightning")
    env = user_env(tmp_path / "home")
    env.update({**settings.to_env(), "SKYGREEN_TASK_SIZE": "small", "LT_EPOCHS": "3", **extra})
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def train(work: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "lightning_task.py"], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip


def weights(path: Path) -> dict:
    import torch

    return torch.load(path, weights_only=True)


@pytest.mark.slow
def test_smoke_trains_two_steps_in_a_scratch_folder(tmp_path):
    work = workdir_of(tmp_path, "work")
    env = {k: v for k, v in user_env(tmp_path / "home").items() if not k.startswith("SKYGREEN_")}
    out = subprocess.run([*SKYGREEN, "smoke", str(work / "lightning.yaml")], cwd=work, env=env,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{SMOKE_LINE}: Lightning: 2 steps, checkpoint of step 2 committed and restored" in out.stdout
    assert not [p for p in work.rglob("*") if p.is_file() and p.suffix in (".ckpt", ".pt")], (
        "nothing saved in the project"
    )


def test_a_precision_the_trainer_contradicts_stops_before_training(tmp_path):
    work = workdir_of(tmp_path, "work")
    proc = train(work, env_for(tmp_path, tmp_path / "bucket", SKYGREEN_PRECISION="bf16"))
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 2, out
    assert "precision: bf16" in out and "precision='32-true'" in out and 'precision="bf16-mixed"' in out
    assert "Traceback" not in out
    assert not list((work / "out").rglob("*.ckpt")) if (work / "out").exists() else True
    assert committed_folder_steps(open_store(join_url(str(tmp_path / "bucket"), RUN_ID))) == []


def test_a_script_not_started_by_skygreen_is_told_how(tmp_path):
    work = workdir_of(tmp_path, "work")
    env = {k: v for k, v in user_env(tmp_path / "home").items() if not k.startswith("SKYGREEN_")}
    proc = train(work, env)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 2, out
    assert "SKYGREEN_RUN_ID is not set" in out and "skygreen up" in out and "Traceback" not in out


@pytest.mark.slow
def test_sigterm_exits_with_the_preempted_code_after_the_commit(tmp_path):
    bucket = tmp_path / "bucket"
    store = open_store(join_url(str(bucket), RUN_ID))
    work = workdir_of(tmp_path, "work")
    held = STEPS_PER_EPOCH
    proc = train(work, env_for(tmp_path, bucket, SKYGREEN_TEST_HOLD_AT_STEPS=str(held)))
    try:
        wait_for(lambda: held in committed_folder_steps(store) or proc.poll() is not None, "the first commit", 600)
        assert proc.poll() is None, "the run ended before the test could signal it"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == PREEMPTED_EXIT_CODE, out
    # the held step, then the step the SIGTERM was seen after: saved and committed before the exit
    assert committed_folder_steps(store) == [held, held + 1], out
    assert not (work / FINAL).exists()


@pytest.mark.slow
def test_up_local_killed_at_a_checkpoint_then_resume_ends_with_the_uninterrupted_weights(tmp_path, private_home):
    env = user_env(private_home, SKYGREEN_TASK_SIZE="small", LT_EPOCHS="3")
    env["CUDA_VISIBLE_DEVICES"] = ""
    reference = workdir_of(tmp_path, "reference")
    out = skygreen(env, "up", str(reference / "lightning.yaml"), "--local", "--no-smoke")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]

    def listed() -> list[dict]:
        return json.loads(skygreen(env, "status", "--json", timeout_s=120).stdout)

    earlier = {r["run_id"] for r in listed()}
    work = workdir_of(tmp_path, "run")
    held = 2 * STEPS_PER_EPOCH
    follow = subprocess.Popen([*SKYGREEN, "up", str(work / "lightning.yaml"), "--local", "--no-smoke"],
                              env={**env, "SKYGREEN_TEST_HOLD_AT_STEPS": str(held)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        run_id = wait_for(lambda: [r["run_id"] for r in listed() if r["run_id"] not in earlier], "the run", 300)[0]

        def held_there() -> bool:
            s = status(env, run_id)
            assert s["state"] in ("RUNNING", "PENDING", "STARTING"), f"the run ended ({s['state']}) before step {held}"
            return s["step"] == held and f"held at step {held} (" in launch_log(env, run_id)

        wait_for(held_there, f"the run held at step {held}", 600)
        os.killpg(run_record(env, run_id)["launches"][-1]["pid"], signal.SIGKILL)  # the machine is gone
        wait_for(lambda: status(env, run_id)["state"] == "STOPPED", "the run to read as stopped")
    finally:
        follow.kill()
        follow.wait(timeout=60)
    assert not (work / FINAL).exists()
    shutil.rmtree(work / "out")  # a new machine: only the bucket survived
    shutil.rmtree(work / "skygreen-restored", ignore_errors=True)

    resumed = skygreen(env, "resume", run_id)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert status(env, run_id)["state"] == "SUCCEEDED"
    assert f"step={held}.ckpt" in launch_log(env, run_id), "the resumed run restored the held step's checkpoint"
    after, before = weights(work / FINAL), weights(reference / FINAL)
    assert after.keys() == before.keys()
    for name, tensor in before.items():
        assert after[name].dtype == tensor.dtype and bool((after[name] == tensor).all()), name
    cost = skygreen(env, "cost", run_id)
    assert cost.returncode == 0, cost.stdout + cost.stderr


@pytest.mark.slow
def test_early_stopping_on_a_logged_metric_saves_and_stops_the_trainer(tmp_path):
    from skygreen.ledger.io import read_ledger

    bucket = tmp_path / "bucket"
    store = open_store(join_url(str(bucket), RUN_ID))
    work = workdir_of(tmp_path, "work")
    # val_loss falls epoch after epoch, so with mode max the second evaluation does not improve
    stop = {"SKYGREEN_EARLY_STOP_METRIC": "val_loss", "SKYGREEN_EARLY_STOP_MODE": "max",
            "SKYGREEN_EARLY_STOP_PATIENCE": "1"}  # fmt: skip
    proc = train(work, env_for(tmp_path, bucket, LT_EPOCHS="5", **stop))
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert committed_folder_steps(store) == [STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH], "stopped after epoch 2, saved"
    (segment,) = read_ledger(store)
    assert (segment.end, segment.step) == ("early-stopped", 2 * STEPS_PER_EPOCH)
    assert "val_loss" in segment.metrics
