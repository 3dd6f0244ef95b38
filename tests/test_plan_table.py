"""The plan table as a terminal shows it, through the real `skygreen plan`: at 80 and 120
columns no name or number is ever cut (`A100-80GB` must not become `A10…`), whole columns are
left out instead and named; small jobs show significant digits, not `$0.00` and `0.0 h`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from skygreen.figures import amount, duration_h, significant, usd, usd_per_hour

CATALOG = Path(__file__).resolve().parent / "data" / "catalog" / "v8"
SMALL_JOB = "{gpus: [A100-80GB, A100, T4, L4], work: {gpu_hours: 0.05, gpu: T4}, on_demand_fallback: true}"
BIG_JOB = "{gpus: [A100-80GB, A100, T4, L4], work: {gpu_hours: 5000, gpu: A100}, objective: carbon}"


def plan(tmp_path: Path, section: str, *args: str, columns: int | None) -> subprocess.CompletedProcess:
    task = tmp_path / "task.yaml"
    task.write_text(f"name: t\nskygreen: {section}\nrun: python train.py\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKY_", "SKYPILOT_", "SKYGREEN_", "COLUMNS"))}
    env.update(HOME=str(tmp_path), **({"COLUMNS": str(columns)} if columns else {}))
    out = subprocess.run(
        [sys.executable, "-m", "skygreen.cli", "plan", str(task), "--catalog", str(CATALOG), *args],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out


def table_rows(text: str) -> list[list[str]]:
    """The body rows of every table: the cells between the vertical bars."""
    return [[cell.strip() for cell in line.strip("│").split("│")] for line in text.splitlines() if line.startswith("│")]


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("section", [SMALL_JOB, BIG_JOB])
def test_no_name_or_number_is_cut_at_80_and_120_columns(tmp_path, columns, section):
    text = plan(tmp_path, section, "--top", "10", columns=columns).stdout
    candidates = json.loads(plan(tmp_path, section, "--json", columns=None).stdout)["candidates"]
    assert "…" not in text and "..." not in text
    assert max(len(line) for line in text.splitlines()) <= columns
    shown = min(10, len(candidates))
    rows = table_rows(text)[:shown]  # the ranked table comes first
    assert len(rows) == shown
    for (_rank, *cells), c in zip(rows, candidates[:shown], strict=True):
        assert f"{c['accelerator']}:{c['accelerator_count']}" in cells, (cells, c)
        assert c["cloud"] in cells and c["region"] in cells
        assert usd(c["est_cost_usd"]) in cells  # the ranked-by figure is always there, whole
    left_out = text.split("Not shown", 1)[1].splitlines()[0] if "Not shown" in text else ""
    if "instance" not in left_out:  # shown: then whole
        assert all(c["instance_type"] in cells for (_, *cells), c in zip(rows, candidates[:shown], strict=True))


def test_left_out_columns_are_named_and_the_objective_column_stays(tmp_path):
    text = plan(tmp_path, BIG_JOB, columns=80).stdout
    assert re.search(r"Not shown at 80 columns: [^\n]*instance", text)
    assert "CO2e" in text.split("Not shown")[0]  # ranked by carbon: its column stays
    candidates = json.loads(plan(tmp_path, BIG_JOB, "--json", columns=None).stdout)["candidates"]
    assert amount(candidates[0]["co2e_kg"]) in table_rows(text)[0]


def test_120_columns_show_the_instance_type_of_a_small_job(tmp_path):
    text = plan(tmp_path, SMALL_JOB, columns=120).stdout
    assert "Standard_NC24ads_A100_v4" in text and "instance" not in text.split("Not shown", 1)[-1].splitlines()[0]


def test_a_wide_terminal_shows_every_column(tmp_path):
    text = plan(tmp_path, SMALL_JOB, columns=200).stdout
    assert "Not shown" not in text
    for heading in ("instance", "on-demand", "time", "cost", "kWh", "CO2e"):
        assert heading in text


def test_a_console_too_narrow_for_any_table_stacks_each_offer(tmp_path):
    text = plan(tmp_path, SMALL_JOB, "--top", "3", columns=40).stdout
    assert "…" not in text and "┃" not in text
    assert "A100-80GB:1" in text or "T4:1" in text


def test_small_jobs_show_significant_digits(tmp_path):
    text = plan(tmp_path, SMALL_JOB, columns=200).stdout
    candidates = json.loads(plan(tmp_path, SMALL_JOB, "--json", columns=None).stdout)["candidates"]
    assert not re.search(r"(?<![\d.])0\.0+(?![\d.])", text), "a zero printed for an amount that is not zero"
    assert not re.search(r"(?<![\d.])0\.0 h", text)
    best = candidates[0]
    assert f"${usd(best['est_cost_usd'])} in {duration_h(best['est_hours'])}" in text  # the reason line
    assert usd(best["est_cost_usd"]) == significant(best["est_cost_usd"], 2) != "0.00"


@pytest.mark.parametrize(
    "value, text",
    [(0.0042, "0.0042"), (0.00423, "0.0042"), (0.41, "0.41"), (12.345, "12.35"), (1234.5, "1,234"), (0, "0")],
)
def test_dollars(value, text):
    assert usd(value) == text


@pytest.mark.parametrize(
    "hours, text",
    [(0.05, "3 min"), (40 / 3600, "40 s"), (0.5, "30 min"), (0.9999, "1.0 h"), (2.46, "2.5 h"), (150, "150 h")],
)
def test_durations(hours, text):
    assert duration_h(hours) == text


def test_prices_per_hour_and_amounts():
    assert usd_per_hour(3.6731) == "3.673" and usd_per_hour(0.004) == "0.0040"
    assert amount(0.0123) == "0.012" and amount(3.21) == "3.2" and amount(123.4) == "123"


def table_headings(text: str) -> list[list[str]]:
    """Each table's column headings (the words of its header lines, in order), top to bottom."""
    tables: list[list[str]] = []
    for block in re.findall(r"┏[^\n]*\n((?:┃[^\n]*\n)+)┡", text):
        lines = [[cell.strip() for cell in line.strip().strip("┃").split("┃")] for line in block.splitlines()]
        tables.append([" ".join(part for part in column if part) for column in zip(*lines, strict=True)])
    return tables


@pytest.mark.parametrize("columns", [80, 120])
def test_both_tables_show_the_same_columns_and_the_footer_names_the_rest(tmp_path, columns):
    text = plan(tmp_path, "{work: {gpu_hours: 24, gpu: A100}}", columns=columns).stdout
    ranked, per_cloud = table_headings(text)
    assert ranked == per_cloud  # "Best per cloud" shows no figure the ranked table leaves out
    footer = re.search(rf"Not shown at {columns} columns: ([^(]*) \(", text)
    assert footer is not None, text
    left_out = footer.group(1).split(", ")
    every = ["#", "cloud", "region", "instance", "GPUs", "spot", "$/h", "on-demand $/h", "est. time", "est. cost $",
             "energy kWh", "CO2e kg"]  # fmt: skip
    assert sorted([*ranked, *left_out]) == sorted(every)


def test_notes_wrap_to_the_terminal_width(tmp_path):
    """With no SkyPilot catalog the plan's first line is a note on stderr (the embedded price
    table); at 80 columns it wraps, and piped without COLUMNS it stays one line."""
    task = tmp_path / "task.yaml"
    task.write_text("name: t\nskygreen: {work: {gpu_hours: 24, gpu: A100}}\nrun: python train.py\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKY_", "SKYPILOT_", "SKYGREEN_", "COLUMNS"))}
    env.update(HOME=str(tmp_path))
    argv = [sys.executable, "-m", "skygreen.cli", "plan", str(task)]
    narrow = subprocess.run(argv, capture_output=True, text=True, env={**env, "COLUMNS": "80"}, timeout=120)
    piped = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert narrow.returncode == 0 and piped.returncode == 0, narrow.stderr + piped.stderr
    assert narrow.stderr.startswith("note: no SkyPilot catalog at")
    # every line fits, but for a path longer than the line, which stands alone rather than cut
    assert all(len(line) <= 80 or len(line.split()) == 1 for line in narrow.stderr.splitlines()), narrow.stderr
    assert all(line.startswith(("note: ", "      ")) for line in narrow.stderr.splitlines())
    assert len(piped.stderr.splitlines()) == 1 and len(narrow.stderr.splitlines()) > 1
    assert " ".join(narrow.stderr.split()) == " ".join(piped.stderr.split())  # the same words
