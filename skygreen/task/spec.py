"""The task file: a SkyPilot task YAML with one extra top-level section, `skygreen:`.

Everything SkyPilot knows stays SkyPilot's (`TaskSpec.sky`); skygreen reads its own section
into typed, frozen records with the defaults a user would expect, and rejects anything else
with a `SpecError` naming the field, the value, what is allowed and the likely intended name.
Every key, with an example task, is in docs/reference/task-file.md.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from skygreen.errors import InputError, SpecError
from skygreen.task.declare import read_record
from skygreen.task.gpu_fields import CLOUDS, work_notices
from skygreen.task.model_fields import TASK_FOLDER, ModelSpec
from skygreen.task.readers import check_keys, read_duration_h, read_int, read_mapping, read_str, type_name
from skygreen.task.records import OBJECTIVES, PRECISIONS, SECTION, SKYPILOT_TASK_KEYS, TRAINERS, GreenSpec, TaskSpec
from skygreen.task.sections import HALF_PRECISIONS, RECOVERY_STRATEGIES, Batch, EarlyStopConfig
from skygreen.task.yaml_lines import line_of, read_yaml

__all__ = [
    "CLOUDS", "HALF_PRECISIONS", "OBJECTIVES", "PRECISIONS", "RECOVERY_STRATEGIES", "TRAINERS", "Batch",
    "EarlyStopConfig", "GreenSpec", "ModelSpec", "TaskSpec", "load_spec", "parse_spec", "parse_spec_text",
    "with_deadline",
]  # fmt: skip
"""The task file's face: reading it, and the records and names the rest of skygreen reads it by
(every record is in `skygreen.task.records` and `skygreen.task.sections`)."""


# ---------------------------------------------------------------- loading


def load_spec(path: str | os.PathLike[str], *, then: Callable[[TaskSpec], TaskSpec] | None = None) -> TaskSpec:
    """Read and validate a task file, and pass it through `then` (the whole task's checks); every
    problem is an `InputError` (exit code 2) naming the file and the line."""
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
        spec = parse_spec_text(text, source=str(path))
        return then(spec) if then is not None else spec
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
    section = read_mapping(data.get(SECTION) or {}, SECTION)
    given = {
        "gpu_count_given": section.get("gpu_count") is not None,
        "trainer_given": section.get("trainer") is not None,
    }
    folder = TASK_FOLDER.set(Path(source).parent if source else Path.cwd())
    try:
        green = typing.cast(GreenSpec, read_record(GreenSpec, section, SECTION, also=given))
    finally:
        TASK_FOLDER.reset(folder)
    work_given = section.get("work") is not None
    notices = work_notices(section["work"], green.work) if work_given else ()
    sky = {k: v for k, v in data.items() if k != SECTION}
    return TaskSpec(
        name=name, green=green, sky=sky, num_nodes=num_nodes, source=source, work_given=work_given, notices=notices
    )


def with_deadline(spec: TaskSpec, raw: Any, path: str) -> TaskSpec:
    """The task with its deadline set from a flag (`plan --deadline 36h`)."""
    green = msgspec.structs.replace(spec.green, deadline=read_duration_h(raw, path))
    return dataclasses.replace(spec, green=green)
