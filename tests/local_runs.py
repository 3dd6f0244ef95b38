"""Running what users run from a test: a `skygreen up --local` run (the command, its status, its
record on this machine and the output of its latest launch), and the example tasks whose loop a
framework drives (HF `Trainer`, Lightning) started as `skygreen up` starts them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from helpers import user_env, wait_for
from skygreen.checkpoint.folders import committed_folder_steps
from skygreen.checkpoint.store import Store
from skygreen.task.settings import RuntimeSettings

SKYGREEN = [sys.executable, "-m", "skygreen.cli"]
TASKS = Path(__file__).resolve().parents[1] / "tasks"


def skygreen(env: dict[str, str], *args: str, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
    """`skygreen ARGS` as a subprocess, output captured."""
    return subprocess.run([*SKYGREEN, *args], env=env, capture_output=True, text=True, timeout=timeout_s)


def status(env: dict[str, str], run_id: str) -> dict:
    """`skygreen status RUN --json`, which must succeed."""
    out = skygreen(env, "status", run_id, "--json", timeout_s=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def status_agrees_with_cost(
    env: dict[str, str], run_id: str, *, preemptions: int, model: bool = True, interval: bool = True
) -> dict:
    """`status --json` of a finished run says what `cost --json` says (preemptions, completion,
    facility energy and CO2e, each from the one computation in `skygreen.ledger.energy`), and
    names the model it ended with (`model`) and its checkpoint interval (`interval`, which a
    step cadence has none of); returns the status."""
    shown = status(env, run_id)
    out = skygreen(env, "cost", run_id, "--json", timeout_s=120)
    assert out.returncode == 0, out.stderr
    costed = json.loads(out.stdout)
    assert shown["preemptions"] == costed["preemptions"] == preemptions, (shown, costed["preemptions"])
    assert shown["completed"] is True and costed["completed"] is True
    for key in ("energy_kwh", "co2e_kg"):
        assert shown[key] == costed[key], (key, shown[key], costed[key])
    assert not model or shown["model_sha256"], shown
    assert not interval or shown["checkpoint_interval_s"] is not None, shown
    return shown


def run_record(env: dict[str, str], run_id: str) -> dict:
    """The run's record on this machine (run.json)."""
    return json.loads((Path(env["XDG_DATA_HOME"]) / "skygreen" / "runs" / run_id / "run.json").read_text())


def launch_log(env: dict[str, str], run_id: str) -> str:
    """The output of the run's latest local launch so far."""
    job = run_record(env, run_id)["launches"][-1]["job_id"]
    path = Path(env["XDG_DATA_HOME"]) / "skygreen" / "local-jobs" / job / "output.log"
    return path.read_text(errors="replace") if path.exists() else ""


# ---------------------------------------------------------------- a framework's script, run by a test


SCRIPT_SAVES_ONLY = 1_000_000
"""A `checkpoint.every` in steps that no test's run reaches: the callbacks add no save of their own."""


@dataclass(frozen=True, kw_only=True)
class TrainerTask:
    """One of the example tasks whose loop a framework drives (tasks/hf_trainer.py,
    tasks/lightning_task.py), as the tests run it: small, on CPU, a few checkpoints."""

    name: str
    trainer: str
    """`skygreen.trainer` of the task (`transformers`, `lightning`)."""
    script: str
    task_file: str
    run_id: str
    final: Path
    """The file the script writes once training ends, relative to its working folder."""
    short: dict[str, str]
    """Environment that makes a short run: its length and save interval."""
    first_commit: int
    """The step of the first checkpoint the short run saves."""
    last_commit: int
    """The step of the last one (the end of the short run)."""
    restore_parent: Path
    """Where the callback restores checkpoint folders, relative to the working folder."""
    saved_files: str
    """Where the script saved the files of the checkpoint folder `{folder}` (as committed)."""

    def workdir(self, tmp_path: Path, name: str) -> Path:
        """A fresh working folder holding the task's script and task file."""
        work = tmp_path / name
        work.mkdir()
        shutil.copy(TASKS / self.script, work / self.script)
        shutil.copy(TASKS / self.task_file, work / self.task_file)
        return work

    def env(self, tmp_path: Path, bucket: Path | str, **extra: str) -> dict[str, str]:
        """The environment `skygreen up` would give the script, with the short run's length,
        a bucket keeping 2 checkpoints, only the script's own saves (`checkpoint.every` beyond
        the run's length, so the commits fall where a test expects them whatever the machine's
        speed), and `extra` last."""
        settings = RuntimeSettings(run_id=self.run_id, bucket=str(bucket), checkpoint_keep=2, trainer=self.trainer,
                                   checkpoint_every_steps=SCRIPT_SAVES_ONLY)  # fmt: skip
        env = user_env(tmp_path / "home")
        env.update({"SKYGREEN_TASK_SIZE": "small", **self.short, **settings.to_env(), **extra})
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    def train(self, work: Path, env: dict[str, str]) -> subprocess.Popen[str]:
        """The script, started as `skygreen up` starts a task's `run:` command, output together."""
        return subprocess.Popen([sys.executable, self.script], cwd=work, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip

    def weights(self, work: Path) -> dict:
        """The final weights the script wrote, by name."""
        path = work / self.final
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        import torch

        return torch.load(path, weights_only=True)


HF_TASK = TrainerTask(
    name="hf", trainer="transformers", script="hf_trainer.py", task_file="hf-trainer.yaml",
    run_id="hf-20260101-000000-abcd", final=Path("out/hf-trainer/final/model.safetensors"),
    short={"HF_MAX_STEPS": "12", "HF_SAVE_STEPS": "4"}, first_commit=4, last_commit=12,
    restore_parent=Path("out/hf-trainer"), saved_files="out/hf-trainer/{folder}",
)  # fmt: skip
LIGHTNING_STEPS_PER_EPOCH = 8
"""256 samples in batches of 32 (SKYGREEN_TASK_SIZE=small); Lightning's task saves at each epoch end."""
LIGHTNING_TASK = TrainerTask(
    name="lightning", trainer="lightning", script="lightning_task.py", task_file="lightning.yaml",
    run_id="lt-20260101-000000-abcd", final=Path("out/lightning/final.pt"),
    short={"LT_EPOCHS": "3"}, first_commit=LIGHTNING_STEPS_PER_EPOCH, last_commit=3 * LIGHTNING_STEPS_PER_EPOCH,
    restore_parent=Path("skygreen-restored"), saved_files="out/lightning/checkpoints",
)  # fmt: skip


def finish(proc: subprocess.Popen[str], timeout_s: float = 900) -> str:
    """Wait for a script a test started; its output. One still running when the wait ends is
    killed with its process group when it leads one (`start_new_session=True`), else alone."""
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # not a group leader: no group has its id
                proc.kill()
            proc.communicate(timeout=60)
    return out


def wait_for_commit(proc: subprocess.Popen[str], store: Store, step: int, timeout_s: float = 900) -> None:
    """Gate: the commit of `step` is in the store while the script still runs (held there by
    `SKYGREEN_TEST_HOLD_AT_STEPS`); fails loudly when the script ended first."""
    wait_for(
        lambda: step in committed_folder_steps(store) or proc.poll() is not None, f"the commit of {step}", timeout_s
    )
    if proc.poll() is not None:
        raise AssertionError(f"the run ended before the test could act at step {step}:\n{finish(proc)[-3000:]}")


def same_weights(after: dict, before: dict) -> None:
    """Every tensor equal, bit for bit, with the same dtype."""
    assert after.keys() == before.keys()
    for name, tensor in before.items():
        assert after[name].dtype == tensor.dtype and bool((after[name] == tensor).all()), name
