"""The HF Trainer callback under torchrun with 2 CPU processes (gloo): only rank 0 commits, every
rank's files are in the commit (the ranks meet before it), and after a SIGKILL at a committed
checkpoint a fresh 2-rank start restores once (local rank 0; rank 1 waits at the barrier) and
both ranks name the same folder for `train()`.

The resumed 2-rank training itself is not run: HF Trainer (5.17) cannot resume a multi-process
CPU run (it loads the optimizer with `map_location=args.device`, `cpu:<rank>`, which torch
refuses), so the probe (tests/hf_ranks_probe.py) stops at `train()`. Bit-identical resume is
covered for one process in tests/test_hf_trainer.py."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from helpers import user_env, wait_for
from skygreen.checkpoint.folders import committed_folder_steps, folder_manifests
from skygreen.checkpoint.store import join_url
from skygreen.checkpoint.store_factory import open_store
from skygreen.task.settings import RuntimeSettings

REPO = Path(__file__).resolve().parents[1]
RUN_ID = "hf-ranks-20260101-000000-abcd"
FINAL = Path("out/hf-trainer/final/model.safetensors")
PROBE = Path(__file__).with_name("hf_ranks_probe.py")

pytestmark = pytest.mark.slow


def env_for(tmp_path: Path, bucket: Path, **extra: str) -> dict[str, str]:
    settings = RuntimeSettings(run_id=RUN_ID, bucket=str(bucket), checkpoint_keep=2, trainer="transformers")
    env = user_env(tmp_path / "home")
    env.update({**settings.to_env(), "SKYGREEN_TASK_SIZE": "small", "HF_MAX_STEPS": "12", "HF_SAVE_STEPS": "4",
                "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", **extra})  # fmt: skip
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def torchrun(
    tmp_path: Path, name: str, env: dict[str, str], *, script: Path | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    """`torchrun --nproc_per_node 2 hf_trainer.py` (or `script` beside it) in a fresh folder, in
    its own session so the test can kill it whole."""
    work = tmp_path / name
    work.mkdir()
    shutil.copy(REPO / "tasks" / "hf_trainer.py", work / "hf_trainer.py")
    if script is not None:
        shutil.copy(script, work / script.name)
    log = work / "output.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
             script.name if script is not None else "hf_trainer.py"],
            cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    return proc, work


def finish(proc: subprocess.Popen[bytes], work: Path) -> str:
    try:
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = (work / "output.log").read_text(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    return text


def test_two_ranks_commit_every_ranks_files_and_restore_once_per_node_after_a_sigkill(tmp_path):
    bucket = tmp_path / "bucket"
    store = open_store(join_url(str(bucket), RUN_ID))
    proc, first = torchrun(tmp_path, "vm1", env_for(tmp_path, bucket, SKYGREEN_TEST_HOLD_AT_STEPS="8"))
    try:
        log = first / "output.log"

        def committed_and_held() -> bool:
            assert proc.poll() is None, "the run ended before the test could kill it\n" + log.read_text()[-3000:]
            return 8 in committed_folder_steps(store) and log.read_text(errors="replace").count("held at step 8 (") == 2

        wait_for(committed_and_held, "the commit of step 8 and both ranks held there", 900)
        os.killpg(proc.pid, signal.SIGKILL)  # the machine is gone
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert not (first / FINAL).exists()
    assert committed_folder_steps(store) == [4, 8]  # rank 0 committed each folder once
    for manifest in folder_manifests(store):  # the ranks met before the commit: both ranks' RNG files
        assert {"files/rng_state_0.pth", "files/rng_state_1.pth"} <= set(manifest.blobs), sorted(manifest.blobs)

    # A fresh disk, two ranks: local rank 0 restores, rank 1 waits at the barrier and names the same folder.
    proc, second = torchrun(tmp_path, "vm2", env_for(tmp_path, bucket), script=PROBE)
    out = finish(proc, second)
    assert out.count("restored checkpoint folder") == 1, out[-3000:]
    folder = "out/hf-trainer/checkpoint-8"
    assert f"rank 0 resume_from_checkpoint={folder}" in out and f"rank 1 resume_from_checkpoint={folder}" in out, out
    assert sorted(p.name for p in (second / folder).iterdir()) == sorted(p.name for p in (first / folder).iterdir())
    for name in ("model.safetensors", "optimizer.pt", "rng_state_1.pth"):
        assert (second / folder / name).read_bytes() == (first / folder / name).read_bytes(), name
