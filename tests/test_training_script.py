"""The trainer a task uses is read from what its script does (imports, `Run(...)` calls), not
from the words in it: an HF `Trainer` script without `trainer:` or `batch:` is planned, a
`Run` without a batch is refused up front, and a script whose use is unclear is left to the
smoke test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import user_env
from skygreen.errors import SpecError
from skygreen.task.checks import load_task
from skygreen.training_script import ScriptUse, read_script_use

REPO = Path(__file__).resolve().parents[1]
CATALOG = REPO / "tests" / "data" / "catalog" / "v8"

HF_SCRIPT = """
from transformers import Trainer
from skygreen.integrations.transformers import SkygreenCallback

skygreen = SkygreenCallback()
trainer = Trainer(model=model, args=args, callbacks=[skygreen])
trainer.train(resume_from_checkpoint=skygreen.resume_from_checkpoint)
"""

LIGHTNING_SCRIPT = """
import lightning as L
from skygreen.integrations import lightning as sgl

trainer = L.Trainer(callbacks=[sgl.SkygreenCallback()])
"""

FOLDER_SCRIPT = """
import torch
for step in range(10):
    torch.save({}, f"out/checkpoint-{step}/weights.bin")
"""

COMMENT_SCRIPT = """
# trained with skygreen; see skygreen.runtime.Run(effective_batch=...) in the docs
print("my own loop")
"""


def test_an_hf_script_uses_the_transformers_trainer():
    assert read_script_use(HF_SCRIPT) == ScriptUse(trainer="transformers")


def test_a_lightning_script_uses_the_lightning_trainer():
    assert read_script_use(LIGHTNING_SCRIPT) == ScriptUse(trainer="lightning")
    assert read_script_use("import skygreen.integrations.lightning\n").trainer == "lightning"


def test_a_folder_mode_script_and_a_comment_say_nothing():
    assert read_script_use(FOLDER_SCRIPT) == ScriptUse()
    assert read_script_use(COMMENT_SCRIPT) == ScriptUse()
    assert read_script_use("def broken(:\n") == ScriptUse()


@pytest.mark.parametrize(
    ("source", "without_batch"),
    [
        ("import skygreen.runtime as sg\nrun = sg.Run(model=m, optimizer=o, dataset=d)\n", True),
        ("from skygreen.runtime import Run\ndef main():\n    return Run(model=m)\n", True),
        ("import skygreen.runtime\nskygreen.runtime.Run(model=m)\n", True),
        ("import skygreen.runtime as sg\nsg.Run(model=m, effective_batch=64)\n", False),
        ("import skygreen.runtime as sg\nsg.Run(**options)\n", False),
    ],
)
def test_a_run_call_is_the_runtime_with_or_without_a_batch(source, without_batch):
    assert read_script_use(source) == ScriptUse(trainer="runtime", run_without_batch=without_batch)


def test_a_run_that_is_not_skygreens_is_not_the_runtime():
    assert read_script_use("from myproject import Run\nRun(model=m)\n") == ScriptUse()


def _task(tmp_path: Path, script: str, **green) -> Path:
    (tmp_path / "train.py").write_text(script)
    task = {"name": "t", "skygreen": {"gpus": ["T4"], **green}, "run": "python train.py"}
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(task, sort_keys=False))
    return path


def test_the_trainer_is_read_from_the_script_when_the_task_names_none(tmp_path):
    assert load_task(_task(tmp_path, HF_SCRIPT)).green.trainer == "transformers"
    assert load_task(_task(tmp_path, LIGHTNING_SCRIPT)).green.trainer == "lightning"
    assert load_task(_task(tmp_path, COMMENT_SCRIPT)).green.trainer == "runtime"
    assert load_task(_task(tmp_path, FOLDER_SCRIPT, checkpoint={"dir": "out"})).green.trainer == "folder"


def test_a_named_trainer_the_script_contradicts_is_refused(tmp_path):
    with pytest.raises(SpecError) as caught:
        load_task(_task(tmp_path, HF_SCRIPT, trainer="lightning"))
    message = str(caught.value)
    assert "skygreen.trainer: says lightning, and train.py imports skygreen.integrations.transformers" in message
    assert "fix: set `trainer: transformers`" in message
    assert load_task(_task(tmp_path, HF_SCRIPT, trainer="transformers")).green.trainer == "transformers"


def test_plan_takes_an_hf_task_without_trainer_or_batch(private_home, tmp_path):
    path = _task(tmp_path, HF_SCRIPT)
    out = subprocess.run(
        [sys.executable, "-m", "skygreen.cli", "plan", str(path), "--catalog", str(CATALOG)],
        env=user_env(private_home),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_step_or_time_cadence_is_refused_in_the_folder_mode(tmp_path):
    for every in (500, "90s"):
        with pytest.raises(SpecError) as caught:
            load_task(_task(tmp_path, FOLDER_SCRIPT, checkpoint={"dir": "out", "every": every}))
        assert "task.yaml: skygreen.checkpoint.every: cannot be kept in the folder mode" in str(caught.value)
        assert "fix: remove checkpoint.every" in str(caught.value)
    assert (
        load_task(_task(tmp_path, FOLDER_SCRIPT, checkpoint={"dir": "out", "every": "auto"})).green.trainer == "folder"
    )


def test_plan_prices_the_cadence_each_trainer_keeps(tmp_path):
    from skygreen.plan.explain import assumptions
    from skygreen.plan.rank import run_model

    def cadence(script: str, **green) -> str:
        spec = load_task(_task(tmp_path, script, work={"gpu_hours": 1, "gpu": "T4"}, **green))
        (line,) = [a for a in assumptions(run_model(spec), spec.green) if "checkpoint " in a]
        return line

    # the callbacks ask their trainer to save on `checkpoint.every`, as sg.Run saves
    assert "checkpoint every 5 s," in cadence(LIGHTNING_SCRIPT, checkpoint={"every": "5s"})
    assert "checkpoint every 40 steps" in cadence(HF_SCRIPT, checkpoint={"every": 40})
    # the folder mode commits what the script saves, when it saves it
    assert "checkpoint on the script's own cadence, estimated as auto" in cadence(
        FOLDER_SCRIPT, checkpoint={"dir": "out"}
    )
