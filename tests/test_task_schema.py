"""`skygreen schema`: the JSON Schema of a whole task file, as editors read it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from skygreen.cli.commands import run_command
from skygreen.task.reference import TASK_FIELDS
from skygreen.task.schema import SHIPPED, schema_text, section_schema, task_schema
from skygreen.task.yaml_lines import read_yaml

ROOT = Path(__file__).resolve().parents[1]
TASKS = sorted((ROOT / "tasks").glob("*.yaml"))
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def shipped_validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads(SHIPPED.read_text(encoding="utf-8")))


def doc_tasks() -> list[tuple[str, str]]:
    """Every YAML block of the README and the docs with a top-level `skygreen:` section."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in re.finditer(r"```ya?ml\n(.*?)```", text, re.S):
            if re.search(r"^skygreen:", block.group(1), re.M):
                line = text[: block.start()].count("\n") + 1
                found.append((f"{page.relative_to(ROOT)}:{line}", block.group(1)))
    return found


def test_the_shipped_schema_is_the_one_built_from_the_declarations_and_skypilot() -> None:
    built = task_schema()
    assert SHIPPED.read_text(encoding="utf-8") == schema_text(built), "regenerate: skygreen schema > " + str(SHIPPED)
    assert built["properties"]["skygreen"] == section_schema()
    assert {"run", "resources", "envs", "skygreen"} <= set(built["properties"])


def test_skygreen_schema_prints_the_shipped_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_command(["schema"]) == 0
    assert capsys.readouterr().out == SHIPPED.read_text(encoding="utf-8")


@pytest.mark.parametrize("task", TASKS, ids=[t.name for t in TASKS])
def test_every_example_task_validates(task: Path) -> None:
    errors = [e.message for e in shipped_validator().iter_errors(read_yaml(task.read_text(encoding="utf-8")))]
    assert errors == []


def test_every_task_in_the_docs_validates() -> None:
    examples = doc_tasks()
    assert len(examples) >= 10  # the probe finds them
    validator = shipped_validator()
    bad = {where: [e.message for e in validator.iter_errors(read_yaml(text))] for where, text in examples}
    assert {where: errors for where, errors in bad.items() if errors} == {}


@pytest.mark.parametrize(
    "task",
    [
        {"skygreen": {"early_stoping": {"metric": "val_loss"}}, "run": "python t.py"},
        {"skygreen": {"checkpoint": {"kep": 3}}, "run": "python t.py"},
        {"skygren": {}, "run": "python t.py"},
        {"skygreen": {"gpu_count": "two"}, "run": "python t.py"},
        {"skygreen": {"objective": "cheap"}, "run": "python t.py"},
        {"skygreen": {"early_stopping": {"metric": "loss", "mode": "lowest"}}, "run": "python t.py"},
    ],
)
def test_a_misspelt_key_or_a_wrong_value_fails(task: dict) -> None:
    assert list(shipped_validator().iter_errors(task))


def test_every_documented_key_has_a_description_in_the_schema() -> None:
    def walk(schema: dict, path: str) -> set[str]:
        found = {path} if schema.get("description") else set()
        for branch in [schema, *schema.get("anyOf", [])]:
            for key, sub in branch.get("properties", {}).items():
                found |= walk(sub, f"{path}.{key}")
        return found

    described = walk(section_schema(), "skygreen")
    assert {f.path for f in TASK_FIELDS if f.path.startswith("skygreen")} == described
