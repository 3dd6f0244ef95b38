"""`skygreen demo`, run as a user runs it: the real command, piped, in a private HOME.

The demo kills its own run with SIGKILL at a held step and resumes it, so this checks the
whole path a newcomer sees: each stage's line, the run's end state and its counted
preemption and recovery, a real PNG plot and an HTML report with the energy statement, and
no ANSI codes in piped output.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import user_env
from skygreen.demo_view import skygreen_command
from skygreen.terminal import ANSI_ESCAPE

REPO = Path(__file__).resolve().parents[1]
SKYGREEN = [sys.executable, "-m", "skygreen.cli"]


@pytest.fixture
def env(private_home):
    return user_env(private_home)


@pytest.mark.slow
def test_demo_runs_every_stage_and_leaves_a_plot_and_a_report(env, tmp_path):
    folder = tmp_path / "demo"
    out = subprocess.run(
        [*SKYGREEN, "demo", "--dir", str(folder)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert not ANSI_ESCAPE.search(text + out.stderr), "piped output carries ANSI escape codes"

    for number, stage in enumerate(
        ("plan", "smoke test", "training", "preemption", "resume", "energy", "cost", "report"), start=1
    ):
        assert f"[{number}/8] {stage}\n" in text
    assert "prices from skygreen embedded price table (" in text  # the catalog, dated
    for cloud in ("aws", "gcp", "azure"):
        assert f"  {cloud} " in text
    assert "smoke test: skygreen smoke: ok" in text
    assert "on a simulated T4" in text
    assert "killed the training process group with SIGKILL at step 150" in text
    assert "early stopping: " in text
    assert "Energy statement: training run" in text and "simulated GPU" in text
    assert "preemptions 1:" in text

    run_id = next(line.split()[-1] for line in text.splitlines() if line.startswith("  run id "))
    status = subprocess.run(
        [*SKYGREEN, "status", run_id, "--json"],
        env={**env, "SKYGREEN_DATA_DIR": str(folder)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 0, status.stderr
    final = json.loads(status.stdout)
    early = "early stopping: fired" in text
    assert final["state"] == "SUCCEEDED" and final["completed"]
    assert early or final["step"] == 300
    assert final["launches"] == 2 and final["recoveries"] == 1
    assert final["energy"]["method"] == "simulated"

    plot = folder / f"{run_id}-cost.png"
    report = folder / f"{run_id}-report.html"
    assert f"  plot         {plot}\n" in text and f"  report       {report}\n" in text
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 1000
    page = report.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "data:image/png;base64," in page
    assert f"Energy statement: training run {run_id}" in page
    for log in (folder / "local-jobs").glob(f"{run_id}-*/output.log"):
        assert f"  log          {log}\n" in text
    assert f"export SKYGREEN_DATA_DIR={folder}" in text
    assert "skygreen plan YOUR_TASK.yaml" in text and "skygreen simulate" in text

    # The hint's two lines run as printed, in a shell with this environment's PATH.
    lines = text.splitlines()
    hint = lines.index(f"  export SKYGREEN_DATA_DIR={folder}")
    script = "set -e\n" + lines[hint].strip() + "\n" + lines[hint + 1].strip() + "\n"
    shown = subprocess.run(["bash", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stdout[-2000:] + shown.stderr[-2000:]
    assert f"run            {run_id}" in shown.stdout and f"run {run_id}:" in shown.stdout
    assert (tmp_path / f"{run_id}-report.html").is_file()


def _entry_point(folder: Path) -> Path:
    """A `skygreen` entry point and an interpreter beside it, as a venv's bin folder holds them."""
    folder.mkdir(parents=True)
    for name in ("skygreen", "python"):
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(0o755)
    return folder


def test_the_printed_command_is_the_one_that_runs_this_installation(tmp_path):
    venv_bin = _entry_point(tmp_path / "proj" / ".venv" / "bin")
    other_bin = _entry_point(tmp_path / "elsewhere" / "bin")
    python = str(venv_bin / "python")

    activated = {"PATH": f"{venv_bin}:/usr/bin"}
    assert skygreen_command(environ=activated, executable=python, cwd=tmp_path / "proj") == "skygreen"
    # Not activated: the path, relative to where the user stands when it is under it.
    bare = {"PATH": "/usr/bin"}
    assert skygreen_command(environ=bare, executable=python, cwd=tmp_path / "proj") == ".venv/bin/skygreen"
    assert skygreen_command(environ=bare, executable=python, cwd=tmp_path / "elsewhere") == str(venv_bin / "skygreen")
    # Another installation's `skygreen` first on PATH: still this one's path.
    shadowed = {"PATH": f"{other_bin}:{venv_bin}"}
    assert skygreen_command(environ=shadowed, executable=python, cwd=tmp_path / "proj") == ".venv/bin/skygreen"
    # No entry point beside the interpreter: the module, through this interpreter.
    (venv_bin / "skygreen").unlink()
    assert skygreen_command(environ=activated, executable=python, cwd=tmp_path) == f"{python} -m skygreen.cli"


def test_an_unknown_gpu_is_a_clear_error_before_anything_is_written(env, tmp_path):
    folder = tmp_path / "demo"
    out = subprocess.run([*SKYGREEN, "demo", "--gpu", "T5", "--dir", str(folder)], env=env, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.startswith("error: --gpu: not a GPU skygreen can simulate") and "'T5'" in out.stderr
    assert out.stderr.splitlines()[-1].startswith("  fix: ") and "T4" in out.stderr.splitlines()[-1]
    assert "Traceback" not in out.stderr and not folder.exists()
