"""A text task killed with SIGKILL mid-epoch resumes through its shard stream, on a "new machine".

`tasks/gpt2.py` at `SKYGREEN_TASK_SIZE=small`, through the real `skygreen up --local` and
`skygreen resume`: the first launch tokenizes and packs once; the run is held at step 10 (a
checkpoint first, `skygreen.runtime.hold`), killed outright, and resumed with an empty data
cache, as a preempted run lands on a new VM. The resume streams the shards instead of
preprocessing again and ends with exactly the weights of an uninterrupted run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import user_env
from test_local_e2e import held, kill_training, runs, skygreen, status, wait_for, wait_for_step

REPO = Path(__file__).resolve().parents[1]
SKYGREEN = [sys.executable, "-m", "skygreen.cli"]

pytestmark = pytest.mark.slow


@pytest.fixture
def env(private_home, tmp_path):
    return user_env(private_home, SKYGREEN_TASK_SIZE="small", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")


def gpt2_task(tmp_path: Path) -> Path:
    """tasks/gpt2.yaml with checkpoints every 5 steps and 20 steps in all, so the test is short."""
    task = tmp_path / "gpt2-short.yaml"
    task.write_text(
        f"name: gpt2-short\nworkdir: {REPO / 'tasks'}\n"
        "skygreen:\n  precision: fp32\n  batch: {effective: 16, micro: 8}\n  checkpoint: {every: 5, keep: 3}\n"
        "run: python gpt2.py --steps 20\n"
    )
    return task


def test_gpt2_killed_mid_epoch_resumes_from_the_shards_on_a_new_machine(env, tmp_path):
    task = gpt2_task(tmp_path)
    vm1 = {**env, "SKYGREEN_DATA_CACHE": str(tmp_path / "vm1-cache")}
    release = tmp_path / "release"
    gated = held(vm1, release, "10")
    first = subprocess.Popen([*SKYGREEN, "up", str(task), "--local", "--no-smoke", "--detach"], env=gated, cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    assert first.wait(timeout=300) == 0, first.stdout.read() if first.stdout else ""
    (run,) = runs(env)
    run_id = run["run_id"]
    wait_for_step(env, run_id, 10)  # 160 of ~1,900 blocks: mid-epoch
    kill_training(env, run_id)
    first_log = skygreen(env, "logs", run_id)
    assert re.search(r"data fineweb-edu-10bt-gpt2: prepared \d+ rows in", first_log.stdout + first_log.stderr)

    vm2 = {**env, "SKYGREEN_DATA_CACHE": str(tmp_path / "vm2-cache")}  # a new machine: empty cache
    resumed = skygreen(vm2, "resume", run_id)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-2000:]
    out = resumed.stdout + resumed.stderr
    assert "data fineweb-edu-10bt-gpt2: streaming" in out, out[-3000:]
    assert not re.search(r"prepared \d+ rows in", out), "the resume preprocessed again"
    assert list((tmp_path / "vm2-cache").glob("*/00000.input_ids.npy")), "the shards did not stream into the new cache"
    done = status(env, run_id)
    assert done["state"] == "SUCCEEDED" and done["completed"] and done["step"] == 20

    reference = skygreen(
        {**env, "SKYGREEN_DATA_CACHE": str(tmp_path / "vm3-cache")}, "up", str(task), "--local", "--no-smoke"
    )
    assert reference.returncode == 0, reference.stdout[-2000:] + reference.stderr[-2000:]
    ref = wait_for(lambda: [r for r in runs(env) if r["run_id"] != run_id], "the reference run")[0]
    assert ref["completed"] and ref["step"] == 20
    assert done["model_sha256"] == ref["model_sha256"]
