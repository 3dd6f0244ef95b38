"""The task file as a new user writes it: YAML 1.2 numbers, `work: {gpu: ...}` (and the old
`on:` key, also after a YAML 1.1 tool re-dumped it), and a missing `work:` said out loud."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from skygreen.errors import SpecError
from skygreen.task.spec import load_spec, parse_spec_text

FIXTURE_CATALOG = Path(__file__).resolve().parent / "data" / "catalog" / "v8"


def skygreen(
    cwd: Path, *args: str, env: dict[str, str] | None = None, merge: bool = False
) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SKY_", "SKYPILOT_", "SKYGREEN_"))}
    base.update(HOME=str(cwd), XDG_DATA_HOME=str(cwd / ".local" / "share"), COLUMNS="200")
    base.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "skygreen.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge else subprocess.PIPE,
        text=True,
        env=base,
        cwd=cwd,
        timeout=120,
    )


def write_task(folder: Path, section: str) -> Path:
    path = folder / "task.yaml"
    path.write_text(
        f"name: t\nskygreen:\n{textwrap.indent(textwrap.dedent(section).strip(), '  ')}\nrun: python train.py\n"
    )
    return path


# ---------------------------------------------------------------- YAML 1.2 numbers

# YAML 1.2 core schema: float [-+]? ( . [0-9]+ | [0-9]+ ( . [0-9]* )? ) ( [eE] [-+]? [0-9]+ )?
_DIGITS = st.text("0123456789", min_size=1, max_size=4)
_MANTISSA = st.one_of(
    _DIGITS,
    st.builds(lambda a, b: f"{a}.{b}", _DIGITS, st.text("0123456789", max_size=4)),
    st.builds(lambda b: f".{b}", _DIGITS),
)
_EXPONENT = st.one_of(
    st.just(""),
    st.builds(
        lambda e, s, d: f"{e}{s}{d}",
        st.sampled_from("eE"),
        st.sampled_from(["", "+", "-"]),
        st.text("0123456789", min_size=1, max_size=3),
    ),
)
NUMBERS = st.builds(lambda s, m, e: f"{s}{m}{e}", st.sampled_from(["", "+", "-"]), _MANTISSA, _EXPONENT)


@settings(max_examples=300, deadline=None)
@given(spelling=NUMBERS)
def test_every_yaml12_number_spelling_is_read_as_that_number(spelling):
    try:
        spec = parse_spec_text(f"skygreen: {{budget_usd: {spelling}}}\n")
    except SpecError as e:
        value = float(spelling)
        assert e.field == "skygreen.budget_usd"
        assert not (value > 0 and value != float("inf")), (spelling, str(e))
        assert "expected a number" not in str(e)  # it was read as a number, and refused on its value
    else:
        assert spec.green.budget_usd == float(spelling)


@pytest.mark.parametrize(
    "spelling, value", [("1e3", 1000.0), ("1E3", 1000.0), ("1.5e+2", 150.0), ("2.", 2.0), (".5", 0.5), ("1e308", 1e308)]
)
def test_exponents_without_a_dot_are_numbers(spelling, value):
    assert parse_spec_text(f"skygreen: {{budget_usd: {spelling}}}\n").green.budget_usd == value


@pytest.mark.parametrize("spelling", [".inf", "-.inf", ".nan", ".NaN", "1e400"])
def test_infinities_and_nan_are_refused_as_not_finite(spelling):
    with pytest.raises(SpecError) as info:
        parse_spec_text(f"skygreen: {{budget_usd: {spelling}}}\n")
    assert "finite" in str(info.value) or "greater than 0" in str(info.value)


@pytest.mark.parametrize("spelling", ["on", "off", "yes", "no", "y", "n"])
def test_only_true_and_false_are_booleans(spelling):
    with pytest.raises(SpecError) as info:
        parse_spec_text(f"skygreen: {{spot: {spelling}}}\n")
    assert "true or false" in str(info.value) and repr(spelling) in str(info.value)


def test_duplicate_keys_are_still_refused_with_their_line():
    with pytest.raises(SpecError) as info:
        parse_spec_text("skygreen:\n  spot: true\n  spot: false\n")
    assert "duplicate key 'spot'" in str(info.value) and "line 3" in str(info.value)


def test_gpu_hours_1e3_through_the_cli(tmp_path):
    path = write_task(tmp_path, "gpus: [T4]\nwork: {gpu_hours: 1e3, gpu: A100}")
    out = skygreen(tmp_path, "plan", str(path), "--catalog", str(FIXTURE_CATALOG), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert any("1000 GPU-hours on A100" in a for a in doc["assumptions"]), doc["assumptions"]


def test_1e308_gpu_hours_is_a_number_out_of_range_with_its_line(tmp_path):
    path = write_task(tmp_path, "gpus: [T4]\nwork: {gpu_hours: 1e308}")
    out = skygreen(tmp_path, "plan", str(path), "--catalog", str(FIXTURE_CATALOG))
    assert out.returncode == 2
    first = out.stderr.splitlines()[0]
    assert first.startswith(f"error: {path}: skygreen.work.gpu_hours: must be at most"), first
    assert "(line 4)" in first and "expected a number" not in out.stderr


# ---------------------------------------------------------------- work: {gpu: ...}


def test_work_names_its_gpu_with_gpu():
    spec = parse_spec_text("skygreen: {work: {gpu_hours: 12, gpu: a100-80gb}}\n")
    assert spec.green.work.gpu == "A100-80GB" and spec.green.work.gpu_hours == 12.0 and spec.notices == ()


def test_the_old_on_key_still_reads_with_a_deprecation_notice():
    spec = parse_spec_text("skygreen: {work: {gpu_hours: 12, on: L4}}\n")
    assert spec.green.work.gpu == "L4"
    assert len(spec.notices) == 1 and "deprecated" in spec.notices[0] and "gpu: L4" in spec.notices[0]


def test_a_task_re_dumped_by_a_yaml11_tool_still_reads(tmp_path):
    """PyYAML (YAML 1.1, as SkyPilot's loader) reads `on:` as True and dumps it as `true:`."""
    old = "name: t\nskygreen:\n  work: {gpu_hours: 12, on: A100}\nrun: python train.py\n"
    redumped = yaml.safe_dump(yaml.safe_load(old))
    assert "true: A100" in redumped  # what such a tool really writes
    path = tmp_path / "task.yaml"
    path.write_text(redumped)
    spec = load_spec(path)
    assert spec.green.work.gpu == "A100" and spec.green.work.gpu_hours == 12.0
    assert "true: A100" in spec.notices[0] and "gpu: A100" in spec.notices[0]
    out = skygreen(tmp_path, "plan", str(path), "--catalog", str(FIXTURE_CATALOG), "--json")
    assert out.returncode == 0, out.stderr
    assert "true: A100" in out.stderr and "Traceback" not in out.stderr


def test_a_true_key_beside_gpu_is_ambiguous_and_refused():
    with pytest.raises(SpecError) as info:
        parse_spec_text("skygreen: {work: {gpu: A100, true: L4}}\n")
    assert info.value.field == "skygreen.work.true"


def test_deprecation_reaches_the_user_of_plan(tmp_path):
    path = write_task(tmp_path, "gpus: [T4]\nwork: {gpu_hours: 3, on: A100}")
    out = skygreen(tmp_path, "plan", str(path), "--catalog", str(FIXTURE_CATALOG))
    assert out.returncode == 0, out.stderr
    notes = [line for line in out.stderr.splitlines() if line.startswith("note:")]
    assert notes == ["note: skygreen.work.on is deprecated (YAML 1.1 tools read `on` as true): write gpu: A100"]


# ---------------------------------------------------------------- a missing work:


def test_missing_work_is_said_on_its_own_line_above_the_table(tmp_path):
    path = write_task(tmp_path, "gpus: [T4]")
    out = skygreen(tmp_path, "plan", str(path), "--catalog", str(FIXTURE_CATALOG), merge=True)
    assert out.returncode == 0, out.stdout
    lines = out.stdout.splitlines()
    notice = next(i for i, line in enumerate(lines) if "no skygreen.work" in line)
    table = next(i for i, line in enumerate(lines) if line.startswith("Best "))
    assert notice < table
    assert lines[notice] == (
        "note: no skygreen.work in the task: every estimate is for 1 GPU-hour on one A100; "
        "set work: {gpu_hours: N, gpu: A100} to size your job"
    )


def test_missing_work_is_a_notice_in_json(tmp_path):
    path = write_task(tmp_path, "gpus: [T4]")
    out = skygreen(tmp_path, "plan", str(path), "--catalog", str(FIXTURE_CATALOG), "--json")
    assert out.returncode == 0, out.stderr
    notices = json.loads(out.stdout)["notices"]
    assert any(n.startswith("no skygreen.work in the task") for n in notices), notices
    with_work = write_task(tmp_path, "gpus: [T4]\nwork: {gpu_hours: 1, gpu: A100}")
    doc = json.loads(skygreen(tmp_path, "plan", str(with_work), "--catalog", str(FIXTURE_CATALOG), "--json").stdout)
    assert not any("skygreen.work" in n for n in doc["notices"])


def test_deprecation_reaches_the_user_of_a_local_up(tmp_path):
    """No plan is made for --local; the task file's own notices still reach the user."""
    path = tmp_path / "task.yaml"
    path.write_text("name: t\nskygreen: {work: {gpu_hours: 3, on: A100}}\nrun: python -c 'print(1)'\n")
    out = skygreen(tmp_path, "up", str(path), "--local", "--no-smoke", "--detach")
    assert out.returncode == 0, out.stderr
    assert "note: skygreen.work.on is deprecated" in out.stderr
