"""The LoRA task (tasks/lora.py through peft): a PEFT model checkpoints only what it trains plus
its frozen base's identity (`skygreen.runtime.frozen_base`), refuses another base on restore,
is killed and resumed bit-identically, and its ledger records the real checkpoint size, under
1% of the full model's state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import user_env, wait_for
from local_runs import finish
from skygreen.checkpoint.folders import RestoredFolder
from skygreen.checkpoint.manifest import Manifest, committed_steps
from skygreen.checkpoint.store_factory import open_store
from skygreen.ledger.io import read_ledger
from skygreen.runtime.frozen_base import (
    FROZEN_BASE_META,
    BaseModelMismatchError,
    TrainableState,
    base_identity,
    peft_model,
)
from skygreen.runtime.hold import HOLD_ENV
from skygreen.task.settings import RuntimeSettings

pytest.importorskip("peft")
TASKS = Path(__file__).resolve().parents[1] / "tasks"
sys.path.insert(0, str(TASKS))
import lora  # noqa: E402  (the task's own model builder)

STEPS = 20
HELD_AT = 10
FULL_STATE_BYTES_PER_PARAM = 12
"""fp32 weights plus AdamW's two moments: what a full fine-tune's checkpoint holds per parameter."""


def test_the_adapter_alone_is_saved_and_another_base_is_refused():
    model = lora.lora_model(base_seed=0)
    assert peft_model(torch.nn.Linear(2, 2)) is None and peft_model(model) is not None
    state = TrainableState(model).state_dict()
    assert state["trainable"] and all("lora_" in name for name in state["trainable"])
    assert state[FROZEN_BASE_META]["name"] == "tiny-llama-random-seed0"

    same = lora.lora_model(base_seed=0)
    TrainableState(same).load_state_dict(state)
    assert all(torch.equal(p, state["trainable"][n]) for n, p in same.named_parameters() if p.requires_grad)

    other = lora.lora_model(base_seed=1)
    with pytest.raises(BaseModelMismatchError, match="trained on base model tiny-llama-random-seed0") as caught:
        TrainableState(other).load_state_dict(state)
    assert "fix: load the same base model" in str(caught.value)

    # the HF callback's check: the identity a folder commit carries in its meta
    from skygreen.integrations.transformers import frozen_base_of

    manifest = Manifest(
        kind="folder", step=4, created_at="2026-01-01T00:00:00Z", meta={FROZEN_BASE_META: state[FROZEN_BASE_META]}
    )
    restored = RestoredFolder(path=Path("x"), step=4, manifest=manifest)
    assert frozen_base_of(same, restored) == base_identity(same).to_json()
    assert frozen_base_of(torch.nn.Linear(2, 2), restored) is None
    with pytest.raises(BaseModelMismatchError):
        frozen_base_of(other, restored)


def train(work: Path, bucket: Path, home: Path, **extra: str) -> subprocess.Popen[str]:
    settings = RuntimeSettings(
        run_id="lora-20260101-000000-abcd",
        bucket=str(bucket),
        effective_batch=8,
        micro_batch=8,
        checkpoint_every_steps=HELD_AT,
        checkpoint_keep=2,
        precision="fp32",
    )
    env = user_env(home)
    env.update({**settings.to_env(), "LORA_STEPS": str(STEPS), "CUDA_VISIBLE_DEVICES": "", **extra})
    return subprocess.Popen([sys.executable, str(TASKS / "lora.py")], cwd=work, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def finished(proc: subprocess.Popen[str]) -> str:
    out = finish(proc, timeout_s=600)
    assert proc.returncode == 0, out[-3000:]
    return out


def test_lora_run_killed_and_resumed_ends_bit_identical_with_a_checkpoint_under_one_percent(tmp_path):
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    whole.mkdir()
    broken.mkdir()
    straight = train(whole, tmp_path / "bucket-whole", tmp_path / "home")

    store = open_store(str(tmp_path / "bucket-broken" / "lora-20260101-000000-abcd"))
    first = train(broken, tmp_path / "bucket-broken", tmp_path / "home", **{HOLD_ENV: str(HELD_AT)})
    try:  # gate: held at step 10 once its checkpoint committed
        wait_for(lambda: HELD_AT in committed_steps(store) or first.poll() is not None, "the commit of step 10", 600)
        assert first.poll() is None, "the run ended before step 10 was held"
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate(timeout=60)
    finished(train(broken, tmp_path / "bucket-broken", tmp_path / "home"))
    finished(straight)

    before = torch.load(whole / lora.FINAL, weights_only=True)
    after = torch.load(broken / lora.FINAL, weights_only=True)
    assert before.keys() == after.keys() and before
    assert all(torch.equal(after[name], tensor) for name, tensor in before.items())

    # The checkpoint holds the adapter and the base's identity, never the base's weights.
    shared = torch.load(store.root / f"ckpt/{STEPS:012d}/shared.pt", weights_only=True)  # type: ignore[attr-defined]
    assert set(shared["model"]) == {FROZEN_BASE_META, "trainable"}
    assert all("lora_" in name for name in shared["model"]["trainable"])

    # The ledger records the real size; it is under 1% of the full model's state.
    segments = read_ledger(store)
    assert [s.end for s in segments] == ["killed", "completed"]
    manifest = json.loads((store.root / f"ckpt/{STEPS:012d}/manifest.json").read_text())  # type: ignore[attr-defined]
    size = sum(blob["size"] for blob in manifest["blobs"].values())
    assert segments[-1].checkpoint_bytes == size
    full_state_bytes = sum(p.numel() for p in lora.lora_model().parameters()) * FULL_STATE_BYTES_PER_PARAM
    assert size < 0.01 * full_state_bytes, (size, full_state_bytes)


def test_plan_learns_the_checkpoint_size_earlier_runs_committed(tmp_path):
    """`save_measured` keeps the ledger's real checkpoint size; the plan's model takes the median
    of the task's runs in place of its estimate, as it takes measured speeds."""
    from skygreen.costs.speeds import measured_checkpoint_gb, save_measured
    from skygreen.launch.registry import Registry, RunRecord
    from skygreen.ledger.records import Place, Segment
    from skygreen.plan.rank import run_model
    from skygreen.task.checks import load_task

    task = TASKS / "lora.yaml"
    registry = Registry(root=tmp_path / "runs")
    assert measured_checkpoint_gb(task, registry=registry) is None
    for run_id, size in (("a", 70_000), ("b", 80_000), ("c", 90_000)):
        record = RunRecord(run_id=run_id, task_path=str(task), task_name="lora", mode="local", launcher="local",
                           bucket=str(tmp_path), task_yaml=str(task), spec_snapshot={},
                           created_at="2026-01-01T00:00:00Z", state="SUCCEEDED")  # fmt: skip
        registry.save(record)
        segment = Segment(run_id=run_id, key="ledger/x.json", place=Place(cloud="local"), started_at=0.0,
                          updated_at=1.0, end="completed", step=20, checkpoint_bytes=size)  # fmt: skip
        save_measured(registry, record, [segment])
    learned = measured_checkpoint_gb(task, registry=registry)
    assert learned == pytest.approx(80_000 / 1e9)
    assert run_model(load_task(task), measured_checkpoint_gb=learned).checkpoint_gb == learned


def test_up_plans_with_the_checkpoint_size_the_plan_command_learned(tmp_path, monkeypatch):
    """`up` plans through the wiring: the same plan `skygreen plan` shows, with the measured
    checkpoint size in it, not the estimate from the task's shape."""
    from skygreen import api
    from skygreen.costs.speeds import save_measured
    from skygreen.launch.registry import Registry, RunRecord
    from skygreen.ledger.records import Place, Segment
    from skygreen.task.checks import load_task

    monkeypatch.setenv("SKYGREEN_DATA_DIR", str(tmp_path / "data"))
    catalog = tmp_path / "catalog"
    (catalog / "aws").mkdir(parents=True)
    (catalog / "aws" / "vms.csv").write_text(
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone\n"
        "g4dn.xlarge,T4,1,4,16,T4,0.526,0.2,us-east-1,use1-az1\n"
    )
    task = TASKS / "lora.yaml"
    estimated = api.plan_task(task, catalog_dir=catalog).to_json()
    registry = Registry(root=tmp_path / "data" / "runs")
    record = RunRecord(run_id="a", task_path=str(task), task_name="lora", mode="local", launcher="local",
                       bucket=str(tmp_path), task_yaml=str(task), spec_snapshot={},
                       created_at="2026-01-01T00:00:00Z", state="SUCCEEDED")  # fmt: skip
    registry.save(record)
    segment = Segment(run_id="a", key="ledger/x.json", place=Place(cloud="local"), started_at=0.0,
                      updated_at=1.0, end="completed", step=20, checkpoint_bytes=3_000_000_000)  # fmt: skip
    save_measured(registry, record, [segment])
    learned = api.plan_task(task, catalog_dir=catalog).to_json()
    assert learned != estimated
    assert api.wiring(catalog_dir=catalog).plan(load_task(task)).to_json() == learned
