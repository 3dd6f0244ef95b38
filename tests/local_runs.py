"""Following a `skygreen up --local` run from a test: the command, its status, its record on this
machine and the output of its latest launch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SKYGREEN = [sys.executable, "-m", "skygreen.cli"]


def skygreen(env: dict[str, str], *args: str, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
    """`skygreen ARGS` as a subprocess, output captured."""
    return subprocess.run([*SKYGREEN, *args], env=env, capture_output=True, text=True, timeout=timeout_s)


def status(env: dict[str, str], run_id: str) -> dict:
    """`skygreen status RUN --json`, which must succeed."""
    out = skygreen(env, "status", run_id, "--json", timeout_s=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def run_record(env: dict[str, str], run_id: str) -> dict:
    """The run's record on this machine (run.json)."""
    return json.loads((Path(env["XDG_DATA_HOME"]) / "skygreen" / "runs" / run_id / "run.json").read_text())


def launch_log(env: dict[str, str], run_id: str) -> str:
    """The output of the run's latest local launch so far."""
    job = run_record(env, run_id)["launches"][-1]["job_id"]
    path = Path(env["XDG_DATA_HOME"]) / "skygreen" / "local-jobs" / job / "output.log"
    return path.read_text(errors="replace") if path.exists() else ""
