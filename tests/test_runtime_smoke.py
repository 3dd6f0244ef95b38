"""The CPU smoke test, end to end: real subprocesses running real training scripts."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from skygreen.errors import SmokeTestError
from skygreen.launch.smoke import run_smoke

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tasks" / "tiny.yaml"

SCRIPT = """
import numpy as np
import torch
import torch.nn.functional as F
import skygreen.runtime as sg

BROKEN = {broken!r}
torch.manual_seed(0)
width = 5 if BROKEN == "forward" else 4
model = torch.nn.Sequential(torch.nn.Linear(width, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))

class Extra:
    def state_dict(self):
        return {{"counts": np.zeros(3)}} if BROKEN == "save" else {{"counts": [0, 0, 0]}}
    def load_state_dict(self, state):
        pass

run = sg.Run(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), dataset=data,
             extra_state={{"extra": Extra()}})
for step in run.steps(1000):
    with step:
        for x, y in step.micro_batches():
            with step.autocast():
                loss = F.cross_entropy(run.model(x), y)
            step.backward(loss.detach() if BROKEN == "backward" else loss)
        step.optimizer_step()
raise SystemExit("the smoke test should have ended the script")
"""


def write_task(folder: Path, *, broken: str = "", precision: str = "auto", run: str = "python train.py") -> Path:
    (folder / "train.py").write_text(SCRIPT.format(broken=broken))
    task = folder / "task.yaml"
    task.write_text(
        textwrap.dedent(
            f"""\
            name: smoke-test
            skygreen:
              precision: {precision}
              batch: {{effective: 64, micro: 16}}
            run: {run}
            """
        )
    )
    return task


def test_tiny_task_passes_through_the_cli():
    out = subprocess.run(
        [sys.executable, "-m", "skygreen.cli", "smoke", str(TINY)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("skygreen smoke: ok: 2 steps on 1 rank, micro-batch 2 x 2 accumulation, fp32")
    assert "checkpoint round trip" in out.stdout


def test_fp16_task_smokes_in_cpu_bf16(tmp_path):
    result = run_smoke(write_task(tmp_path, precision="fp16"))
    assert "bf16" in result.line and "2 steps" in result.line


@pytest.mark.parametrize(
    "broken, expected",
    [
        ("forward", "failed at forward: RuntimeError: mat1 and mat2 shapes cannot be multiplied"),
        ("backward", "failed at backward: RuntimeError: element 0 of tensors does not require grad"),
        ("save", "failed at save: CheckpointError:"),
    ],
)
def test_failure_names_the_step_and_the_error(tmp_path, broken, expected):
    with pytest.raises(SmokeTestError) as info:
        run_smoke(write_task(tmp_path, broken=broken))
    assert expected in str(info.value)


def test_failure_through_the_cli_exits_1_with_the_message(tmp_path):
    task = write_task(tmp_path, broken="forward")
    out = subprocess.run(
        [sys.executable, "-m", "skygreen.cli", "smoke", str(task)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 1
    assert out.stderr.startswith("error: skygreen smoke: failed at forward")
    assert "Traceback" not in out.stderr


def test_a_script_that_bypasses_the_runtime_is_reported(tmp_path):
    task = write_task(tmp_path, run="echo training without skygreen")
    with pytest.raises(SmokeTestError, match="without running the skygreen runtime's smoke test"):
        run_smoke(task)


def test_a_script_that_crashes_before_training_shows_its_output(tmp_path):
    task = write_task(tmp_path, run="python -c 'import nonexistent_module_xyz'")
    with pytest.raises(SmokeTestError, match="failed before training started") as info:
        run_smoke(task)
    assert "nonexistent_module_xyz" in str(info.value)
    assert "fix: install what the script imports on this machine" in str(info.value)  # e.g. a laptop without torch
    assert "--no-smoke" in str(info.value)
