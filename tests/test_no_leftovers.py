"""No process outlives its run.

torchrun starts each worker in a session of its own, so a SIGKILL of the job's process group (a
local preemption) ends its agent only. Each rank asks the kernel to die with its parent
(`skygreen.runtime.parent`), and the local launcher finds every process of a job by the mark in
its environment: `status` reads STOPPED only once none lives, and `cancel` leaves none, even
when its grace runs out.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from helpers import user_env, wait_for
from local_runs import launch_log, skygreen, status
from skygreen.launch.launcher import JobState
from skygreen.launch.local_launcher import JOB_MARK_ENV, LocalLauncher, marked_pids
from skygreen.runtime.hold import HOLD_ENV, RELEASE_ENV
from skygreen.runtime.parent import die_with_parent

REPO = Path(__file__).resolve().parents[1]

# A parent that starts a child in a session of its own (as torchrun starts its workers), prints
# the child's pid, and waits; the child ignores SIGTERM when told to (a worker stuck in a step).
ESCAPING_CHILD = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""
WORKER = "import signal, time\n{ignore}\nprint('ready', flush=True)\ntime.sleep(600)\n"


def escaping_job(launcher: LocalLauncher, tmp_path: Path, *, ignore_sigterm: bool) -> tuple[str, int]:
    """A job whose run line leaves a worker outside its process group; (job id, worker pid)."""
    (tmp_path / "parent.py").write_text(ESCAPING_CHILD)
    worker = WORKER.format(ignore="signal.signal(signal.SIGTERM, signal.SIG_IGN)" if ignore_sigterm else "")
    (tmp_path / "worker.py").write_text(worker)
    run = f'{sys.executable} parent.py "$(cat worker.py)"'
    job_id = launcher.launch({"run": run, "workdir": str(tmp_path)}, name="escaping")
    log = launcher.root / job_id / "output.log"
    wait_for(lambda: log.read_text().count("ready") == 1, "the worker to start")
    return job_id, int(log.read_text().split()[0])


def test_a_worker_outside_the_group_keeps_the_job_running_until_it_ends(tmp_path):
    launcher = LocalLauncher(tmp_path / "jobs")
    job_id, worker = escaping_job(launcher, tmp_path, ignore_sigterm=False)
    mark = json.loads((launcher.root / job_id / "job.json").read_text())["mark"]
    assert worker in marked_pids(JOB_MARK_ENV, mark)
    os.killpg(int(launcher.pid(job_id) or 0), signal.SIGKILL)  # what a local preemption does
    wait_for(lambda: (launcher.status(job_id).detail or "").startswith("processes outside"), "the group to be gone")
    assert launcher.status(job_id).state is JobState.RUNNING  # not STOPPED while a worker trains
    os.kill(worker, signal.SIGKILL)
    wait_for(lambda: launcher.status(job_id).state is JobState.STOPPED, "the job to read as stopped")


def test_cancel_ends_every_marked_process_even_when_its_grace_runs_out(tmp_path):
    launcher = LocalLauncher(tmp_path / "jobs", cancel_grace_s=1.0)
    job_id, worker = escaping_job(launcher, tmp_path, ignore_sigterm=True)
    mark = json.loads((launcher.root / job_id / "job.json").read_text())["mark"]
    launcher.cancel(job_id)
    assert marked_pids(JOB_MARK_ENV, mark) == [] and not _alive(worker)
    assert launcher.status(job_id).state is JobState.CANCELLED


def test_a_rank_dies_with_its_parent_and_a_lone_process_does_not(tmp_path):
    code = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import os, time; from skygreen.runtime.parent import die_with_parent; "
        "print(die_with_parent(os.environ), flush=True); time.sleep(600)'], start_new_session=True)\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    for world, dies in (("2", True), ("1", False)):
        parent = subprocess.Popen(
            [sys.executable, "-c", code],
            env={**os.environ, "WORLD_SIZE": world},
            stdout=subprocess.PIPE,
            text=True,
        )
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == str(dies)
        parent.kill()
        parent.wait(timeout=60)
        if dies:
            wait_for(partial(_gone, child), "the rank to die with its parent")
        else:
            assert _alive(child)
            os.kill(child, signal.SIGKILL)
            wait_for(partial(_gone, child), "the lone process to end")
    assert not die_with_parent({})  # a single process started by a shell is left alone


def _gone(pid: int) -> bool:
    return not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


# ---------------------------------------------------------------- a torchrun task, end to end
# (its smoke test runs both ranks: rank 1 loads once rank 0 has committed, and checks its own state)


@pytest.mark.slow
def test_a_two_rank_torchrun_run_smokes_then_killed_by_group_leaves_no_worker_and_resumes_bit_identical(
    private_home, tmp_path
):
    env = user_env(private_home, TINY_STEPS="30", TINY_EVAL_EVERY="10")
    task = tmp_path / "tinyddp.yaml"
    task.write_text(
        f"name: tinyddp\nworkdir: {REPO / 'tasks'}\n"
        "skygreen: {gpus: [T4], precision: fp32, batch: {effective: 32, micro: 8}, checkpoint: {every: 10, keep: 2}}\n"
        "run: torchrun --standalone --nproc_per_node=2 tiny.py\n"
    )
    reference = skygreen(env, "up", str(task), "--local")  # the smoke test on, with both ranks
    assert reference.returncode == 0, reference.stdout[-3000:] + reference.stderr[-3000:]
    assert "smoke test passed: 2 steps on 2 ranks, micro-batch 2 x 2 accumulation, fp32" in reference.stdout
    (first,) = json.loads(skygreen(env, "status", "--json").stdout)
    assert first["completed"] and first["model_sha256"]

    release = tmp_path / "release"
    release.mkdir()
    held = {**env, HOLD_ENV: "20", RELEASE_ENV: str(release)}
    started = skygreen(held, "up", str(task), "--local", "--no-smoke", "--detach")
    assert started.returncode == 0, started.stderr
    run_id = next(
        r["run_id"] for r in json.loads(skygreen(env, "status", "--json").stdout) if r["run_id"] != first["run_id"]
    )

    def held_at_20() -> bool:
        s = status(env, run_id)
        assert s["state"] == "RUNNING", f"the run ended ({s['state']}) before step 20"
        return s["step"] == 20 and launch_log(env, run_id).count("held at step 20 (") == 2

    wait_for(held_at_20, "both ranks held at step 20")
    record = json.loads((Path(env["XDG_DATA_HOME"]) / "skygreen" / "runs" / run_id / "run.json").read_text())
    launch = record["launches"][-1]
    job = Path(env["XDG_DATA_HOME"]) / "skygreen" / "local-jobs" / launch["job_id"] / "job.json"
    mark = json.loads(job.read_text())["mark"]
    assert len(marked_pids(JOB_MARK_ENV, mark)) >= 4  # wrapper, agent, two workers
    os.killpg(launch["pid"], signal.SIGKILL)  # a local preemption: the group status shows
    wait_for(lambda: status(env, run_id)["state"] == "STOPPED", "the run to read as stopped")
    assert marked_pids(JOB_MARK_ENV, mark) == []  # no worker of the first life trains on

    resumed = skygreen(env, "resume", run_id)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    after = status(env, run_id)
    assert after["completed"] and after["step"] == 30
    assert after["model_sha256"] == first["model_sha256"]  # bit-identical at the same world size
