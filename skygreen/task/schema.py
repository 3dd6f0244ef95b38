"""The JSON Schema of a whole task file: SkyPilot's task schema with the `skygreen:` section added.

An editor running the YAML language server completes and checks a task file that starts with
`# yaml-language-server: $schema=PATH` (docs/reference/task-file.md says how). The `skygreen:`
section's schema is built from the task file's declarations (a declared record's fields give
their own, `skygreen.task.declare`; the other keys' come from their row in
`skygreen.task.reference`: type, allowed values and meaning), so it names exactly the keys the
parser accepts and a misspelt key fails it. SkyPilot's own part comes from `sky.utils.schemas.get_task_schema()`,
imported only by `task_schema` (about 2.3 s): a copy ships beside this module (`schema.json`,
held equal to a fresh build by tests/test_task_schema.py) for tools that should not import sky.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from skygreen.task.records import SECTION
from skygreen.task.reference import TASK_FIELDS, TaskField

SHIPPED = Path(__file__).with_name("schema.json")
"""The schema as `skygreen schema` prints it, shipped with the package."""

_NAMES = re.compile(r"^[A-Za-z0-9_.-]+( \| [A-Za-z0-9_.-]+)+$")

Schema = dict[str, Any]


def _choices(field: TaskField) -> list[str] | None:
    """The names a `a | b | c` allowed text lists; None when the text says something else."""
    return field.allowed.split(" | ") if _NAMES.match(field.allowed) else None


def _string(field: TaskField) -> Schema:
    names = _choices(field)
    return {"enum": names} if names else {"type": "string"}


def _list_or_one(item: Schema) -> Schema:
    """A list of `item`; one item alone stands for a one-item list (`gpus: A100`)."""
    return {"anyOf": [item, {"type": "array", "items": item, "minItems": 1}]}


_OBJECT: Schema = {"type": "object"}

TYPES: dict[str, Callable[[TaskField], Schema]] = {
    "integer": lambda f: {"type": "integer"},
    "string": _string,
    "mapping": lambda f: dict(_OBJECT),
    "list or string": lambda f: _list_or_one({"type": "string"}),
    "mapping or strategy name": lambda f: {"anyOf": [{"type": "string"}, dict(_OBJECT)]},
    "mapping or false": lambda f: {"anyOf": [dict(_OBJECT), {"const": False}]},
    "number or string": lambda f: {"type": ["number", "string"]},
}
"""The JSON Schema of each kind of value the reference names (`TaskField.type`), for the rows
without a declaration of their own: a section (its keys' schemas are added from their rows)
and the model's size and method (`skygreen.task.reference.MODEL_ROWS`)."""


def field_schema(field: TaskField, fields: Iterable[TaskField] = TASK_FIELDS) -> Schema:
    """The schema of one key, with the keys nested under it when it is a mapping."""
    if field.schema is not None:  # from the field's declaration (`skygreen.task.declare`)
        schema = copy.deepcopy(dict(field.schema))
    else:
        build = TYPES.get(field.type)
        if build is None:
            raise ValueError(f"TaskField {field.path}: no JSON Schema for type {field.type!r}; add it to schema.TYPES")
        schema = {**build(field), "description": field.doc}
    children = [f for f in fields if f.section == field.path]
    if children:
        nested = {"properties": {f.key: field_schema(f, fields) for f in children}, "additionalProperties": False}
        target = next((s for s in schema.get("anyOf", ()) if s.get("type") == "object"), schema)
        target.update(nested)
    return schema


def section_schema(fields: Iterable[TaskField] = TASK_FIELDS) -> Schema:
    """The schema of the `skygreen:` section."""
    fields = tuple(fields)
    return field_schema(next(f for f in fields if f.path == SECTION), fields)


def task_schema() -> Schema:
    """The whole task file's schema: SkyPilot's (imports sky) with `skygreen:` added."""
    from sky.utils import schemas

    schema = copy.deepcopy(schemas.get_task_schema())
    schema["title"] = "SkyPilot task with a skygreen: section"
    schema["properties"][SECTION] = section_schema()
    return schema


def schema_text(schema: Schema) -> str:
    """The schema as `skygreen schema` prints it and `schema.json` holds it."""
    return json.dumps(schema, indent=2) + "\n"
