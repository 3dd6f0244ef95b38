"""The CPU smoke test: two real steps of the user's script before paying for a GPU.

`run_smoke` runs the task's own `run` command on this machine, in the task's workdir, with
the settings of a throw-away run (a temporary local bucket) and `SKYGREEN_SMOKE=1`. Under
that variable the runtime trains on CPU with a tiny micro-batch in fp32 (or CPU bf16), stops
after two optimizer steps, saves a checkpoint, loads it back, checks every tensor came back
equal, prints one line and exits 0; a failure prints which step broke (forward, backward,
optimizer, save, load) and the error, and exits non-zero.

This module runs on the laptop (`skygreen up`, `skygreen smoke`): it imports no torch.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from skygreen.errors import SmokeTestError
from skygreen.task.checks import load_task
from skygreen.task.settings import SMOKE_ENV, SMOKE_FAILED, SMOKE_LINE, TASK_SIZE_ENV, RuntimeSettings
from skygreen.task.spec import TaskSpec

DEFAULT_TIMEOUT_S = 600.0
# What SkyPilot sets on a one-node, one-GPU cluster, so `torchrun --nproc-per-node
# $SKYPILOT_NUM_GPUS_PER_NODE ...` run commands start one CPU process here.
_SKYPILOT_SINGLE_NODE = {
    "SKYPILOT_NUM_NODES": "1",
    "SKYPILOT_NODE_RANK": "0",
    "SKYPILOT_NODE_IPS": "127.0.0.1",
    "SKYPILOT_NUM_GPUS_PER_NODE": "1",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class SmokeResult:
    """A smoke test that passed: the runtime's result line, the script's wall time in seconds, and its output."""

    line: str
    """The runtime's one-line result, e.g. 'skygreen smoke: ok: 2 steps, ...'."""
    duration_s: float
    output: str
    """Everything the script printed (stdout and stderr), for the curious."""

    @property
    def passed_line(self) -> str:
        """`up`'s line for the smoke test that ran before the launch: what it ran, on how many ranks."""
        return f"smoke test passed: {self.line.removeprefix(SMOKE_LINE).lstrip(': ')} ({self.duration_s:.1f} s)"


def run_smoke(
    task: TaskSpec | str | os.PathLike[str],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    environ: Mapping[str, str] | None = None,
) -> SmokeResult:
    """Smoke-test a task's training script on CPU; raises `SmokeTestError` on failure."""
    spec = task if isinstance(task, TaskSpec) else load_task(task)
    command = spec.sky.get("run")
    if not command:
        raise SmokeTestError("the task has no `run` command to smoke-test\n  fix: add `run: python train.py`")
    workdir = _workdir(spec)
    if spec.green.trainer == "folder":  # the wrapper stops the script after its first checkpoint folder
        command = f"python -m skygreen.folder_mode -- {shlex.quote(str(command))}"
    else:
        check_uses_skygreen(str(command), workdir)
    bucket = tempfile.mkdtemp(prefix="skygreen-smoke-")
    try:
        env = _environment(spec, bucket, os.environ if environ is None else environ)
        return _run(str(command), workdir, env, timeout_s)
    finally:
        shutil.rmtree(bucket, ignore_errors=True)


def check_uses_skygreen(command: str, workdir: Path) -> None:
    """Fail at once, with the fix, when the command's Python script (and the modules beside it)
    never mention skygreen: such a script would train for its whole run and never run a smoke
    test. A command whose script cannot be found is left to the run itself."""
    try:
        words = shlex.split(command)
    except ValueError:
        return
    scripts = [workdir / w for w in words if w.endswith(".py") and (workdir / w).is_file()]
    if not scripts:
        return
    neighbours = {p for script in scripts for p in script.parent.glob("*.py")}
    for path in sorted(neighbours):
        try:
            if "skygreen" in path.read_text(encoding="utf-8", errors="replace"):
                return
        except OSError:
            return
    raise SmokeTestError(
        f"smoke test: {scripts[0].name} does not use skygreen, so nothing would checkpoint it and the smoke "
        "test could not stop it early\n"
        "  fix: train through skygreen.runtime.Run; or, for an HF Trainer or Lightning script, add "
        "`callbacks=[SkygreenCallback()]` from skygreen.integrations.transformers / .lightning; or, for any "
        "script that saves checkpoint folders, set `checkpoint: {dir: FOLDER}` in the task (the folder mode)"
    )


def _workdir(spec: TaskSpec) -> Path:
    base = Path(spec.source).resolve().parent if spec.source else Path.cwd()
    raw = spec.sky.get("workdir")
    if raw is None or isinstance(raw, Mapping):  # a git workdir: the task file's folder stands in
        return base
    path = Path(str(raw)).expanduser()
    path = path if path.is_absolute() else base / path
    if not path.is_dir():
        raise SmokeTestError(
            f"workdir: {path} is not a directory\n  fix: point workdir at the folder holding the training script"
        )
    return path


def _environment(spec: TaskSpec, bucket: str, environ: Mapping[str, str]) -> dict[str, str]:
    settings = RuntimeSettings.from_spec(spec.green, run_id=f"smoke-{os.getpid()}-{int(time.time())}", bucket=bucket)
    env = dict(environ)
    env.update(_SKYPILOT_SINGLE_NODE)
    env.update({str(k): str(v) for k, v in dict(spec.sky.get("envs") or {}).items() if v is not None})
    env.update(settings.to_env())
    env.pop("SKYGREEN_CLOUD", None)  # no preemption notices to poll on the laptop
    env[SMOKE_ENV] = "1"
    env.setdefault(TASK_SIZE_ENV, "small")
    # `python` in the run command means the interpreter skygreen runs in (its venv has torch).
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _run(command: str, workdir: Path, env: dict[str, str], timeout_s: float) -> SmokeResult:
    started = time.monotonic()
    try:
        proc = subprocess.run(
            ["bash", "-c", command], cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as e:
        raise SmokeTestError(
            f"smoke test: `{command}` did not finish within {timeout_s:.0f} s\n"
            "  fix: make sure the script builds skygreen.runtime.Run and iterates run.steps(...)"
        ) from e
    duration_s = time.monotonic() - started
    output = proc.stdout + proc.stderr
    line = _find(output, SMOKE_LINE)
    if proc.returncode == 0 and line:
        return SmokeResult(line=line, duration_s=duration_s, output=output)
    failed = _find(output, SMOKE_FAILED)
    if failed:
        raise SmokeTestError(f"{failed}\n  command: {command} (in {workdir})")
    if proc.returncode == 0:
        raise SmokeTestError(
            f"smoke test: `{command}` exited 0 without running the skygreen runtime's smoke test\n"
            "  fix: train through skygreen.runtime.Run (docs/runtime.md), add skygreen's "
            "callback to an HF or Lightning Trainer, or set checkpoint.dir for the folder mode "
            "(docs/trainers.md)"
        )
    tail = "\n".join("    " + ln for ln in output.strip().splitlines()[-8:])
    fix = ""
    if "ModuleNotFoundError" in output:
        # The smoke test runs the script on this machine: a laptop with only `pip install
        # skygreen` has no torch, nor the script's own packages.
        fix = (
            "\n  fix: install what the script imports on this machine (pip install 'skygreen[runtime]' "
            "and the task's own requirements), or skip the smoke test with --no-smoke"
        )
    raise SmokeTestError(
        f"smoke test: `{command}` failed before training started (exit {proc.returncode}):\n{tail}{fix}"
    )


def _find(output: str, prefix: str) -> str | None:
    for line in output.splitlines():
        if line.startswith(prefix):
            return line.strip()
    return None
