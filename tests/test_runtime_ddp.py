"""DDP with 2 ranks (`torchrun`, gloo, CPU): exact resume of every rank, accumulation without
all-reduce on non-boundary micro-steps, and micro-batch agreement when one rank runs out of memory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from skygreen.runtime.checkpointer import Checkpointer
from skygreen.runtime.tensors import first_difference

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "ddp_train.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
IGNORE = frozenset({"state['training']['counters']['wall_s']", "state['training']['counters']['restarts']"})
STEPS = 10

pytestmark = pytest.mark.skipif(not TORCHRUN.exists() and not shutil.which("torchrun"), reason="torchrun not installed")


def torchrun(
    bucket: Path, run_id: str, micro: str, *crash: int, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SKYGREEN_")}
    full_env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), **(env or {}))
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(SCRIPT), str(bucket), run_id, str(STEPS), micro]
    return subprocess.run(cmd + [str(c) for c in crash], env=full_env, capture_output=True, text=True, timeout=300)


def load(bucket: Path, run_id: str, rank: int):
    return Checkpointer(f"{bucket}/{run_id}", rank=rank, world_size=2).load_latest()


def test_two_ranks_resume_bit_identical(tmp_path):
    ref = torchrun(tmp_path, "ref", "3")
    assert ref.returncode == 0, ref.stderr[-3000:]
    crashed = torchrun(tmp_path, "victim", "3", 5, 1)
    assert crashed.returncode != 0
    assert load(tmp_path, "victim", 0).step == 4
    resumed = torchrun(tmp_path, "victim", "3")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for rank in (0, 1):
        a, b = load(tmp_path, "ref", rank), load(tmp_path, "victim", rank)
        assert a.manifest.meta["state"] == b.manifest.meta["state"] == "completed"
        assert a.manifest.world_size == 2
        assert first_difference(a.state, b.state, ignore=IGNORE) is None
        assert a.rank_state is not None and b.rank_state is not None
        assert first_difference(a.rank_state, b.rank_state) is None, (
            rank,
            first_difference(a.rank_state, b.rank_state),
        )
    # the two ranks drew different dropout masks and data: their RNG streams differ
    assert first_difference(load(tmp_path, "ref", 0).rank_state, load(tmp_path, "ref", 1).rank_state) is not None


def test_gradients_are_all_reduced_once_per_optimizer_step(tmp_path):
    out = torchrun(tmp_path, "count", "3", env={"DDP_TEST_COUNT_ALLREDUCE": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    # micro 3 x accum 2 per rank; the tiny model fits one DDP bucket: one all-reduce per step
    assert "rank 0 micro 3 accum 2 allreduces 10" in out.stdout
    assert "rank 1 micro 3 accum 2 allreduces 10" in out.stdout


def test_all_ranks_agree_on_the_micro_batch_when_one_runs_out_of_memory(tmp_path):
    out = torchrun(tmp_path, "auto", "auto", env={"DDP_TEST_OOM_RANK1_ABOVE": "3"})
    assert out.returncode == 0, out.stderr[-3000:]
    # per-rank batch 6: rank 1 fails at 6, both ranks move to 3 (accumulation 2)
    assert "rank 0 micro 3 accum 2" in out.stdout and "rank 1 micro 3 accum 2" in out.stdout
    assert load(tmp_path, "auto", 0).state["training"]["batch"]["micro"] == 3


def test_sigterm_to_torchrun_commits_one_step_on_both_ranks_and_resumes_identical(tmp_path):
    import signal
    import time

    from skygreen.checkpoint.manifest import committed_steps, read_manifest
    from skygreen.checkpoint.store_factory import open_store

    env = {"DDP_TEST_STEP_SLEEP_S": "0.05"}
    ref = torchrun(tmp_path, "ref", "3", env=env)
    assert ref.returncode == 0, ref.stderr[-3000:]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SKYGREEN_")}
    # Both ranks commit step 2 and wait there: the SIGTERM cannot land after the run finished.
    full_env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), SKYGREEN_TEST_HOLD_AT_STEPS="2", **env)
    cmd = [
        str(TORCHRUN),
        "--standalone",
        "--nproc-per-node",
        "2",
        str(SCRIPT),
        str(tmp_path),
        "victim",
        str(STEPS),
        "3",
    ]
    proc = subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    store = open_store(f"{tmp_path}/victim")
    deadline = time.monotonic() + 300
    while not committed_steps(store):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    assert proc.poll() is None, proc.communicate()  # held at step 2
    proc.send_signal(signal.SIGTERM)  # torchrun forwards it to both ranks
    _out, err = proc.communicate(timeout=120)
    last = max(committed_steps(store))
    manifest = read_manifest(store, last)
    assert manifest.meta["state"] == "preempted", (last, err[-3000:])
    assert last == 3 and manifest.world_size == 2  # the boundary after the held step
    assert {"rank00000.pt", "rank00001.pt"} <= set(manifest.blobs)
    # torchrun itself exits with its own failure code (the rendered run script maps a
    # SIGTERM'd non-zero exit to PREEMPTED_EXIT_CODE); its workers committed first.
    assert proc.returncode != 0 and manifest.meta["preemptions"] == 1
    resumed = torchrun(tmp_path, "victim", "3", env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for rank in (0, 1):
        a, b = load(tmp_path, "ref", rank), load(tmp_path, "victim", rank)
        assert (
            first_difference(a.state, b.state, ignore=IGNORE | {"state['training']['counters']['preemptions']"}) is None
        )
        assert first_difference(a.rank_state, b.rank_state) is None
