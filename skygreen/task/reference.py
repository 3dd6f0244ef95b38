"""Every key of the task file as a user writes it: type, default, allowed values and meaning.

The one source of docs/reference/task-file.md (generated when the site builds) and of the
`skygreen:` section's JSON Schema. The `skygreen:` rows come from the records' declarations
(`record_rows` walks `GreenSpec` and every record under it); only SkyPilot's own keys and the
`skygreen:` key itself are written here by hand. tests/test_docs_reference.py holds the rows to
the parser: every key it accepts has a row, and every row names a key it accepts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import msgspec

from skygreen.ledger.budget import DEFAULT_ALERT_FRACTIONS
from skygreen.task.declare import allowed_text, declared, field_schema, fields_of, is_record, type_text
from skygreen.task.records import GreenSpec

__all__ = ["RECORDS", "TASK_FIELDS", "TaskField", "default_text", "record_rows"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TaskField:
    """One key of the task file, as the reference lists it."""

    path: str
    """Dotted from the top of the file: `skygreen.checkpoint.keep`, `run`."""
    type: str
    """What a user writes: `integer`, `string`, `list of GPU names`, ..."""
    doc: str
    allowed: str = ""
    """Allowed values, ranges and units; empty when the type says it all."""
    default: str | None = None
    """The default as text; None reads it from the record the key lands in (`RECORDS`)."""
    schema: Mapping[str, Any] | None = None
    """The key's JSON Schema; None for SkyPilot's keys, whose schema is SkyPilot's own."""

    def __post_init__(self) -> None:
        if not self.path or self.path != self.path.strip() or " " in self.path:
            raise ValueError(f"TaskField.path must be a dotted key such as skygreen.keep, got {self.path!r}")
        if not self.type.strip():
            raise ValueError(f"TaskField {self.path}: give its type (what a user writes)")
        if not self.doc.strip():
            raise ValueError(f"TaskField {self.path}: give it a description (doc=)")

    @property
    def section(self) -> str:
        """The mapping the key sits in: `skygreen.checkpoint` for `skygreen.checkpoint.keep`, "" at the top."""
        return self.path.rpartition(".")[0]

    @property
    def key(self) -> str:
        """The key as written in its mapping: `keep`."""
        return self.path.rpartition(".")[2]


def _records(record: type, section: str) -> Iterator[tuple[str, type]]:
    yield section, record
    for field in declared(record):
        if is_record(field.hint):
            yield from _records(field.hint, f"{section}.{field.name}")


RECORDS: Mapping[str, type] = dict(_records(GreenSpec, "skygreen"))
"""The record each section of the task file is read into, where defaults are read from."""


def _value_text(value: Any) -> str:
    """A default as a user would write it in YAML."""
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_value_text(v) for v in value) + "]"
    if isinstance(value, msgspec.Struct):
        value = msgspec.structs.asdict(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_value_text(v)}" for k, v in value.items()) + "}"
    return str(value)


def default_text(field: TaskField) -> str:
    """The default a reader sees for `field`: its own text, else the record attribute's default.

    Raises:
        ValueError: `field` gives no default text and names no attribute of its section's record.
    """
    if field.default is not None:
        return field.default
    record = RECORDS.get(field.section)
    attribute = {f.name: f for f in fields_of(record)}.get(field.key) if record is not None else None
    if attribute is None:
        raise ValueError(f"TaskField {field.path}: no record attribute to read its default from; give default= text")
    return "required" if attribute.required else _value_text(attribute.default)


_COMPUTED_DEFAULTS: Mapping[str, str] = {
    "skygreen.budget_alerts": "alerts at " + ", ".join(f"{f:g}" for f in DEFAULT_ALERT_FRACTIONS),
    "skygreen.budget_alerts.at": "[" + ", ".join(f"{f:g}" for f in DEFAULT_ALERT_FRACTIONS) + "]",
}
"""Defaults kept where they are used (the ledger's alert fractions), not on the record."""


def record_rows(record: type, section: str) -> Iterator[TaskField]:
    """The rows of the fields declared on `record` (`skygreen.task.declare`) and, after each
    field that is a record itself, its fields' rows; each with its JSON Schema."""
    for field in declared(record):
        assert field.meta is not None  # declared() keeps only fields with a meaning
        path, nested = f"{section}.{field.name}", is_record(field.hint)
        off = field.extra.get("off")
        kind = (field.reader and field.reader.type) or type_text(field.hint)
        default = field.extra.get("default_text") or _COMPUTED_DEFAULTS.get(path)
        yield TaskField(
            path=path,
            type=kind + (" or auto" if field.extra.get("auto") else " or false" if off else ""),
            doc=str(field.meta.description),
            allowed=allowed_text(field),
            default=default or ("required" if field.required else _value_text(field.default)),
            schema=field_schema(record, field.name),
        )
        if nested:
            yield from record_rows(field.hint, path)


TASK_FIELDS: tuple[TaskField, ...] = (
    # ------------------------------------------------------------ SkyPilot's keys skygreen reads
    TaskField(
        path="name",
        type="string",
        default="not set (run ids start with `run`)",
        doc="The task's name. Run ids start with it (`tiny-20261201-063404-5c6d`), and the managed job is named after it.",
    ),
    TaskField(
        path="num_nodes",
        type="integer",
        allowed="1 or more",
        default="1",
        doc="Nodes per run, each with `skygreen.gpu_count` GPUs; more than one starts `run` with torchrun on every node. "
        "With `skygreen.model` and no `num_nodes`, the plan picks the node count that holds the model.",
    ),
    TaskField(
        path="run",
        type="string",
        default="required",
        doc="The command that trains. With more than one GPU or node it must be one line, `python SCRIPT ARGS`, "
        "which skygreen starts with torchrun (or a command that calls torchrun itself).",
    ),
    TaskField(
        path="workdir",
        type="string or mapping",
        default="the task file's folder",
        doc="The folder synced to the VM, relative to the task file; `smoke` and `up --local` run the command in it. "
        "A git workdir (`{url, ref}`) goes to SkyPilot as written.",
    ),
    TaskField(
        path="setup",
        type="string",
        default="not set",
        doc="Commands run once per VM before `run`, after skygreen installs its runtime there.",
    ),
    TaskField(
        path="envs",
        type="mapping",
        default="not set",
        doc="Environment variables for the training command. Each needs a value (an empty string counts); "
        "the `SKYGREEN_*` variables skygreen sets for every run are refused.",
    ),
    TaskField(
        path="secrets",
        type="mapping or list",
        default="not set",
        doc="Secrets for the VM, such as a webhook URL or a bucket key. Their values come from the environment "
        "of `skygreen up` (or the file) at launch and are never written to a rendered task, a log or the ledger.",
    ),
    TaskField(
        path="resources",
        type="mapping",
        default="not set",
        doc="SkyPilot's resources, except the keys skygreen sets from the plan (`accelerators`, `infra`, "
        "`use_spot`, `job_recovery`, ...): those are refused with the `skygreen:` field to set instead.",
    ),
    TaskField(
        path="file_mounts",
        type="mapping",
        default="not set",
        doc="SkyPilot's file mounts, kept as written; skygreen adds its own source folder when it installs from a checkout.",
    ),
    TaskField(
        path="skygreen",
        type="mapping",
        default="{}",
        schema={"type": "object"},
        doc="skygreen's own section. skygreen reads it, removes it and writes the final SkyPilot task; "
        "every other top-level key stays SkyPilot's.",
    ),
    *record_rows(GreenSpec, "skygreen"),
)
"""Every key of the task file, in the order the reference lists them."""
