"""FSDP2 runs under `torchrun` (gloo, CPU) with sharded asynchronous checkpoints.

Each test kills a run at a gated point (a rank held inside the upload of a save, or a run held
at a step after its commit: `SKYGREEN_TEST_HOLD_UPLOAD`, `SKYGREEN_TEST_HOLD_AT_STEPS`), never
at a moment it has to race for, and compares the resumed run with an uninterrupted one:

- killed with kill -9 while both ranks upload a save: no commit, resumes from the one before,
  bit-identical at the same world size (local store);
- one rank killed mid-save: the same (GCS emulator);
- 2 -> 4 -> 1 ranks: the checkpoint reshards, every step uses exactly the samples the
  uninterrupted run used, the effective batch is kept (accumulation 4 -> 2 -> 8), and the loss
  stays within 1e-5 (relative) of the uninterrupted run's: only the order of the fp32 sums
  changed (moto S3).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from skygreen.checkpoint.manifest import committed_steps, manifest_key, read_manifest
from skygreen.checkpoint.store_factory import open_store

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "fsdp_train.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
STEPS = 6
LOSS_RTOL = 1e-5

pytestmark = pytest.mark.skipif(not TORCHRUN.exists() and not shutil.which("torchrun"), reason="torchrun not installed")


def launch(nproc: int, bucket: str, run_id: str, out: Path, **env: str) -> subprocess.Popen:
    out.mkdir(parents=True, exist_ok=True)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SKYGREEN_")}
    full_env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), **env)
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", str(nproc), str(SCRIPT), bucket, run_id, str(STEPS)]
    return subprocess.Popen([*cmd, str(out)], env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-4000:]
    return out


def wait_for(proc: subprocess.Popen, ready, what: str) -> None:
    """Poll `ready()` until true; fail loudly if the run ended first."""
    deadline = time.monotonic() + 300
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"the run ended before {what}: {proc.communicate()[0][-4000:]}")
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (torchrun starts each worker in a session of its own)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def kill_all(proc: subprocess.Popen) -> None:
    """kill -9 the workers and torchrun, as a lost VM would."""
    for pid in [*descendants(proc.pid), proc.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=60)


def steps_log(out: Path) -> dict[int, dict]:
    """The last record of each step (a resumed life logs the steps it redid again)."""
    lines = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    return {line["step"]: line for line in lines}


def weights(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "weights.pt", weights_only=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted 2-rank run to STEPS."""
    root = tmp_path_factory.mktemp("fsdp-ref")
    finish(launch(2, str(root / "bucket"), "ref", root / "out"))
    return root / "out"


def assert_same_as(reference: Path, out: Path) -> None:
    ref, got = weights(reference), weights(out)
    assert ref.keys() == got.keys()
    for name in ref:
        assert torch.equal(ref[name], got[name]), name
    assert steps_log(out) == steps_log(reference)


def test_accumulation_reduce_scatters_once_per_step_and_clipping_sees_the_global_norm(reference):
    for step, line in steps_log(reference).items():
        # 3 sharded Linear layers, accumulation 4: one reduce-scatter each, on the last micro-step only
        assert line["accum"] == 4 and line["reduce_scatters"] == 3, (step, line)
        assert line["grad_norm"] == pytest.approx(line["grad_norm_gathered"], rel=1e-6), (step, line)
        if line["grad_norm_gathered"] > 0.5:
            assert line["grad_norm_after_clip"] == pytest.approx(0.5, rel=1e-4), (step, line)
    assert any(line["grad_norm_gathered"] > 0.5 for line in steps_log(reference).values())  # clipping happened


def test_kill_9_during_an_async_save_leaves_no_commit_and_resumes_bit_identical(tmp_path, reference):
    bucket, out, held = str(tmp_path / "bucket"), tmp_path / "out", tmp_path / "held"
    proc = launch(2, bucket, "victim", out, SKYGREEN_TEST_HOLD_UPLOAD=f"4:0,1:{held}")
    markers = [held / "upload-4-rank0", held / "upload-4-rank1"]
    wait_for(proc, lambda: all(m.exists() for m in markers), "both ranks were inside the upload of step 4")
    kill_all(proc)
    store = open_store(f"{bucket}/victim")
    assert committed_steps(store) == [2]
    assert not store.exists(manifest_key(4)) and store.list("ckpt/000000000004/")  # files up, no commit
    resumed = finish(launch(2, bucket, "victim", out))
    assert "resumed run victim at step 2" in resumed
    assert_same_as(reference, out)
    manifest = read_manifest(store, max(committed_steps(store)))
    assert manifest.layout == "sharded-dcp" and manifest.world_size == 2 and manifest.meta["state"] == "completed"
    assert {"dcp.metadata", "dcp__0_0.distcp", "dcp__1_0.distcp", "shared.pt"} <= set(manifest.blobs)
    assert not store.list("ckpt/000000000004/") or store.exists(manifest_key(4))  # the leftovers were cleared


def test_a_rank_lost_mid_save_leaves_no_commit_and_the_run_falls_back(tmp_path, reference, gcs_bucket):
    bucket, out, held = f"gs://{gcs_bucket}/runs", tmp_path / "out", tmp_path / "held"
    proc = launch(2, bucket, "victim", out, SKYGREEN_TEST_HOLD_UPLOAD=f"4:1:{held}")
    marker = held / "upload-4-rank1"
    wait_for(proc, marker.exists, "rank 1 was inside the upload of step 4")
    os.kill(int(marker.read_text()), signal.SIGKILL)  # rank 1 only; torchrun then stops rank 0
    proc.communicate(timeout=300)
    assert proc.returncode != 0
    store = open_store(f"{bucket}/victim")
    assert committed_steps(store) == [2]
    assert not store.exists(manifest_key(4))
    resumed = finish(launch(2, bucket, "victim", out))
    assert "resumed run victim at step 2" in resumed
    assert_same_as(reference, out)


def test_resharding_from_2_to_4_to_1_ranks_keeps_the_samples_and_the_loss(tmp_path, reference, s3_bucket):
    bucket, out = f"s3://{s3_bucket}/runs", tmp_path / "out"
    store = open_store(f"{bucket}/elastic")
    for nproc, held_at in ((2, 2), (4, 4)):
        proc = launch(nproc, bucket, "elastic", out, SKYGREEN_TEST_HOLD_AT_STEPS=str(held_at))
        wait_for(proc, lambda s=held_at: s in committed_steps(store), f"step {held_at} was committed")
        kill_all(proc)
    assert read_manifest(store, 4).world_size == 4
    finish(launch(1, bucket, "elastic", out))
    ref, got = steps_log(reference), steps_log(out)
    assert sorted(got) == list(range(STEPS))
    shapes = [(got[s]["world_size"], got[s]["accum"]) for s in range(STEPS)]
    assert shapes == [(2, 4), (2, 4), (4, 2), (4, 2), (1, 8), (1, 8)]
    for step in range(STEPS):
        assert got[step]["samples"] == ref[step]["samples"], step  # the global sample stream continues exactly
        assert got[step]["loss"] == pytest.approx(ref[step]["loss"], rel=LOSS_RTOL), step
    ref_w, got_w = weights(reference), weights(out)
    for name in ref_w:
        torch.testing.assert_close(got_w[name], ref_w[name], rtol=LOSS_RTOL, atol=1e-6)


def test_micro_auto_is_refused_for_a_model_sharded_over_ranks_naming_the_fix():
    from skygreen.errors import RuntimeSetupError
    from skygreen.runtime.fsdp import check_batch

    with pytest.raises(RuntimeSetupError, match=r"give the micro-batch"):
        check_batch(micro_auto=True, world_size=2, smoke=False)
    check_batch(micro_auto=True, world_size=1, smoke=False)  # one rank probes as before
    check_batch(micro_auto=False, world_size=4, smoke=False)


def test_the_tasks_precision_becomes_fsdp2s_mixed_precision_policy():
    from skygreen.errors import InputError
    from skygreen.runtime.fsdp import mixed_precision, task_precision

    bf16 = mixed_precision("bf16")
    assert bf16.param_dtype == torch.bfloat16 and bf16.reduce_dtype == torch.float32
    assert mixed_precision("fp16").param_dtype == torch.float16
    assert mixed_precision("fp32").param_dtype is None  # FSDP2's default: no casting
    with pytest.raises(InputError, match="'fp8' is not one of"):
        mixed_precision("fp8")
    assert task_precision(torch.device("cpu"), {"SKYGREEN_SMOKE": "1"}) == "fp32"
