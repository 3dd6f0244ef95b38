"""One writer per run, end to end: real `skygreen` commands and real trainings of tasks/tiny.py.

- A local run whose job wrapper alone is killed (`kill -9` of the pid `status` shows) keeps
  training: `status` reads it as running while any process of its group is left, `resume`
  refuses to start a second trainer, and `cancel` stops the trainer itself.
- A second life started while the first still trains (a cloud VM its controller gave up on,
  through the fake launcher; both "VMs" are real processes here): the newer life takes the
  lease, the older one commits nothing more, deletes nothing, and exits 3 with a line saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import user_env, wait_for
from skygreen.checkpoint.manifest import committed_steps, latest_manifest
from skygreen.checkpoint.store_factory import open_store
from skygreen.exit_codes import SUPERSEDED
from skygreen.launch.launcher import JobState
from skygreen.runtime.hold import HOLD_ENV, RELEASE_ENV
from skygreen.testing import FakeLauncher

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tasks" / "tiny.yaml"
SKYGREEN = [sys.executable, "-m", "skygreen.cli"]
CATALOG = str(REPO / "tests" / "data" / "catalog" / "v8")

pytestmark = pytest.mark.slow


def skygreen(env, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*SKYGREEN, *args], env=env, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)


def status(env, run_id: str) -> dict:
    out = skygreen(env, "status", run_id, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def group_left(pgid: int) -> bool:
    """Whether a live process of the group is left (zombies left unreaped by init do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def local_log(env, job_id: str) -> str:
    path = Path(env["XDG_DATA_HOME"]) / "skygreen" / "local-jobs" / job_id / "output.log"
    return path.read_text(errors="replace") if path.exists() else ""


def test_killing_the_wrapper_alone_leaves_a_running_run_that_cancel_stops(private_home, tmp_path):
    release = tmp_path / "release"
    release.mkdir()
    env = user_env(private_home, TINY_STEPS="300")
    held = {**env, HOLD_ENV: "40", RELEASE_ENV: str(release)}
    started = skygreen(held, "up", str(TINY), "--local", "--no-smoke", "--detach")
    assert started.returncode == 0, started.stderr
    (run,) = json.loads(skygreen(env, "status", "--json").stdout)
    run_id, job_id = run["run_id"], run["job_id"]
    assert job_id == f"{run_id}-1"  # the job's name carries the run and its launch number

    def at_40():
        s = status(env, run_id)
        assert s["state"] == "RUNNING", f"the run ended ({s['state']}) before step 40"
        return s["step"] == 40 and "held at step 40 (" in local_log(env, job_id)

    wait_for(at_40, "the run held at step 40")
    wrapper = int(status(env, run_id)["detail"].split()[-1])  # "pid N", what a user would kill
    os.kill(wrapper, signal.SIGKILL)
    wait_for(lambda: "process group" in (status(env, run_id)["detail"] or ""), "the wrapper to be gone")

    after = status(env, run_id)
    assert after["state"] == "RUNNING" and group_left(wrapper)  # the trainer goes on
    refused = skygreen(env, "resume", run_id, "--detach")
    assert refused.returncode == 2 and "only a stopped run can be resumed" in refused.stderr
    assert "Traceback" not in refused.stderr

    cancelled = skygreen(env, "cancel", run_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert not group_left(wrapper)  # the trainer itself was stopped, not just marked
    done = status(env, run_id)
    assert done["state"] == "CANCELLED" and done["step"] >= 40  # its final checkpoint on SIGTERM
    resumed = skygreen(env, "resume", run_id)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert status(env, run_id)["completed"]


def vm(fake: FakeLauncher, job_id: str, env: dict[str, str], hold_at: str, release: Path) -> subprocess.Popen:
    """Run the job's task as its VM would (setup left out: the runtime is installed here)."""
    task = fake.job(job_id)["task"]
    envs = {k: str(v) for k, v in (task.get("envs") or {}).items()}
    vm_env = {**env, **envs, HOLD_ENV: hold_at, RELEASE_ENV: str(release), "PYTHONUNBUFFERED": "1"}
    vm_env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), vm_env.get("PATH", "")])
    return subprocess.Popen(
        ["bash", "-c", task["run"]], cwd=task["workdir"], env=vm_env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip


def test_a_second_life_started_while_the_first_trains_fences_the_first(private_home, tmp_path, moto_server, s3_bucket):
    fake_dir = tmp_path / "fake-sky"
    env = user_env(private_home, TINY_STEPS="200", SKYGREEN_LAUNCHER="skygreen.testing:FakeLauncher")
    env.update({k: v for k, v in os.environ.items() if k.startswith("AWS_")}, SKYGREEN_FAKE_LAUNCHER_DIR=str(fake_dir))
    task = tmp_path / "tiny.yaml"
    spec = yaml.safe_load(TINY.read_text())
    spec["skygreen"]["checkpoint"]["bucket"] = f"s3://{s3_bucket}/runs"
    spec["workdir"] = str(REPO / "tasks")
    task.write_text(yaml.safe_dump(spec))
    shutil.copy(REPO / "tasks" / "tiny.py", tmp_path / "tiny.py")
    up = skygreen(env, "up", str(task), "--no-smoke", "--catalog", CATALOG)
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
    (run,) = json.loads(skygreen(env, "status", "--json").stdout)
    run_id = run["run_id"]
    fake = FakeLauncher(fake_dir)
    assert fake.job("1")["name"] == f"{run_id}-1" and fake.job("1")["task"]["envs"]["SKYGREEN_LAUNCH"] == "1"

    release = tmp_path / "release"
    release.mkdir()
    store = open_store(f"s3://{s3_bucket}/runs/{run_id}")
    first = vm(fake, "1", env, "40,60", release)
    try:
        wait_for(lambda: 40 in committed_steps(store) or first.poll() is not None, "the first VM at step 40")
        assert first.poll() is None, first.communicate()[0][-3000:]
        # The controller gives up on the first VM, which goes on training; the user resumes.
        fake.set_state("1", JobState.FAILED, failure_reason="controller lost the VM")
        resumed = skygreen(env, "resume", run_id)
        assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
        assert fake.job("2")["name"] == f"{run_id}-2" and fake.job("2")["task"]["envs"]["SKYGREEN_LAUNCH"] == "2"
        second = vm(fake, "2", env, "80", release)
        wait_for(lambda: 80 in committed_steps(store) or second.poll() is not None, "the second VM at step 80")
        assert second.poll() is None, second.communicate()[0][-3000:]

        (release / "40").touch()  # the first VM trains on to step 60 and tries to commit there
        out = first.communicate(timeout=300)[0]
        assert first.returncode == SUPERSEDED, out[-3000:]
        assert "launch 1 of this run is superseded: a newer launch (launch 2" in out
        assert "Traceback" not in out
        assert 60 not in committed_steps(store) and 80 in committed_steps(store)  # nothing of launch 2 deleted

        (release / "80").touch()
        rest = second.communicate(timeout=300)[0]
        assert second.returncode == 0, rest[-3000:]
    finally:
        for proc in (first, locals().get("second")):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert "retention: deleted checkpoint steps" not in out
    final = latest_manifest(store)
    assert final is not None and final.meta["state"] in ("completed",) and final.step > 80
