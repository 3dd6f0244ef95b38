"""Checks on the whole task that no single field can make, run when a task file is loaded.

These rules reach past the `skygreen:` section (whose own rules sit on its records, `rules()`)
or look ahead to the VM: the batch against the ranks (`num_nodes` is SkyPilot's), the run
command against the node layout, the trainer the script implies, bf16 against the named GPUs,
and the SkyPilot keys skygreen owns. `plan`, `up`, `smoke` and `resume` all read a task through
`load_task`, so they stop on the same errors before anything starts, not on a paid VM.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Mapping
from pathlib import Path

import msgspec

from skygreen.errors import SpecError
from skygreen.gpus import GPUS
from skygreen.task.spec import TaskSpec, load_spec
from skygreen.training_script import ScriptUse, read_script_use

_PYTHON = ("python", "python3")

OWNED_RESOURCE_KEYS: dict[str, str] = {
    "accelerators": "skygreen.gpus and skygreen.gpu_count",
    "gpus": "skygreen.gpus and skygreen.gpu_count",
    "instance_type": "skygreen.gpus",
    "infra": "skygreen.clouds and skygreen.regions",
    "cloud": "skygreen.clouds",
    "region": "skygreen.regions",
    "zone": "skygreen.regions",
    "any_of": "skygreen.gpus, skygreen.clouds and skygreen.regions",
    "ordered": "skygreen.gpus, skygreen.clouds and skygreen.regions",
    "use_spot": "skygreen.spot",
    "job_recovery": "skygreen.recovery",
    "spot_recovery": "skygreen.recovery",
}
"""`resources:` keys skygreen sets from the plan, and the `skygreen:` field to use instead."""


def load_task(path: str | os.PathLike[str]) -> TaskSpec:
    """Read a task file and check it whole, each error naming the file and the line."""
    return load_spec(path, then=checked_task)


def checked_task(spec: TaskSpec) -> TaskSpec:
    """The task with its trainer read from the script, once every check passes."""
    spec = with_script_trainer(spec)
    check_task(spec)
    return spec


def check_task(spec: TaskSpec) -> None:
    """Raise the first `SpecError` the task would meet later, in rendering or at run time."""
    check_run(spec)
    check_resources(spec)
    check_envs(spec)
    check_batch(spec)
    check_precision(spec)


def check_run(spec: TaskSpec) -> None:
    """`run` must be a non-blank command; with more than one rank (gpu_count or num_nodes above 1)
    it must also be one torchrun can start (`torchrun_program`). A `SpecError` on `run` otherwise."""
    command = spec.sky.get("run")
    if command is None or not isinstance(command, str) or not command.strip():
        raise SpecError(
            "run", "is required: the command that trains", value=command, hint="add e.g. `run: python train.py`"
        )
    if spec.green.gpu_count > 1 or spec.num_nodes > 1:
        torchrun_program(command.strip(), spec)  # raises when the command cannot be started with torchrun


def torchrun_program(command: str, spec: TaskSpec) -> str | None:
    """What follows `python` in a one-line `python SCRIPT|-m MODULE ARGS` command, for the
    renderer to start with torchrun; None when the command calls torchrun itself. Anything
    else cannot be rewritten safely: a `SpecError` on `run`."""
    words = _one_line_words(command)
    if words and words[0] == "torchrun":
        return None
    if len(words) < 2 or (Path(words[0]).name not in _PYTHON and not Path(words[0]).name.startswith("python3.")):
        where = "skygreen.gpu_count" if spec.green.gpu_count > 1 else "num_nodes"
        raise SpecError(
            "run",
            f"with {where} > 1 skygreen starts the command with torchrun, which needs a one-line `python SCRIPT ARGS` command",
            value=command,
            hint="write `run: python train.py ...`, or call torchrun yourself",
        )
    return shlex.join(words[1:])


def _one_line_words(command: object) -> list[str]:
    """The words of a one-line command (comment lines aside); none for more lines or bad quoting."""
    lines = [line for line in str(command or "").splitlines() if line.strip() and not line.strip().startswith("#")]
    try:
        return shlex.split(lines[0]) if len(lines) == 1 else []
    except ValueError:
        return []


def check_resources(spec: TaskSpec) -> None:
    """`resources:` may not set a key skygreen chooses from the plan (`OWNED_RESOURCE_KEYS`); the
    error names the `skygreen:` field to set instead."""
    resources = spec.sky.get("resources")
    if resources is None:
        return
    if not isinstance(resources, Mapping):
        raise SpecError("resources", "expected a mapping (SkyPilot's resources section)", value=resources,
                        hint="write its keys indented under resources:, e.g. disk_size: 256")  # fmt: skip
    for key, owner in OWNED_RESOURCE_KEYS.items():
        if key in resources:
            raise SpecError(
                f"resources.{key}",
                "is chosen by skygreen from the plan",
                value=resources[key],
                hint=f"remove resources.{key}; set {owner} instead",
            )


def check_envs(spec: TaskSpec) -> None:
    """`envs:` may not set a variable skygreen sets for every run (`settings.env_names`), and gives
    each a value (an empty string counts). The renderer runs it again on the task it renders."""
    envs = spec.sky.get("envs")
    if envs is None:
        return
    if not isinstance(envs, Mapping):
        raise SpecError("envs", "expected a mapping of names to values", value=envs,
                        hint="write one NAME: value per line, indented under envs:")  # fmt: skip

    from skygreen.task.settings import env_names  # only for a task that sets envs: off the plan path

    ours = env_names()  # the runtime's contract
    for key, value in envs.items():
        if str(key) in ours:
            raise SpecError(
                f"envs.{key}",
                "is set by skygreen for every run",
                value=value,
                hint="remove it; set the matching field of the skygreen: section instead",
            )
        if value is None:
            raise SpecError(f"envs.{key}", "has no value", hint=f'give it a value, or an empty string: {key}: ""')


def check_batch(spec: TaskSpec) -> None:
    """The runtime splits `effective` evenly over gpu_count x num_nodes ranks, and each rank's
    share into micro-batches of `micro`: both divisions must be exact."""
    batch = spec.green.batch
    if batch.effective is None:
        check_batch_given_in_code(spec)
        return
    ranks = spec.green.gpu_count * spec.num_nodes
    layout = f"gpu_count {spec.green.gpu_count} x num_nodes {spec.num_nodes}"
    if batch.effective % ranks:
        raise SpecError(
            "skygreen.batch.effective",
            f"does not divide evenly across {ranks} ranks ({layout})",
            value=batch.effective,
            hint=f"use a multiple of {ranks}, e.g. {max(ranks, round(batch.effective / ranks) * ranks)}",
        )
    per_rank = batch.effective // ranks
    if batch.micro is not None and per_rank % batch.micro:
        divisors = [d for d in range(1, per_rank + 1) if per_rank % d == 0]
        raise SpecError(
            "skygreen.batch.micro",
            f"does not divide the per-rank batch {per_rank} (effective {batch.effective} / {ranks} ranks, {layout})",
            value=batch.micro,
            allowed=", ".join(map(str, divisors)) + " or auto" if len(divisors) <= 16 else None,
            hint=f"use micro: {max(d for d in divisors if d <= batch.micro)}, or micro: auto",
        )


def with_script_trainer(spec: TaskSpec) -> TaskSpec:
    """The task with `trainer:` read from its script when the task names none, so a trainer's
    checks apply with or without the key; a named trainer the script plainly contradicts is a
    `SpecError`. The folder mode and scripts whose use is unclear are left as they are."""
    green = spec.green
    if green.trainer == "folder":
        return spec
    found = script_use(spec)
    if found is None or found[0].trainer is None:
        return spec
    use, script = found
    trainer = use.trainer or green.trainer
    if green.trainer_given and green.trainer != trainer:
        uses = (
            "calls skygreen.runtime.Run" if use.trainer == "runtime" else f"imports skygreen.integrations.{use.trainer}"
        )
        raise SpecError(
            "skygreen.trainer",
            f"says {green.trainer}, and {script.name} {uses}",
            value=green.trainer,
            hint=f"set `trainer: {trainer}`, or remove the key (skygreen reads it from the script)",
        )
    return dataclasses.replace(spec, green=msgspec.structs.replace(green, trainer=trainer))


def script_use(spec: TaskSpec) -> tuple[ScriptUse, Path] | None:
    """What the run's script does with skygreen (`training_script.read_script_use`) and its path;
    None when the run is not a `python SCRIPT` line or the script cannot be read here."""
    script = _run_script(spec)
    if script is None:
        return None
    try:
        return read_script_use(script.read_text(encoding="utf-8")), script
    except (OSError, UnicodeDecodeError):
        return None


def check_batch_given_in_code(spec: TaskSpec) -> None:
    """Without `batch.effective` a script that calls `Run` must pass `effective_batch=`, or the
    runtime stops before its first step. A trainer that owns its loop sets its own batch; a
    script whose use is unclear is left to the smoke test."""
    if spec.green.trainer != "runtime":
        return
    found = script_use(spec)
    if found is None or not found[0].run_without_batch:
        return
    raise SpecError(
        "skygreen.batch.effective",
        f"is not set, and {found[1].name} does not pass effective_batch= to Run: the runtime would stop "
        "before its first step",
        hint="add `batch: {effective: 64}` under skygreen: (samples per optimizer step, over all GPUs)",
    )


def _run_script(spec: TaskSpec) -> Path | None:
    """The Python file a one-line `python SCRIPT ...` run starts, in the task's workdir; None otherwise."""
    words = _one_line_words(spec.sky.get("run"))
    if len(words) < 2 or not Path(words[0]).name.startswith("python") or not words[1].endswith(".py"):
        return None
    base = Path(spec.source).resolve().parent if spec.source else Path.cwd()
    workdir = spec.sky.get("workdir")
    if isinstance(workdir, str):
        base = base / Path(workdir).expanduser()
    elif workdir is not None:
        return None  # a git workdir: not on this machine
    path = base / words[1]
    return path if path.is_file() else None


def check_precision(spec: TaskSpec) -> None:
    """bf16 needs bf16 tensor cores (Ampere and newer); a named GPU without them would fail
    at start-up on the VM. (Without a list, the planner only ranks GPUs that have them.)"""
    lacking = [name for name in spec.green.gpus.names or () if spec.green.precision == "bf16" and not GPUS[name].bf16]
    if lacking:
        raise SpecError(
            "skygreen.precision",
            f"bf16 needs bf16 tensor cores (Ampere and newer), which {', '.join(lacking)} lack",
            value="bf16",
            hint=f"remove {', '.join(lacking)} from skygreen.gpus, or use precision: auto (bf16 where the GPU has it, fp16 elsewhere)",
        )
