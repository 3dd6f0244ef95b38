"""The generated reference pages against the code they are generated from.

The task file reference lists every key the parser accepts (found by asking the parser, not by
reading the table), the exit code table every code, the API page every public name; a field
without a description, a code without a meaning or a public name that does not resolve stops
the build. The last test builds the site as CI does and reads the pages it wrote.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from skygreen import exit_codes
from skygreen.errors import SpecError
from skygreen.task.records import SKYPILOT_TASK_KEYS, CheckpointSpec, EarlyStopConfig, GreenSpec
from skygreen.task.reference import TASK_FIELDS, TaskField, default_text
from skygreen.task.spec import parse_spec, parse_spec_text

ROOT = Path(__file__).resolve().parents[1]
PROBE = "zz_not_a_key"


def _hooks() -> Any:
    spec = importlib.util.spec_from_file_location("docs_reference_hook", ROOT / "docs" / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _hooks()


def _nested(path: tuple[str, ...], leaf: Any) -> Any:
    for key in reversed(path):
        leaf = {key: leaf}
    return leaf


def _unknown_key_error(path: tuple[str, ...]) -> SpecError | None:
    """The parser's error for an unknown key inside the mapping at `path`; None when that value
    is not a mapping with a fixed set of keys (a list, a GPU -> speed map, a scalar)."""
    try:
        parse_spec(_nested(path, {PROBE: 1}))
    except SpecError as e:
        if e.problem == "unknown key" and e.field == ".".join((*path, PROBE)):
            return e
        return None
    raise AssertionError(f"the parser took an unknown key under {'.'.join(path) or 'the top'}")


def accepted_keys(path: tuple[str, ...] = ()) -> set[str]:
    """Every dotted key the parser accepts under `path`, found by asking it: each mapping's
    `unknown key` error lists what is allowed there, and each allowed key that is a mapping
    itself is asked again."""
    error = _unknown_key_error(path)
    assert error is not None and error.allowed, f"no key list for {'.'.join(path) or 'the top'}"
    found = set()
    for key in error.allowed.split(", "):
        found.add(".".join((*path, key)))
        # SkyPilot's own sections (resources, envs) are SkyPilot's to check
        if (path or key == "skygreen") and _unknown_key_error((*path, key)) is not None:
            found |= accepted_keys((*path, key))
    return found


def generated_keys(markdown: str) -> set[str]:
    """The dotted keys a generated task file reference lists: each table row's key under its section heading."""
    keys = set()
    section = ""
    for line in markdown.splitlines():
        heading = re.match(r"^## (?:`(.+)`|Top-level keys)$", line)
        if heading:
            section = heading.group(1) or ""
            continue
        row = re.match(r"^\| `([^`]+)` \|", line)
        if row:
            keys.add(f"{section}.{row.group(1)}" if section else row.group(1))
    return keys


def test_the_probe_finds_nested_sections() -> None:
    """The discovery itself, so a broken probe cannot pass the tests below by finding nothing."""
    keys = accepted_keys()
    assert {"skygreen.checkpoint.quiet_s", "skygreen.early_stopping.grace", "skygreen.model.params"} <= keys
    assert {"skygreen.gpus.min_memory_gb", "skygreen.work.gpu", "skygreen.preemption.rate_per_hour"} <= keys
    assert "skygreen.gpu_count_given" not in keys  # a record attribute the parser sets itself


def test_every_skygreen_key_the_parser_accepts_is_in_the_reference_and_no_other() -> None:
    accepted = {k for k in accepted_keys() if k == "skygreen" or k.startswith("skygreen.")}
    documented = {f.path for f in TASK_FIELDS if f.path == "skygreen" or f.path.startswith("skygreen.")}
    assert accepted - documented == set(), "accepted by the parser, missing from skygreen/task/reference.py"
    assert documented - accepted == set(), "documented in skygreen/task/reference.py, refused by the parser"
    listed = generated_keys(hooks.task_fields_markdown())
    assert accepted - listed == set()


def test_every_top_level_key_is_listed_or_named_as_passed_through() -> None:
    markdown = hooks.task_fields_markdown()
    top = {k for k in accepted_keys() if "." not in k}
    assert top == {*SKYPILOT_TASK_KEYS, "skygreen"}
    for key in top:
        assert f"| `{key}` |" in markdown or f"`{key}`," in markdown or f"`{key}`." in markdown, key
    assert {f.path for f in TASK_FIELDS if "." not in f.path} <= top


def test_defaults_come_from_the_records() -> None:
    fields = {f.path: f for f in TASK_FIELDS}
    assert default_text(fields["skygreen.checkpoint.keep"]) == str(CheckpointSpec().keep)
    assert default_text(fields["skygreen.gpu_count"]) == str(GreenSpec().gpu_count)
    assert default_text(fields["skygreen.early_stopping.patience"]) == str(EarlyStopConfig(metric="m").patience)
    assert default_text(fields["skygreen.early_stopping.metric"]) == "required"
    assert default_text(fields["skygreen.clouds"]) == "[aws, gcp, azure]"


def test_a_field_without_a_description_fails() -> None:
    with pytest.raises(ValueError, match=r"skygreen\.new_key: give it a description"):
        TaskField(path="skygreen.new_key", type="integer", doc="  ")
    # a row built some other way (not through TaskField's check) still stops the page
    row = types.SimpleNamespace(path="skygreen.new_key", section="skygreen", key="new_key", type="integer", doc="")
    with pytest.raises(ValueError, match=r"skygreen\.new_key has no description"):
        hooks.task_fields_markdown([*TASK_FIELDS, row])


def test_a_field_with_no_default_to_show_fails() -> None:
    field = TaskField(path="skygreen.checkpoint.new_key", type="integer", doc="A key no record has.")
    with pytest.raises(ValueError, match="give default= text"):
        hooks.task_fields_markdown([field])


def test_the_example_task_on_the_page_parses() -> None:
    page = (ROOT / "docs" / "reference" / "task-file.md").read_text(encoding="utf-8")
    example = re.search(r"```yaml\n(.*?)```", page, re.DOTALL)
    assert example is not None
    spec = parse_spec_text(example.group(1))
    assert spec.green.checkpoint.bucket == "s3://my-bucket/runs" and spec.green.deadline == 36.0


# ---------------------------------------------------------------- exit codes


def test_the_exit_code_table_has_every_code_with_its_meaning() -> None:
    table = hooks.exit_codes_markdown()
    for code in (0, 1, 2, 3, 75, 130):
        assert f"| {code} | {hooks._cell(exit_codes.MEANINGS[code])} |" in table
    assert "`STOPPED_WITH_CHECKPOINT`, `PREEMPTED_EXIT_CODE`" in table


def test_a_code_without_a_meaning_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exit_codes, "MEANINGS", {k: v for k, v in exit_codes.MEANINGS.items() if k != 3})
    with pytest.raises(ValueError, match=r"without a meaning.*\[3\]"):
        hooks.exit_codes_markdown()


def test_bad_input_exits_with_the_code_the_table_gives_it(tmp_path: Path) -> None:
    task = tmp_path / "task.yaml"
    task.write_text("skygreen: {gpus: [A1000]}\nrun: python train.py\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "skygreen.cli", "plan", str(task)], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == exit_codes.BAD_INPUT, result.stderr
    assert exit_codes.MEANINGS[result.returncode].startswith("bad input")


# ---------------------------------------------------------------- API


def test_every_public_runtime_name_has_a_block_that_resolves() -> None:
    import skygreen.runtime

    targets = dict(hooks.public_targets("skygreen.runtime"))
    assert set(targets) == set(skygreen.runtime.__all__)
    for name, target in targets.items():
        module_name, _, attribute = target.rpartition(".")
        assert getattr(importlib.import_module(module_name), attribute) is getattr(skygreen.runtime, name), name
    markdown = hooks.api_markdown("skygreen.runtime")
    assert all(f"::: {target}\n" in markdown for target in targets.values())


def test_a_public_name_that_does_not_resolve_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("skygreen_docs_probe")
    module.__all__ = ["present", "missing"]  # type: ignore[attr-defined]
    module.present = 1  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "skygreen_docs_probe", module)
    with pytest.raises(ValueError, match="names 'missing'"):
        hooks.public_targets("skygreen_docs_probe")


def test_an_unknown_marker_fails() -> None:
    with pytest.raises(ValueError, match="unknown marker"):
        hooks.expand("text\n<!-- generated: task-feilds -->\n")


# ---------------------------------------------------------------- the site


def test_the_site_builds_strict_with_the_generated_pages(tmp_path: Path) -> None:
    site = tmp_path / "site"
    mkdocs = Path(sys.executable).with_name("mkdocs")
    result = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(site)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    task_page = (site / "reference" / "task-file" / "index.html").read_text(encoding="utf-8")
    for field in TASK_FIELDS:
        assert f"<code>{field.key}</code>" in task_page, field.path
    cli_page = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "skygreen plan" in cli_page and "--deadline" in cli_page
    for code in exit_codes.MEANINGS:
        assert f"<td>{code}</td>" in cli_page
    api_page = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    for _, target in hooks.public_targets("skygreen.runtime"):
        assert f'id="{target}"' in api_page, target
    for _, target in hooks.public_targets("skygreen.power"):
        assert f'id="{target}"' in api_page, target
