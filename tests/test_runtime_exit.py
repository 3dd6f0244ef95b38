"""A skygreen error that a training script does not catch ends it as it ends the `skygreen`
command: one line with the fix, the error's exit code, no traceback (unless SKYGREEN_DEBUG=1).
Code that catches the error still gets it, and other exceptions keep their traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers import user_env
from skygreen.exit_codes import BAD_INPUT, FAILED
from skygreen.launch.local_launcher import failure_line

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import sys
import torch
import skygreen.runtime as sg
from skygreen.errors import RuntimeSetupError

model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.zeros(8, 2), torch.zeros(8, 1))
mode = sys.argv[1]
if mode == "catch":
    try:
        sg.Run(model=model, optimizer=optimizer, dataset=data, effective_batch=64, micro_batch=7)
    except RuntimeSetupError as e:
        print("caught:", str(e).splitlines()[0])
        sys.exit(0)
if mode == "other":
    sg.Run(model=model, optimizer=optimizer, dataset=data, effective_batch=8, micro_batch=8)
    raise ValueError("loss is nan")
sg.Run(model=model, optimizer=optimizer, dataset=data, effective_batch=64, micro_batch=7)
"""


def _script(tmp_path: Path, mode: str, debug: bool = False) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = user_env(tmp_path / "home", SKYGREEN_RUN_ID="exit-test", SKYGREEN_BUCKET=str(tmp_path / "bucket"))
    if debug:
        env["SKYGREEN_DEBUG"] = "1"
    return subprocess.run(
        [sys.executable, str(script), mode], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )


def test_an_uncaught_setup_error_is_one_line_with_its_fix_and_exit_2(tmp_path):
    out = _script(tmp_path, "raise")
    assert out.returncode == BAD_INPUT, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert "skygreen: RuntimeSetupError: " in out.stderr and "micro-batch 7" in out.stderr, out.stderr
    assert "fix:" in out.stderr
    line = failure_line(out.stdout + out.stderr)
    assert line is not None and line.startswith("RuntimeSetupError: "), line


def test_skygreen_debug_keeps_the_traceback(tmp_path):
    out = _script(tmp_path, "raise", debug=True)
    assert out.returncode == FAILED  # Python's own exit status for an uncaught exception
    assert "Traceback" in out.stderr and "RuntimeSetupError" in out.stderr, out.stderr


def test_code_that_catches_the_error_still_gets_it(tmp_path):
    out = _script(tmp_path, "catch")
    assert out.returncode == 0, out.stderr
    assert "caught: " in out.stdout and "micro-batch 7" in out.stdout


def test_other_exceptions_keep_their_traceback(tmp_path):
    out = _script(tmp_path, "other")
    assert out.returncode == FAILED
    assert "Traceback" in out.stderr and "ValueError: loss is nan" in out.stderr, out.stderr


def test_the_failure_line_is_whichever_came_last():
    ended = "step 3\nskygreen: CheckpointError: 3 checkpoints in a row failed\n  fix: check the bucket\n"
    assert failure_line(ended) == "CheckpointError: 3 checkpoints in a row failed"
    later = ended + "Traceback (most recent call last):\n  File \"a.py\", line 1\nKeyError: 'a'\n"
    assert failure_line(later) == "KeyError: 'a'"
    # a progress line of skygreen's is not an error
    assert failure_line("skygreen: run a completed at step 3\nboom\n") == "boom"


def test_status_shows_the_runtime_error_as_the_failed_runs_state(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    task = tmp_path / "task.yaml"
    task.write_text(
        f"name: exits\nskygreen: {{checkpoint: {{bucket: {tmp_path / 'bucket'}}}}}\nrun: python train.py raise\n"
    )
    env = user_env(tmp_path / "home")
    cli = [sys.executable, "-m", "skygreen.cli"]
    out = subprocess.run(
        [*cli, "up", str(task), "--local", "--no-smoke"], env=env, capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert out.returncode != 0, out.stdout + out.stderr
    (state,) = [line for line in out.stdout.splitlines() if line.startswith("state")]
    assert state.split(None, 1)[1].startswith("FAILED - exit code 2: RuntimeSetupError: micro-batch 7"), state
