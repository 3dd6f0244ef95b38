"""tasks/gpt2-fsdp.yaml as a user runs it on a laptop: `skygreen up --local` starts 2 CPU ranks
(its torchrun line, with no SkyPilot layout), the model is sharded with FSDP2, and the run ends
with a sharded checkpoint both ranks wrote."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from helpers import user_env
from local_runs import status_agrees_with_cost
from test_local_e2e import runs, skygreen

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_gpt2_fsdp_trains_under_up_local_with_two_cpu_ranks(private_home, tmp_path):
    env = user_env(
        private_home,
        SKYGREEN_TASK_SIZE="small",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        SKYGREEN_DATA_CACHE=str(tmp_path / "cache"),
    )
    shipped = yaml.safe_load((REPO / "tasks" / "gpt2-fsdp.yaml").read_text())
    task = tmp_path / "gpt2-fsdp-short.yaml"
    task.write_text(
        yaml.safe_dump(
            {
                "name": "gpt2-fsdp-short",
                "workdir": str(REPO / "tasks"),
                "skygreen": {"precision": "fp32", "batch": {"effective": 16, "micro": 4}, "checkpoint": {"every": 5}},
                "run": shipped["run"] + " --steps 10",
            }
        )
    )
    out = skygreen(env, "up", str(task), "--local", "--no-smoke", timeout_s=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    logs = out.stdout + out.stderr
    assert "step 10 epoch 0 ranks 2 accumulation 2" in logs, logs[-3000:]
    (run,) = runs(env)
    assert run["completed"] and run["step"] == 10
    from skygreen.checkpoint.manifest import base_blob_name, latest_manifest
    from skygreen.checkpoint.store_factory import open_store

    bucket = next(Path(private_home).rglob("ckpt")).parent
    manifest = latest_manifest(open_store(str(bucket)))
    assert manifest is not None and manifest.step == 10
    assert manifest.layout == "sharded-dcp" and manifest.world_size == 2
    # a launched life names its files after itself (`dcp__0_0.l1-<hex>.distcp`): one writer per run
    assert {"dcp__0_0.distcp", "dcp__1_0.distcp", "rank00001.pt"} <= {base_blob_name(b) for b in manifest.blobs}
    # a sharded commit names its weights; status reads the run as cost does (every 5 steps: no interval in seconds)
    shown = status_agrees_with_cost(env, run["run_id"], preemptions=0, interval=False)
    assert shown["model_sha256"] == manifest.model_sha256


def test_the_smoke_test_runs_an_fsdp2_run_line_with_two_ranks(private_home, tmp_path):
    env = user_env(private_home, SKYGREEN_TASK_SIZE="small", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                   SKYGREEN_DATA_CACHE=str(tmp_path / "cache"))  # fmt: skip
    task = tmp_path / "gpt2-fsdp-two.yaml"
    task.write_text(
        yaml.safe_dump(
            {
                "name": "gpt2-fsdp-two",
                "workdir": str(REPO / "tasks"),
                "skygreen": {"precision": "fp32", "batch": {"effective": 16, "micro": 4}},
                "run": "torchrun --standalone --nproc_per_node=2 gpt2_fsdp.py --steps 10",
            }
        )
    )
    out = skygreen(env, "smoke", str(task), timeout_s=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.startswith("skygreen smoke: ok: 2 steps on 2 ranks"), out.stdout
    assert out.stdout.count("skygreen smoke: ok") == 1  # rank 0 speaks for both
