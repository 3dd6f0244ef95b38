"""Errors the task file could have caught appear before anything starts, from every command.

A micro-batch that does not divide the per-rank batch, an effective batch that does not
split across gpu_count x num_nodes ranks, bf16 on GPUs without bf16, a missing `run:`,
`resources.accelerators` beside `skygreen.gpus`: `plan`, `up`, `up --dryrun` and `smoke`
all refuse the task with the same `file.yaml: field: ...` error and exit 2, and nothing is
launched or written. A run that does fail shows one line as its state, never a traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import user_env
from skygreen.api import plan
from skygreen.gpus import GPUS
from skygreen.launch.local_launcher import failure_line
from skygreen.task.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
CATALOG = REPO / "tests" / "data" / "catalog" / "v8"
SKYGREEN = [sys.executable, "-m", "skygreen.cli"]


@pytest.fixture
def env(private_home):
    return user_env(private_home)


def skygreen(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SKYGREEN, *args], env=env, capture_output=True, text=True, timeout=300, cwd=REPO)


def write(tmp_path: Path, green: dict, **top) -> Path:
    task = {
        "name": "checks",
        "skygreen": {"checkpoint": {"bucket": str(tmp_path / "bucket")}, **green},
        "run": "python train.py",
        **top,
    }
    task = {k: v for k, v in task.items() if v is not None}
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(task, sort_keys=False))
    (tmp_path / "train.py").write_text("raise SystemExit('the training script must not run')\n")
    return path


COMMANDS = [
    ("plan", "--catalog", str(CATALOG)),
    ("up", "--catalog", str(CATALOG)),
    ("up", "--dryrun", "--catalog", str(CATALOG)),
    ("up", "--local"),
    ("smoke",),
]
BAD_TASKS: dict[str, tuple[dict, dict, str]] = {
    "micro does not divide the per-rank batch": (
        {"batch": {"effective": 64, "micro": 7}},
        {},
        "skygreen.batch.micro: does not divide the per-rank batch 64",
    ),
    "effective does not split over the ranks": (
        {"gpu_count": 4, "batch": {"effective": 30}},
        {},
        "skygreen.batch.effective: does not divide evenly across 4 ranks",
    ),
    "micro against gpu_count x num_nodes": (
        {"gpu_count": 2, "batch": {"effective": 64, "micro": 32}},
        {"num_nodes": 2},
        "per-rank batch 16 (effective 64 / 4 ranks",
    ),
    "bf16 on a GPU without it": (
        {"gpus": ["A100", "T4"], "precision": "bf16"},
        {},
        "skygreen.precision: bf16 needs bf16 tensor cores",
    ),
    "no run command": ({}, {"run": None}, "run: is required"),
    "accelerators beside skygreen.gpus": (
        {"gpus": ["L4"]},
        {"resources": {"accelerators": "A100:1"}},
        "resources.accelerators: is chosen by skygreen",
    ),
    "skygreen's own env var": ({}, {"envs": {"SKYGREEN_RUN_ID": "mine"}}, "envs.SKYGREEN_RUN_ID: is set by skygreen"),
    "a count in words": (
        {"gpu_count": "two"},
        {},
        (
            "skygreen.gpu_count: expected an integer, got a string (line 5)\n  got: 'two'\n"
            "  fix: write a whole number without quotes, e.g. gpu_count: 2"
        ),
    ),
}


@pytest.mark.parametrize("case", list(BAD_TASKS), ids=list(BAD_TASKS))
def test_every_command_refuses_the_task_before_anything_starts(env, tmp_path, case):
    green, top, expected = BAD_TASKS[case]
    path = write(tmp_path, green, **top)
    for command, *flags in COMMANDS:
        out = skygreen(env, command, str(path), *flags)
        assert out.returncode == 2, (command, out.stdout + out.stderr)
        assert out.stderr.startswith(f"error: {path}: "), (command, out.stderr)
        assert expected in out.stderr and "fix:" in out.stderr and "Traceback" not in out.stderr, (command, out.stderr)
    assert not (Path(env["XDG_DATA_HOME"]) / "skygreen").exists()  # no run, no dry-run YAML, nothing


def test_a_runtime_script_without_an_effective_batch_is_refused_up_front(env, tmp_path):
    path = write(tmp_path, {"gpus": ["T4"]})
    (tmp_path / "train.py").write_text("import skygreen.runtime as sg\nrun = sg.Run(model=m, optimizer=o, dataset=d)\n")
    for command, *flags in COMMANDS:
        out = skygreen(env, command, str(path), *flags)
        assert out.returncode == 2, (command, out.stdout + out.stderr)
        assert out.stderr.startswith(
            f"error: {path}: skygreen.batch.effective: is not set, and train.py does not pass effective_batch= to Run"
        ), (command, out.stderr)
        assert "fix: add `batch: {effective: 64}` under skygreen:" in out.stderr and "Traceback" not in out.stderr
    assert not (Path(env["XDG_DATA_HOME"]) / "skygreen").exists()
    # the same script passing it in code, or a script that does not use the runtime, is planned
    (tmp_path / "train.py").write_text("import skygreen.runtime as sg\nrun = sg.Run(effective_batch=64)\n")
    assert skygreen(env, "plan", str(path), "--catalog", str(CATALOG)).returncode == 0
    (tmp_path / "train.py").write_text("print('my own loop')\n")
    assert skygreen(env, "plan", str(path), "--catalog", str(CATALOG)).returncode == 0


def test_a_job_size_beyond_plausibility_is_planned_with_a_warning(env, tmp_path):
    path = write(tmp_path, {"gpus": ["T4"], "work": {"gpu_hours": 1e7, "gpu": "T4"}})
    out = skygreen(env, "plan", str(path), "--catalog", str(CATALOG))
    assert out.returncode == 0, out.stderr
    said = " ".join((out.stdout + out.stderr).split())
    assert "skygreen.work.gpu_hours: 1e+07 GPU-hours is 1,141 years on one T4, above the plausible 100,000" in said
    sane = write(tmp_path, {"gpus": ["T4"], "work": {"gpu_hours": 5e4, "gpu": "T4"}})
    assert "above the plausible" not in skygreen(env, "plan", str(sane), "--catalog", str(CATALOG)).stdout


def test_a_micro_batch_error_names_what_would_divide():
    from skygreen.errors import SpecError

    with pytest.raises(SpecError) as info:
        from skygreen.task.checks import check_task
        from skygreen.task.spec import parse_spec

        check_task(parse_spec({"skygreen": {"batch": {"effective": 64, "micro": 7}}, "run": "python t.py"}))
    assert "allowed: 1, 2, 4, 8, 16, 32, 64 or auto" in str(info.value) and "micro: 4" in str(info.value)


def test_bf16_without_a_gpu_list_plans_only_gpus_that_have_it(tmp_path):
    spec = load_spec(write(tmp_path, {"precision": "bf16"}))
    offered = {c.accelerator for c in plan(spec, catalog_dir=CATALOG).candidates}
    assert offered and all(GPUS[name].bf16 for name in offered)
    assert {c.accelerator for c in plan(load_spec(write(tmp_path, {})), catalog_dir=CATALOG).candidates} - offered


def test_a_failed_run_shows_one_line_as_its_state_not_a_traceback(env, tmp_path):
    (tmp_path / "boom.py").write_text("def step():\n    raise ValueError('loss is nan at step 3')\n\nstep()\n")
    task = tmp_path / "boom.yaml"
    task.write_text("name: boom\nrun: python boom.py\n")
    out = skygreen(env, "up", str(task), "--local", "--no-smoke")
    assert out.returncode == 1
    (state,) = [line for line in out.stdout.splitlines() if line.startswith("state")]
    assert state.split(None, 1)[1] == "FAILED - exit code 1: ValueError: loss is nan at step 3"
    (row,) = json.loads(skygreen(env, "status", "--json").stdout)
    assert "Traceback" not in row["detail"] and "\n" not in row["detail"]


def test_the_failure_line_is_the_exception_of_the_last_traceback():
    chained = (
        "step 10\nTraceback (most recent call last):\n  File \"a.py\", line 1, in <module>\n    x()\nKeyError: 'a'\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        'Traceback (most recent call last):\n  File "a.py", line 3, in <module>\n'
        "skygreen.errors.RuntimeSetupError: micro-batch 7 does not divide the per-rank batch 64\n  fix: choose a divisor\n"
    )
    assert failure_line(chained) == "RuntimeSetupError: micro-batch 7 does not divide the per-rank batch 64"
    assert failure_line("all fine\nerror: out of disk\n") == "error: out of disk"
    assert failure_line("") is None
