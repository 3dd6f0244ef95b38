"""A PEFT LoRA model trained by an HF `Trainer` with `SkygreenCallback()` (tests/hf_lora_train.py,
the tiny random Llama of tasks/lora.py): every commit holds the adapter and its optimizer state
alone, under 1% of a full fine-tune's state, with the frozen base's name and weights digest in
its meta; killed at a commit and restarted, it resumes there and ends bit-identical to a run that
was never stopped; the same bucket on another base is refused before training, naming both."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("peft")

from helpers import user_env
from local_runs import finish, same_weights, wait_for_commit
from skygreen.checkpoint.folders import committed_folder_steps, folder_manifests
from skygreen.checkpoint.store_factory import open_store
from skygreen.ledger.io import read_ledger
from skygreen.runtime.frozen_base import FROZEN_BASE_META, base_identity
from skygreen.runtime.hold import HOLD_ENV
from skygreen.task.settings import RuntimeSettings

SCRIPT = Path(__file__).with_name("hf_lora_train.py")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tasks"))
import lora  # noqa: E402  (the base the script trains on)

RUN_ID = "hflora-20260101-000000-abcd"
FULL_STATE_BYTES_PER_PARAM = 12
"""fp32 weights plus AdamW's two moments: what a full fine-tune's checkpoint holds per parameter."""

pytestmark = pytest.mark.slow


def train(work: Path, bucket: Path, home: Path, **extra: str) -> subprocess.Popen[str]:
    work.mkdir(exist_ok=True)
    settings = RuntimeSettings(run_id=RUN_ID, bucket=str(bucket), checkpoint_keep=2, trainer="transformers")
    env = user_env(home)
    env.update({**settings.to_env(), "HF_MAX_STEPS": "8", "HF_SAVE_STEPS": "4", "CUDA_VISIBLE_DEVICES": "",
                "HF_HUB_OFFLINE": "1", **extra})  # fmt: skip
    return subprocess.Popen([sys.executable, str(SCRIPT)], cwd=work, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def test_hf_trainer_checkpoints_only_the_adapter_with_its_base_resumes_exactly_and_refuses_another_base(tmp_path):
    home = tmp_path / "home"
    straight = train(tmp_path / "whole", tmp_path / "bucket-whole", home)
    bucket = tmp_path / "bucket"
    store = open_store(str(bucket / RUN_ID))
    first = train(tmp_path / "vm1", bucket, home, **{HOLD_ENV: "4"})
    try:  # gate: held at step 4 once its commit is in the bucket
        wait_for_commit(first, store, 4)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate(timeout=60)

    (manifest,) = folder_manifests(store)
    base = lora.lora_model(base_seed=0)
    assert manifest.meta[FROZEN_BASE_META] == base_identity(base).to_json()
    assert manifest.meta[FROZEN_BASE_META]["name"] == "tiny-llama-random-seed0"
    files = {Path(name).name for name in manifest.blobs}
    assert "adapter_model.safetensors" in files and not files & {"model.safetensors", "pytorch_model.bin"}
    params = sum(p.numel() for p in base.parameters())
    saved_bytes = sum(blob.size for blob in manifest.blobs.values())
    assert saved_bytes < 0.01 * FULL_STATE_BYTES_PER_PARAM * params, (saved_bytes, params)

    resumed = train(tmp_path / "vm2", bucket, home)
    out = finish(resumed)
    assert resumed.returncode == 0, out[-3000:]
    assert committed_folder_steps(store) == [4, 8]
    segments = read_ledger(store)
    assert [s.start_step for s in segments] == [0, 4]  # the second life began at the commit
    last = max(folder_manifests(store), key=lambda m: m.step)
    assert segments[-1].checkpoint_bytes == sum(b.size for b in last.blobs.values())  # what `plan` learns
    whole = finish(straight)
    assert straight.returncode == 0, whole[-3000:]
    same_weights(torch.load(tmp_path / "vm2" / "final.pt", weights_only=True),
                 torch.load(tmp_path / "whole" / "final.pt", weights_only=True))  # fmt: skip

    other = train(tmp_path / "vm3", bucket, home, LORA_BASE_SEED="1")
    said = finish(other)
    assert other.returncode == 1, said[-3000:]
    assert "trained on base model tiny-llama-random-seed0" in said and "but the base loaded now is" in said
    assert "fix: load the same base model" in said and "Traceback" not in said
    assert not (tmp_path / "vm3" / "final.pt").exists()
