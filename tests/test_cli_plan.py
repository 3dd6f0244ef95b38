"""`skygreen plan` and `skygreen catalog update` as a user runs them: a fresh process, exit
codes 0/1/2, JSON shape, one clear error and no traceback, nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE_CATALOG = Path(__file__).resolve().parent / "data" / "catalog" / "v8"
REQUIRED = {
    "cloud",
    "region",
    "instance_type",
    "accelerator",
    "accelerator_count",
    "spot",
    "price_usd_per_hour",
    "est_hours",
    "est_cost_usd",
}


def files_under(path: Path) -> set[Path]:
    return set(path.rglob("*"))


@pytest.fixture
def workdir(tmp_path) -> Path:
    """A private HOME (no ~/.sky) that also holds the task files."""
    home = tmp_path / "home"
    home.mkdir()
    return home


def skygreen(workdir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SKY_", "SKYPILOT_", "SKYGREEN_"))}
    base.update(HOME=str(workdir), XDG_DATA_HOME=str(workdir / ".local" / "share"), COLUMNS="200")
    base.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "skygreen.cli", *args],
        capture_output=True,
        text=True,
        env=base,
        cwd=workdir,
        timeout=120,
    )


def task(workdir: Path, section: str, name: str = "task.yaml") -> str:
    path = workdir / name
    path.write_text(f"name: t\nskygreen: {section}\nrun: python train.py\n")
    return str(path)


def test_json_lists_candidates_best_first_with_the_required_fields(workdir):
    path = task(workdir, "{work: {gpu_hours: 12, gpu: A100}, on_demand_fallback: true}")
    before = files_under(workdir)
    out = skygreen(workdir, "plan", path, "--catalog", str(FIXTURE_CATALOG), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    candidates = doc["candidates"]
    assert candidates and all(set(c) >= REQUIRED for c in candidates)
    costs = [c["est_cost_usd"] for c in candidates]
    assert costs == sorted(costs)
    assert {c["spot"] for c in candidates} == {True, False}
    assert files_under(workdir) == before  # planning writes nothing


def test_human_table_shows_ranked_offers_best_per_cloud_and_why(workdir):
    out = skygreen(workdir, "plan", task(workdir, "{}"), "--catalog", str(FIXTURE_CATALOG), "--top", "3")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for heading in ("cloud", "region", "instance", "GPUs", "spot", "on-demand", "hours", "cost", "kWh", "CO2e"):
        assert heading in text
    assert "Best 3 of" in text and "Best per cloud" in text
    assert "has the lowest estimated run cost" in text
    assert "Standard_NC4as_T4_v3" in text


def test_environment_variable_names_the_catalog(workdir):
    out = skygreen(workdir, "plan", task(workdir, "{}"), "--json", env={"SKYGREEN_CATALOG_DIR": str(FIXTURE_CATALOG)})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["catalog"] == str(FIXTURE_CATALOG)


def test_no_catalog_uses_the_embedded_table_with_a_one_line_notice(workdir):
    out = skygreen(workdir, "plan", task(workdir, "{work: {gpu_hours: 2, gpu: A100}}"), "--json")
    assert out.returncode == 0, out.stderr
    notes = [line for line in out.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "embedded price table" in notes[0]
    assert json.loads(out.stdout)["candidates"]
    assert not (workdir / ".sky").exists()


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ("{max_price_per_hour: 0.01}", "relax skygreen.max_price_per_hour"),
        ("{regions: [us-eats-1]}", "did you mean 'us-east-1'"),
        ("{gpus: [A1000]}", "did you mean 'A100'"),
        ("{clouds: [awz]}", "did you mean 'aws'"),
        ("{gpu_count: 0}", "skygreen.gpu_count"),
    ],
)
def test_bad_input_exits_2_with_one_clear_error_and_no_traceback(workdir, section, expected):
    path = task(workdir, section)
    before = files_under(workdir)
    out = skygreen(workdir, "plan", path, "--catalog", str(FIXTURE_CATALOG))
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stderr.startswith("error: ") and expected in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert files_under(workdir) == before


def test_missing_task_and_missing_catalog_dir_exit_2(workdir):
    out = skygreen(workdir, "plan", str(workdir / "nope.yaml"), "--catalog", str(FIXTURE_CATALOG))
    assert out.returncode == 2 and "task file not found" in out.stderr
    out = skygreen(workdir, "plan", task(workdir, "{}"), "--catalog", str(workdir / "no-catalog"))
    assert out.returncode == 2 and "does not exist" in out.stderr and "fix:" in out.stderr
    assert "Traceback" not in out.stderr


def test_debug_shows_the_traceback(workdir):
    out = skygreen(
        workdir,
        "plan",
        task(workdir, "{max_price_per_hour: 0.01}"),
        "--catalog",
        str(FIXTURE_CATALOG),
        env={"SKYGREEN_DEBUG": "1"},
    )
    assert out.returncode != 0 and "Traceback" in out.stderr and "NoOfferError" in out.stderr


def test_plan_over_the_real_snapshot(workdir, shared_catalog_dir):
    out = skygreen(
        workdir,
        "plan",
        task(workdir, "{work: {gpu_hours: 100, gpu: A100}}"),
        "--catalog",
        str(shared_catalog_dir),
        "--json",
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert {c["cloud"] for c in doc["candidates"]} == {"aws", "gcp", "azure"}


def test_catalog_update_offline_fails_with_the_fix_and_writes_no_catalog(workdir):
    """No network reaches this machine: SkyPilot's download fails, and skygreen says what to do."""
    out = skygreen(workdir, "catalog", "update", "--cloud", "aws")
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "could not download SkyPilot's aws price catalog" in out.stderr
    assert "fix:" in out.stderr and "--catalog" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (workdir / ".sky" / "catalogs" / "v8" / "aws" / "vms.csv").exists()


def test_catalog_update_rejects_an_unknown_cloud(workdir):
    out = skygreen(workdir, "catalog", "update", "--cloud", "gpc")
    assert out.returncode == 2 and "did you mean 'gcp'" in out.stderr
