"""The task file: a SkyPilot task YAML with one extra top-level section, `skygreen:`.

Everything SkyPilot knows stays SkyPilot's (`TaskSpec.sky`); skygreen reads its own section
into typed, frozen records with the defaults a user would expect, and rejects anything else
with a `SpecError` naming the field, the value, what is allowed and the likely intended name.

Example:

    name: bert-mlm
    skygreen:
      gpus: [A100, H100, L4, A10G]     # or {min_memory_gb: 24}
      gpu_count: 1
      clouds: [aws, gcp, azure]
      spot: true
      objective: cost                  # cost | time | energy | carbon
      work: {gpu_hours: 12, gpu: A100} # job size, in hours on one `gpu`
      max_price_per_hour: 4.0
      budget_usd: 60
      precision: auto                  # auto | bf16 | fp16 | fp32
      batch: {effective: 64, micro: auto}
      checkpoint: {bucket: s3://my-bucket/runs, every: auto, keep: 3}
      power: {cap: auto}               # auto | off | watts | fraction of the default limit
      early_stopping: {metric: val_loss, patience: 3, min_delta: 0.0}
      deadline: 36h                    # finish by then: spot with on-demand fallback
      model: {params: 7e9, activation_gb: 6, sharding: fsdp}   # keep only GPUs that hold it
    run: python train.py
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from skygreen.checkpoint.bucket_url import BUCKET_SCHEMES, canonical_url
from skygreen.checkpoint.keep import check_keep
from skygreen.errors import InputError, SpecError
from skygreen.task.declare import read_fields
from skygreen.task.gpu_fields import parse_clouds, parse_gpus, parse_speed, parse_work, work_notices
from skygreen.task.model_fields import parse_model
from skygreen.task.readers import (
    check_keys,
    parse_duration_s,
    read_choice,
    read_duration_h,
    read_int,
    read_mapping,
    read_number,
    read_str,
    type_name,
)
from skygreen.task.records import (
    CLOUDS,
    HALF_PRECISIONS,
    OBJECTIVES,
    PRECISIONS,
    SECTION,
    SKYPILOT_TASK_KEYS,
    TRAINERS,
    CheckpointSpec,
    GpuChoice,
    GreenSpec,
    ModelSpec,
    PowerSpec,
    PreemptionSpec,
    TaskSpec,
    Work,
)
from skygreen.task.sections import (
    EARLY_STOP_MODES,
    RECOVERY_STRATEGIES,
    Batch,
    BudgetAlertSpec,
    EarlyStopConfig,
    RecoverySpec,
)
from skygreen.task.yaml_lines import line_of, read_yaml

__all__ = [
    "BUCKET_SCHEMES",
    "CLOUDS",
    "EARLY_STOP_MODES",
    "HALF_PRECISIONS",
    "OBJECTIVES",
    "PRECISIONS",
    "RECOVERY_STRATEGIES",
    "SECTION",
    "SKYPILOT_TASK_KEYS",
    "TRAINERS",
    "Batch",
    "BudgetAlertSpec",
    "CheckpointSpec",
    "EarlyStopConfig",
    "GpuChoice",
    "GreenSpec",
    "ModelSpec",
    "PowerSpec",
    "PreemptionSpec",
    "RecoverySpec",
    "TaskSpec",
    "Work",
    "load_spec",
    "parse_spec",
    "parse_spec_text",
    "with_deadline",
]


# ---------------------------------------------------------------- loading


def load_spec(path: str | os.PathLike[str]) -> TaskSpec:
    """Read and validate a task file; every problem is an `InputError` (exit code 2)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(
            f"task file not found: {path}\n  fix: check the path, e.g. `skygreen plan tasks/tiny.yaml`"
        ) from None
    except IsADirectoryError:
        raise InputError(f"task file is a directory: {path}\n  fix: name the YAML file inside it") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read task file {path}: {e}") from e
    try:
        return parse_spec_text(text, source=str(path))
    except SpecError as e:
        line = None if e.field == "(file)" or e.field.startswith("line ") else line_of(text, e.field)
        raise e.with_source(str(path), line=line) from None


def parse_spec_text(text: str, *, source: str | None = None) -> TaskSpec:
    """Parse YAML 1.2 text into a `TaskSpec` (see `skygreen.task.yaml_lines` for why 1.2 and how)."""
    return parse_spec(read_yaml(text), source=source)


def parse_spec(data: Any, *, source: str | None = None) -> TaskSpec:
    """Validate an already-parsed task mapping."""
    if data is None:
        raise SpecError("(file)", "the task file is empty", hint="write a SkyPilot task with a `skygreen:` section")
    if not isinstance(data, Mapping):
        raise SpecError(
            "(file)",
            f"a task file must be a mapping of keys to values, got a {type_name(data)}",
            hint="start with `name: ...`, `skygreen: ...`, `run: ...`",
        )
    data = read_mapping(data, "(file)")
    check_keys(data, (SECTION, *SKYPILOT_TASK_KEYS), "")
    name = None if data.get("name") is None else read_str(data["name"], "name")
    num_nodes = 1 if data.get("num_nodes") is None else read_int(data["num_nodes"], "num_nodes", minimum=1)
    base_dir = Path(source).parent if source else Path.cwd()
    green = _parse_green(data.get(SECTION) or {}, SECTION, base_dir=base_dir)
    sky = {k: v for k, v in data.items() if k != SECTION}
    section = data.get(SECTION) or {}
    work_given = isinstance(section, Mapping) and section.get("work") is not None
    notices = work_notices(section["work"], green.work) if work_given else ()
    return TaskSpec(
        name=name, green=green, sky=sky, num_nodes=num_nodes, source=source, work_given=work_given, notices=notices
    )


# ---------------------------------------------------------------- sections


def _parse_green(raw: Any, path: str, *, base_dir: Path) -> GreenSpec:
    raw = read_mapping(raw, path)
    check_keys(raw, [k for k in GreenSpec.__dataclass_fields__ if k not in ("gpu_count_given", "trainer_given")], path)
    get = _getter(raw, path)
    values: dict[str, Any] = {
        "gpu_count_given": raw.get("gpu_count") is not None,
        "trainer_given": raw.get("trainer") is not None,
        **read_fields(GreenSpec, raw, path),  # the declared fields; below, those read their own way
    }
    get(values, "gpus", parse_gpus)
    get(values, "clouds", parse_clouds)
    get(values, "work", parse_work)
    get(values, "speed", parse_speed)
    get(values, "checkpoint", _parse_checkpoint)
    get(values, "power", _parse_power)
    get(values, "deadline", read_duration_h)
    get(values, "model", lambda v, p: parse_model(v, p, base_dir=base_dir))
    _check_trainer(values, path)
    spec = GreenSpec(**values)
    if not spec.spot and spec.on_demand_fallback:
        raise SpecError(
            f"{path}.on_demand_fallback",
            "only means something with spot: true",
            value=True,
            hint="remove on_demand_fallback, or set spot: true",
        )
    return spec


def _getter(raw: Mapping[str, Any], path: str):
    """`get(values, key, reader)` stores reader(raw[key]) when the key is present and not null."""

    def get(values: dict[str, Any], key: str, reader) -> None:
        if raw.get(key) is not None:
            values[key] = reader(raw[key], f"{path}.{key}")

    return get


def with_deadline(spec: TaskSpec, raw: Any, path: str) -> TaskSpec:
    """The task with its deadline set from a flag (`plan --deadline 36h`)."""
    green = dataclasses.replace(spec.green, deadline=read_duration_h(raw, path))
    return dataclasses.replace(spec, green=green)


def _parse_every(raw: Any, path: str) -> tuple[int | None, float | None]:
    """`auto`, an integer number of steps, or a duration such as `90s`, `5m`, `1h`."""
    if raw == "auto":
        return None, None
    if isinstance(raw, str):
        seconds = parse_duration_s(raw)
        if seconds is None:
            raise SpecError(
                path, "expected auto, a number of steps, or a duration", value=raw, allowed="auto | 500 | 90s | 5m | 1h"
            )
        if seconds <= 0:
            raise SpecError(path, "the interval must be greater than 0", value=raw)
        return None, seconds
    return read_int(raw, path, minimum=1), None


def _check_trainer(values: dict[str, Any], path: str) -> None:
    """`checkpoint.dir` means the folder mode: it cannot go with a loop skygreen drives itself."""
    folder = values.get("checkpoint", CheckpointSpec()).dir
    trainer = values.get("trainer")
    if folder is not None and trainer not in (None, "folder"):
        raise SpecError(
            f"{path}.checkpoint.dir",
            f"is the folder mode, and this task says `trainer: {trainer}`, which checkpoints through skygreen itself",
            value=folder,
            hint="remove checkpoint.dir (sg.Run and the trainer callbacks commit their own checkpoints), "
            "or set `trainer: folder` for a script that saves checkpoint folders on its own",
        )
    if trainer == "folder" and folder is None:
        raise SpecError(
            f"{path}.checkpoint.dir",
            "is required with `trainer: folder`: the folder the script saves its checkpoint folders into",
            hint="add e.g. `checkpoint: {dir: out, marker: trainer_state.json}`",
        )
    if folder is not None:
        values["trainer"] = "folder"


def _parse_checkpoint(raw: Any, path: str) -> CheckpointSpec:
    raw = read_mapping(raw, path)
    check_keys(
        raw, ("bucket", "buckets", "region", "every", "keep", "half_precision", "dir", "marker", "quiet_s"), path
    )
    values: dict[str, Any] = {}
    if raw.get("bucket") is not None:
        values["bucket"] = _parse_bucket(raw["bucket"], f"{path}.bucket")
    if raw.get("buckets") is not None:
        from skygreen.bill.bucket import parse_buckets

        values["bucket"] = parse_buckets(raw, path)
    if raw.get("region") is not None:
        from skygreen.bill.bucket import check_region

        values["region"] = check_region(values.get("bucket"), read_str(raw["region"], f"{path}.region"))
    if raw.get("every") is not None:
        values["every_steps"], values["every_s"] = _parse_every(raw["every"], f"{path}.every")
    if raw.get("keep") is not None:
        values["keep"] = check_keep(read_int(raw["keep"], f"{path}.keep", maximum=1000), f"{path}.keep")
    if raw.get("half_precision") not in (None, False):
        values["half_precision"] = read_choice(raw["half_precision"], f"{path}.half_precision", HALF_PRECISIONS)
    values.update(_parse_folder_mode(raw, path))
    return CheckpointSpec(**values)


def _parse_folder_mode(raw: Mapping[str, Any], path: str) -> dict[str, Any]:
    """`dir`, `marker` and `quiet_s`: where the script saves its checkpoint folders, and when one
    is complete. A relative `dir` stays relative to the task's workdir."""
    values: dict[str, Any] = {}
    if "dir" in raw:
        folder = read_str(raw["dir"], f"{path}.dir").strip()
        if ".." in Path(folder).parts:
            raise SpecError(f"{path}.dir", "may not leave the workdir with `..`", value=folder)
        values["dir"] = folder
    if raw.get("marker") is not None:
        marker = read_str(raw["marker"], f"{path}.marker").strip()
        if "/" in marker or marker in (".", ".."):
            raise SpecError(
                f"{path}.marker", "must be a file name inside each checkpoint folder", value=marker,
                hint="e.g. trainer_state.json (HF Trainer) or .metadata (torch.distributed.checkpoint)",
            )  # fmt: skip
        values["marker"] = marker
    if raw.get("quiet_s") is not None:
        values["quiet_s"] = read_number(raw["quiet_s"], f"{path}.quiet_s", positive=True)
    for key in ("marker", "quiet_s"):
        if key in values and "dir" not in values:
            raise SpecError(
                f"{path}.{key}",
                "only means something with checkpoint.dir (the folder mode)",
                value=values[key],
                hint="add `dir:` naming the folder the script saves its checkpoint folders into, or remove it",
            )
    if "marker" in values and "quiet_s" in values:
        raise SpecError(
            f"{path}.quiet_s",
            "and checkpoint.marker both say when a folder is complete; give one",
            value=values["quiet_s"],
        )
    return values


def _parse_bucket(raw: Any, path: str) -> str:
    """The bucket through the one URL parser the stores use, so the task file takes exactly
    the buckets a run can open."""
    return canonical_url(read_str(raw, path), field=path)


def _parse_power(raw: Any, path: str) -> PowerSpec:
    raw = read_mapping(raw, path)
    check_keys(raw, ("cap", "required", "eta"), path)
    extra = read_fields(PowerSpec, raw, path)  # required, eta; the cap is read below
    cap = raw.get("cap", "auto")
    cap_path = f"{path}.cap"
    if cap is False or cap == "off":
        return PowerSpec(mode="off", **extra)
    if cap is None or cap == "auto":
        return PowerSpec(mode="auto", **extra)
    value = read_number(cap, cap_path, positive=True)
    if value <= 1.0:
        if value < 0.3:
            raise SpecError(
                cap_path,
                "a power cap below 30% of the default limit stalls training",
                value=cap,
                hint="use a fraction between 0.3 and 1.0, or watts",
            )
        return PowerSpec(mode="fraction", cap_fraction=value, **extra)
    if value < 50 or value > 1500:
        raise SpecError(
            cap_path,
            "watts must be between 50 and 1500",
            value=cap,
            allowed="auto | off | watts (50-1500) | fraction (0.3-1.0)",
        )
    return PowerSpec(mode="watts", cap_w=value, **extra)
