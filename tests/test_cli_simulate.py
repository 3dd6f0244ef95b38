"""`skygreen simulate` as a user runs it: a fresh process, its table and JSON, exit code 2 with
the flag, the value and the fix for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE_CATALOG = Path(__file__).resolve().parent / "data" / "catalog" / "v8"
KEYS = {"policy", "cost_usd", "finish_h", "deadline_met", "spot_h", "on_demand_h", "switches"}


def skygreen(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKY_", "SKYPILOT_", "SKYGREEN_"))}
    env.update(HOME=str(cwd), COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "skygreen.cli", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120
    )


@pytest.fixture
def trace(tmp_path) -> Path:
    """A 1-node AWS V100 availability file in the spot-traces layout: 10 h of spot every 14 h."""
    path = tmp_path / "aws-02-15-2023" / "us-west-2b_v100_1.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": ([1] * 60 + [0] * 24) * 12}))
    return path


def test_all_policies_side_by_side_as_json(tmp_path, trace):
    out = skygreen(
        tmp_path,
        "simulate",
        str(trace),
        "--hours",
        "24h",
        "--deadline",
        "40h",
        "--changeover",
        "18m",
        "--policy",
        "all",
        "--json",
        "--spot-price",
        "0.918",
        "--on-demand-price",
        "3.06",
    )
    assert out.returncode == 0, out.stderr
    rows = {r["policy"]: r for r in json.loads(out.stdout)}
    assert set(rows) == {"on_demand", "greedy", "uniform_progress", "skygreen", "optimum"}
    assert all(set(r) == KEYS for r in rows.values())
    assert all(r["deadline_met"] for r in rows.values())
    assert rows["on_demand"]["cost_usd"] == pytest.approx((24 + 0.3) * 3.06)
    for name in ("greedy", "uniform_progress", "skygreen"):
        assert rows["optimum"]["cost_usd"] <= rows[name]["cost_usd"] <= rows["on_demand"]["cost_usd"]
    assert rows["optimum"]["cost_usd"] < rows["on_demand"]["cost_usd"] / 2


def test_the_table_prices_from_the_catalog_for_the_instance_the_trace_probed(tmp_path, trace):
    east = trace.with_name("us-east-1c_v100_1.json")
    trace.rename(east)
    out = skygreen(
        tmp_path,
        "simulate",
        str(east),
        "--hours",
        "10",
        "--deadline",
        "20h",
        "--changeover",
        "0.3h",
        "--policy",
        "uniform_progress",
        "--catalog",
        str(FIXTURE_CATALOG),
    )
    assert out.returncode == 0, out.stderr
    assert "spot and on-demand: catalog aws us-east-1 p3.2xlarge" in out.stdout and "$0.918" in out.stdout
    assert "uniform_progress" in out.stdout and "met" in out.stdout


def test_a_gang_defaults_to_the_traces_node_count_and_bills_every_node(tmp_path):
    path = tmp_path / "gang.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 600, "nodes": 4}, "data": [4] * 200}))
    args = [
        "simulate",
        str(path),
        "--hours",
        "5h",
        "--deadline",
        "10h",
        "--changeover",
        "30m",
        "--policy",
        "greedy",
        "--spot-price",
        "1",
        "--on-demand-price",
        "3",
        "--json",
    ]
    (row,) = json.loads(skygreen(tmp_path, *args).stdout)
    assert row["cost_usd"] == pytest.approx(4 * 5.5)
    (row,) = json.loads(skygreen(tmp_path, *args, "--nodes", "1").stdout)
    assert row["cost_usd"] == pytest.approx(5.5)
    text = skygreen(tmp_path, *[a for a in args if a != "--json"], "--nodes", "2").stdout
    assert "at least 2 of the trace's up to 4 instances were; --nodes 4 needs all of them" in text, text
    assert "gang:" not in skygreen(tmp_path, *[a for a in args if a != "--json"]).stdout  # the whole gang


@pytest.mark.parametrize(
    ("args", "flag", "fix"),
    [
        (["--hours", "ten"], "--hours", "36h"),
        (["--deadline", "0h"], "--deadline", "positive"),
        (["--policy", "uniform"], "--policy", "uniform_progress"),
        (["--nodes", "16"], "--nodes", "--nodes 1"),
        (["--nodes", "0"], "--nodes", "--nodes 16"),
        (["--start", "9999h"], "--start", "--start 0"),
        (["--deadline", "10h"], "--deadline", "--deadline 10.3h"),
    ],
)
def test_bad_input_exits_2_naming_the_flag_value_and_fix(tmp_path, trace, args, flag, fix):
    base = {
        "--hours": "10h",
        "--deadline": "20h",
        "--changeover": "0.3h",
        "--policy": "all",
        "--spot-price": "1",
        "--on-demand-price": "3",
    }
    for key, value in zip(args[::2], args[1::2], strict=True):
        base[key] = value
    out = skygreen(tmp_path, "simulate", str(trace), *[x for kv in base.items() for x in kv])
    assert out.returncode == 2, out
    assert flag in out.stderr and fix in out.stderr and "Traceback" not in out.stderr
    assert out.stdout == ""


def test_a_missing_trace_and_a_multi_zone_csv_without_a_zone_are_input_errors(tmp_path):
    out = skygreen(
        tmp_path, "simulate", "nope.json", "--hours", "1h", "--deadline", "2h", "--changeover", "6m", "--policy", "all"
    )
    assert out.returncode == 2 and "no such file" in out.stderr
    wide = tmp_path / "capacity.csv"
    wide.write_text(
        "scheduled_at_utc,run_id,us-east4-a,us-west1-b\n2025-10-04T00:10:00Z,a,16,0\n2025-10-04T00:20:00Z,b,7,3\n"
    )
    out = skygreen(
        tmp_path, "simulate", str(wide), "--hours", "1h", "--deadline", "2h", "--changeover", "6m", "--policy", "all"
    )
    assert out.returncode == 2 and "--zone" in out.stderr and "us-east4-a, us-west1-b" in out.stderr


def test_a_trace_without_prices_for_an_unknown_instance_asks_for_them(tmp_path):
    path = tmp_path / "mystery.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [1] * 100}))
    out = skygreen(
        tmp_path,
        "simulate",
        str(path),
        "--hours",
        "1h",
        "--deadline",
        "2h",
        "--changeover",
        "6m",
        "--policy",
        "greedy",
        "--catalog",
        str(FIXTURE_CATALOG),
    )
    assert out.returncode == 2 and "--spot-price" in out.stderr and "--on-demand-price" in out.stderr


def test_the_real_paper_trace(shared_traces_dir, tmp_path):
    path = shared_traces_dir / "preemption/1-node/aws-04-22-2023/us-west-2b_v100_1.json"
    out = skygreen(
        tmp_path,
        "simulate",
        str(path),
        "--hours",
        "24h",
        "--deadline",
        "30h",
        "--changeover",
        "0.3h",
        "--policy",
        "all",
        "--json",
        "--on-demand-price",
        "3.06",
        "--start",
        "40h",
    )
    assert out.returncode == 0, out.stderr
    rows = {r["policy"]: r for r in json.loads(out.stdout)}
    assert all(r["deadline_met"] for r in rows.values())
    for name in ("greedy", "uniform_progress", "skygreen"):
        assert rows["optimum"]["cost_usd"] <= rows[name]["cost_usd"] < rows["on_demand"]["cost_usd"]


def test_several_zones_of_a_capacity_csv(tmp_path):
    wide = tmp_path / "gcp_h100_a3-highgpu-1g_x16_capacity_2025-10.csv"
    rows = ["scheduled_at_utc,run_id,us-east4-a,us-west1-b"]
    for i in range(200):
        a, b = (16, 0) if (i // 12) % 2 == 0 else (3, 16)
        rows.append(f"2025-10-04T{i // 6 % 24:02d}:{i % 6 * 10:02d}:00Z,r{i},{a},{b}")
    # timestamps wrap within a day, the median gap is still 10 min
    wide.write_text("\n".join(rows) + "\n")
    args = ["simulate", str(wide), "--nodes", "16", "--hours", "10h", "--deadline", "20h", "--changeover", "20m",
            "--policy", "greedy", "--spot-price", "1", "--on-demand-price", "4", "--json"]  # fmt: skip
    (one,) = json.loads(skygreen(tmp_path, *args, "--zone", "us-east4-a").stdout)
    (both,) = json.loads(skygreen(tmp_path, *args, "--zone", "all").stdout)
    assert one["deadline_met"] and both["deadline_met"]
    assert both["cost_usd"] < one["cost_usd"] and both["on_demand_h"] == 0.0
    out = skygreen(tmp_path, *args[:-1], "--zone", "us-east4-a,us-west1-b")
    assert out.returncode == 0 and "zones us-east4-a, us-west1-b" in out.stdout
