"""The JSON Schema of a whole task file: SkyPilot's task schema with the `skygreen:` section added.

An editor running the YAML language server completes and checks a task file that starts with
`# yaml-language-server: $schema=PATH` (docs/reference/task-file.md says how). The `skygreen:`
section's schema is built from the task file's declarations: each row of
`skygreen.task.reference` carries its field's schema (`skygreen.task.declare.field_schema`), and
a section's rows are nested into it, so it names exactly the keys the parser accepts and a
misspelt key fails it. SkyPilot's own part comes from `sky.utils.schemas.get_task_schema()`,
imported only by `task_schema` (about 2.3 s): a copy ships beside this module (`schema.json`,
held equal to a fresh build by tests/test_task_schema.py) for tools that should not import sky.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from skygreen.task.records import SECTION
from skygreen.task.reference import TASK_FIELDS, TaskField

SHIPPED = Path(__file__).with_name("schema.json")
"""The schema as `skygreen schema` prints it, shipped with the package."""

Schema = dict[str, Any]


def field_schema(field: TaskField, fields: Iterable[TaskField] = TASK_FIELDS) -> Schema:
    """The schema of one key, with the keys nested under it when it is a mapping."""
    if field.schema is None:
        raise ValueError(f"TaskField {field.path}: no JSON Schema; declare the field (skygreen.task.declare)")
    schema = {"description": field.doc, **copy.deepcopy(dict(field.schema))}
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
