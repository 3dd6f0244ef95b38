"""A real local run of tasks/tiny.py checkpointing to an az:// bucket on Azurite, through the
`skygreen` command: killed with SIGKILL at a checkpoint, resumed, and ended with exactly the
weights of an uninterrupted run, as the local, S3 and GCS runs do."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import user_env, wait_for
from skygreen.checkpoint.store_factory import open_store
from skygreen.runtime.hold import HOLD_ENV, RELEASE_ENV

REPO = Path(__file__).resolve().parents[1]
SKYGREEN = [sys.executable, "-m", "skygreen.cli"]
HOLD_STEP = 20

pytestmark = pytest.mark.slow


def skygreen(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SKYGREEN, *args], env=env, capture_output=True, text=True, timeout=600, cwd=cwd)


def status(env: dict[str, str], cwd: Path, run_id: str | None = None) -> Any:
    out = skygreen(env, cwd, "status", *([run_id] if run_id else []), "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def tiny_task(folder: Path, bucket: str) -> Path:
    """tasks/tiny.yaml with its checkpoints in `bucket`, beside a copy of its script."""
    folder.mkdir()
    shutil.copy(REPO / "tasks" / "tiny.py", folder / "tiny.py")
    text = (REPO / "tasks" / "tiny.yaml").read_text()
    path = folder / "tiny.yaml"
    path.write_text(
        text.replace("checkpoint: {every: 5s, keep: 3}", f"checkpoint: {{bucket: {bucket}, every: 5s, keep: 3}}")
    )
    assert bucket in path.read_text()
    return path


def test_an_azure_run_killed_with_sigkill_resumes_bit_identical(azure_bucket, private_home, tmp_path):
    bucket = f"az://{azure_bucket}/runs"
    task = tiny_task(tmp_path / "task", bucket)
    env = user_env(private_home, TINY_STEPS="40")
    assert "AZURE_STORAGE_CONNECTION_STRING" in env  # the Azurite fixture's, passed to the run as a user's would be

    reference = skygreen(env, tmp_path, "up", str(task), "--local", "--no-smoke")
    assert reference.returncode == 0, reference.stdout[-2000:] + reference.stderr[-2000:]
    (first,) = status(env, tmp_path)
    assert first["state"] == "SUCCEEDED" and first["model_sha256"]

    release = tmp_path / "release"
    release.mkdir()
    held = {**env, HOLD_ENV: str(HOLD_STEP), RELEASE_ENV: str(release)}
    started = skygreen(held, tmp_path, "up", str(task), "--local", "--no-smoke", "--detach")
    assert started.returncode == 0, started.stderr
    (run_id,) = [r["run_id"] for r in status(env, tmp_path) if r["run_id"] != first["run_id"]]
    record = Path(env["XDG_DATA_HOME"]) / "skygreen" / "runs" / run_id / "run.json"
    job = json.loads(record.read_text())["launches"][-1]
    log = Path(env["XDG_DATA_HOME"]) / "skygreen" / "local-jobs" / job["job_id"] / "output.log"
    wait_for(
        lambda: log.exists() and f"held at step {HOLD_STEP} (" in log.read_text(errors="replace"),
        f"the run held at step {HOLD_STEP}",
        poll_s=1.0,
    )
    os.killpg(job["pid"], signal.SIGKILL)  # the machine is gone: no SIGTERM, no last commit
    wait_for(lambda: status(env, tmp_path, run_id)["state"] == "STOPPED", "the run to read as stopped", poll_s=1.0)
    stopped = status(env, tmp_path, run_id)
    assert stopped["step"] == HOLD_STEP and not stopped["completed"]
    assert any(k.endswith(".json") for k in open_store(f"{bucket}/{run_id}").list("ckpt/"))

    (release / str(HOLD_STEP)).touch()
    final = skygreen(held, tmp_path, "resume", run_id)
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-2000:]
    logged = [int(line.split()[1]) for line in final.stdout.splitlines() if line.startswith("step ")]
    assert logged and logged[0] > HOLD_STEP  # continued from the Azure checkpoint, not from step 0
    done = status(env, tmp_path, run_id)
    assert done["state"] == "SUCCEEDED" and done["completed"] and done["launches"] == 2
    assert done["step"] == first["step"] and done["model_sha256"] == first["model_sha256"]
