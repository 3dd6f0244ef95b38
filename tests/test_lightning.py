"""skygreen's Lightning callback with a real `lightning.Trainer` (tasks/lightning_task.py, a small
regressor on CPU): every checkpoint committed through the storage plugin, SIGKILL at a known
checkpoint then `skygreen resume` ending bit-identical to an uninterrupted run, the smoke test in a
scratch folder, and the precision check. What the HF and Lightning callbacks share (SIGTERM,
notices, budgets, early stopping, cloud buckets) is tested for both in test_trainer_services.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess

import pytest

pytest.importorskip("lightning")

from helpers import user_env, wait_for
from local_runs import (
    LIGHTNING_STEPS_PER_EPOCH,
    LIGHTNING_TASK,
    SKYGREEN,
    launch_log,
    run_record,
    same_weights,
    skygreen,
    status,
    status_agrees_with_cost,
)
from skygreen.checkpoint.folders import committed_folder_steps
from skygreen.checkpoint.store import join_url
from skygreen.checkpoint.store_factory import open_store
from skygreen.task.settings import SMOKE_LINE

RUN_ID = LIGHTNING_TASK.run_id
FINAL = LIGHTNING_TASK.final
STEPS_PER_EPOCH = LIGHTNING_STEPS_PER_EPOCH
workdir_of = LIGHTNING_TASK.workdir
env_for = LIGHTNING_TASK.env
train = LIGHTNING_TASK.train


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
    same_weights(LIGHTNING_TASK.weights(work), LIGHTNING_TASK.weights(reference))
    status_agrees_with_cost(env, run_id, preemptions=1)
    cost = skygreen(env, "cost", run_id)
    assert cost.returncode == 0, cost.stdout + cost.stderr


@pytest.mark.slow
def test_a_pytorch_lightning_script_gets_the_callback_of_its_package(tmp_path):
    pytest.importorskip("pytorch_lightning")
    work = workdir_of(tmp_path, "work")
    script = work / "lightning_task.py"
    source = script.read_text().replace("import lightning as L\n", "import pytorch_lightning as L\n")
    source = source.replace("from lightning.pytorch.callbacks import", "from pytorch_lightning.callbacks import")
    script.write_text(source.replace("from torch import nn\n", "from torch import nn\n\nassert 'lightning' not in sys.modules\n")
                      .replace("import os\n", "import os\nimport sys\n", 1))  # fmt: skip
    bucket = tmp_path / "bucket"
    proc = train(work, env_for(tmp_path, bucket, LT_EPOCHS="1"))
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert "Traceback" not in out
    assert committed_folder_steps(open_store(join_url(str(bucket), RUN_ID))) == [STEPS_PER_EPOCH]
