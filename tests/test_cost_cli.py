"""`skygreen cost TASK`, `cost RUN`, `compare`, measured speeds feeding `plan`, and the new
budget fields, through the real `skygreen` command. Ledgers here are written with the real
writer functions into local buckets, with round numbers so the answers can be worked by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skygreen.checkpoint.local_store import LocalStore
from skygreen.costs.costing import metric_mode
from skygreen.launch.registry import Registry, RunRecord
from skygreen.ledger import Place, Segment, write_segment
from skygreen.ledger.pricing import CONTROLLER_AUTOSTOP_S, CONTROLLER_USD_PER_HOUR
from skygreen.ledger.records import new_segment_key

REPO = Path(__file__).resolve().parents[1]
CATALOG = REPO / "tests" / "data" / "catalog" / "v8"
T0 = 1_780_000_000.0
TASK = """name: demo
skygreen:
  gpus: [L4, T4]
  work: {gpu_hours: 2, gpu: A100}
  early_stopping: {metric: val_loss, patience: 3}
run: python train.py
"""


def skygreen(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "skygreen.cli", *args], capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )


@pytest.fixture
def task(private_home, tmp_path) -> Path:
    path = tmp_path / "task.yaml"
    path.write_text(TASK)
    return path


VAL_LOSS_MIN = {"metric": "val_loss", "mode": "min"}


def add_run(task: Path, run_id: str, segments: list[dict], *, mode: str = "cloud", bucket: Path,
            early_stopping: dict | None = VAL_LOSS_MIN, metric: str = "val_loss") -> None:  # fmt: skip
    """A run record plus its ledger: each dict gives place, start offset, hours, steps, samples, and
    the values of `metric` (`losses`)."""
    green = {"early_stopping": early_stopping} if early_stopping else {}
    Registry().save(RunRecord(run_id=run_id, task_path=str(task), task_name="demo", mode=mode, launcher="local", bucket=str(bucket),
                              task_yaml=str(task), spec_snapshot={"skygreen": green},
                              created_at="2026-01-01T00:00:00Z", state="SUCCEEDED"))  # fmt: skip
    store = LocalStore(bucket / run_id)
    for s in segments:
        start = T0 + s["at_h"] * 3600
        end = start + s["hours"] * 3600
        write_segment(store, Segment(
            run_id=run_id, key=new_segment_key(start), place=s["place"], started_at=start, updated_at=end, ended_at=end,
            end=s.get("end", "completed"), start_step=s["steps"][0], step=s["steps"][1], start_samples=s["samples"][0],
            samples=s["samples"][1], samples_per_epoch=1000, first_step_at=start, train_s=s["hours"] * 3600,
            metrics={metric: tuple((step, start + i, v) for i, (step, v) in enumerate(s.get("losses", ())))},
        ))  # fmt: skip


GCP_L4 = Place(
    cloud="gcp",
    region="us-central1",
    instance_type="g2-standard-4",
    spot=True,
    gpu="L4",
    gpu_count=1,
    price_usd_per_hour=0.25,
    price_source="plan",
)
AWS_T4 = Place(
    cloud="aws",
    region="us-east-1",
    instance_type="g4dn.xlarge",
    spot=True,
    gpu="T4",
    gpu_count=1,
    price_usd_per_hour=0.5,
    price_source="plan",
)


def test_cost_task_lists_each_cloud_spot_and_on_demand_the_pick_first(task):
    out = skygreen("cost", str(task), "--catalog", str(CATALOG), "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["estimate"] is True
    clouds = [c["cloud"] for c in data["clouds"]]
    assert clouds[0] == data["pick"]["cloud"] and sorted(clouds) == ["aws", "azure", "gcp"]
    for c in data["clouds"]:
        assert c["spot"]["spot"] is True and c["on_demand"]["spot"] is False
        assert c["spot"]["est_cost_usd"] == pytest.approx(c["spot"]["price_usd_per_hour"] * c["spot"]["est_hours"])
    assert set(data["speeds"].values()) == {"prior"}
    text = skygreen("cost", str(task), "--catalog", str(CATALOG)).stdout
    assert "plan's pick:" in text and "best on-demand offer" in text


def test_cost_and_compare_of_two_runs_by_hand(task, tmp_path):
    bucket = tmp_path / "bucket"
    # run a: 1 h on gcp L4 at $0.25, preempted at step 100; 2 h on aws T4 at $0.50, from step 100 to 300
    add_run(task, "demo-a", [
        {"place": GCP_L4, "at_h": 0, "hours": 1, "steps": (0, 100), "samples": (0, 3200), "end": "preempted", "losses": [(50, 2.0)]},
        {"place": AWS_T4, "at_h": 1.5, "hours": 2, "steps": (100, 300), "samples": (3200, 9600), "losses": [(300, 1.0)]},
    ], bucket=bucket)  # fmt: skip
    # run b: 1 h on gcp L4, 300 steps, loss 2.0 -> 1.5
    add_run(
        task,
        "demo-b",
        [
            {
                "place": GCP_L4,
                "at_h": 0,
                "hours": 1,
                "steps": (0, 300),
                "samples": (0, 9600),
                "losses": [(10, 2.0), (300, 1.5)],
            }
        ],
        bucket=bucket,
    )
    ctrl = CONTROLLER_USD_PER_HOUR["gcp"]
    total_a = (
        0.25 * 1 + 0.5 * 2 + ctrl * (3.5 + CONTROLLER_AUTOSTOP_S / 3600)
    )  # no checkpoints in these buckets: storage 0
    total_b = 0.25 + ctrl * (1 + CONTROLLER_AUTOSTOP_S / 3600)
    out = skygreen("cost", "demo-a", "--json")
    assert out.returncode == 0, out.stderr
    a = json.loads(out.stdout)
    assert a["total_usd"] == pytest.approx(total_a, abs=1e-6)
    assert a["cost_per_step_usd"] == pytest.approx(total_a / 300) and a["epochs"] == pytest.approx(9.6)
    assert a["cost_per_epoch_usd"] == pytest.approx(total_a / 9.6)
    assert a["preemptions"] == 1 and a["lost_s"] == 0.0  # resumed at the step it stopped, first step at once
    compare = json.loads(skygreen("compare", "demo-a", "demo-b", "--json").stdout)
    assert [r["total_usd"] for r in compare] == [pytest.approx(total_a, abs=1e-6), pytest.approx(total_b, abs=1e-6)]
    assert compare[0]["improvement"] == pytest.approx(1.0) and compare[0]["usd_per_improvement"] == pytest.approx(
        total_a
    )
    assert compare[1]["improvement"] == pytest.approx(0.5) and compare[1]["usd_per_improvement"] == pytest.approx(
        total_b / 0.5
    )
    assert compare[0]["clouds_node_hours"] == {"gcp": 1.0, "aws": 2.0}
    status = json.loads(skygreen("status", "demo-a", "--json").stdout)
    assert round(status["spend_usd"], 2) == round(a["total_usd"], 2)
    text = skygreen("compare", "demo-a", "demo-b").stdout
    assert "demo-a" in text and f"${total_a:,.2f}" in text


@pytest.mark.parametrize(
    ("name", "expected"),
    [("val_loss", "min"), ("perplexity", "min"), ("wer", "min"), ("mape", "min"), ("accum_loss", "min"),
     ("val_acc", "max"), ("top1_accuracy", "max"), ("eval/f1", "max"), ("mAP50", "max"), ("rouge1", "max")],
)  # fmt: skip
def test_a_metric_without_an_early_stopping_mode_takes_its_direction_from_its_name(name, expected):
    assert metric_mode(name) == expected


def test_compare_counts_a_rising_accuracy_as_an_improvement_without_early_stopping(task, tmp_path):
    climb = [{"place": GCP_L4, "at_h": 0, "hours": 1, "steps": (0, 300), "samples": (0, 9600),
              "losses": [(10, 0.5), (300, 0.75)]}]  # fmt: skip
    add_run(task, "demo-acc", climb, bucket=tmp_path / "b", early_stopping=None, metric="val_acc")
    add_run(
        task,
        "demo-acc-min",
        climb,
        bucket=tmp_path / "b",
        metric="val_acc",
        early_stopping={"metric": "val_acc", "mode": "min"},
    )  # fmt: skip  (the task's mode wins over the name)
    out = skygreen("compare", "demo-acc", "demo-acc-min", "--json")
    assert out.returncode == 0, out.stderr
    by_name, by_task = json.loads(out.stdout)
    assert by_name["metric"] == "val_acc" and by_name["metric_mode"] == "max"
    assert by_name["improvement"] == pytest.approx(0.25) and by_name["usd_per_improvement"] > 0
    assert by_task["metric_mode"] == "min" and by_task["improvement"] == pytest.approx(-0.25)
    text = skygreen("compare", "demo-acc", "demo-acc-min").stdout
    assert "val_acc (max)" in text and "val_acc (min)" in text and "0.2500" in text


def test_compare_leaves_out_a_run_not_training_yet_and_says_so(task, tmp_path):
    """Many runs started at once: a comparison taken while one has not written its ledger yet
    compares the others (exit 0) and names the one left out, as `cost RUN` answers for it."""
    add_run(task, "demo-done", [{"place": GCP_L4, "at_h": 0, "hours": 1, "steps": (0, 300), "samples": (0, 9600),
                                 "losses": [(10, 2.0), (300, 1.5)]}], bucket=tmp_path / "b")  # fmt: skip
    add_run(task, "demo-fresh", [], bucket=tmp_path / "b")  # launched, no ledger yet
    out = skygreen("compare", "demo-done", "demo-fresh", "--json")
    assert out.returncode == 0, out.stderr
    assert [r["run_id"] for r in json.loads(out.stdout)] == ["demo-done"]
    assert "run demo-fresh has no ledger yet" in out.stderr and "left out of the comparison" in out.stderr
    text = skygreen("compare", "demo-done", "demo-fresh")
    assert text.returncode == 0 and "demo-done" in text.stdout and "demo-fresh" not in text.stdout
    assert "run demo-fresh has no ledger yet" in text.stderr
    alone = skygreen("compare", "demo-fresh")  # nothing to compare yet: the note alone, no empty table
    assert alone.returncode == 0 and alone.stdout == "" and "demo-fresh" in alone.stderr
    unknown = skygreen("compare", "demo-done", "demo-nope")  # an unknown run is still an error
    assert unknown.returncode == 2 and "demo-nope" in unknown.stderr


def test_measured_throughput_feeds_the_plan(task, tmp_path):
    """A completed run: 9600 samples on one L4 at 9600 samples per 2 h = 1.3333 samples/s.
    The task says 2 GPU-hours on an A100 (speed 1.0): speed(L4) = 2 x 1.0 x 3600 x (9600/7200) / 9600 = 1.0."""
    add_run(
        task,
        "demo-m",
        [{"place": GCP_L4, "at_h": 0, "hours": 2, "steps": (0, 300), "samples": (0, 9600)}],
        bucket=tmp_path / "b",
    )
    before = json.loads(skygreen("plan", str(task), "--catalog", str(CATALOG), "--json").stdout)
    assert "none measured yet" in before["assumptions"][0]
    assert skygreen("cost", "demo-m").returncode == 0  # reading the ledger records what it measured
    after = json.loads(skygreen("plan", str(task), "--catalog", str(CATALOG), "--json").stdout)
    assert "measured by earlier runs of this task: L4 1" in after["assumptions"][0]
    l4 = next(c for c in after["candidates"] if c["accelerator"] == "L4")
    assert l4["compute_hours"] == pytest.approx(2.0)  # 2 GPU-hours of A100 work at L4 speed 1.0
    est = json.loads(skygreen("cost", str(task), "--catalog", str(CATALOG), "--json").stdout)
    assert est["speeds"]["L4"] == "measured (1 runs)" and est["speeds"].get("T4", "prior") == "prior"


@pytest.mark.parametrize(
    ("section", "field", "words"),
    [
        ("budget_alerts: {at: [0.5, 80]}", "skygreen.budget_alerts.at[1]", "write 0.8 for 80%"),
        (
            "budget_alerts: {webhook_env: 'https://hooks.example/T0/XYZZY'}",
            "skygreen.budget_alerts.webhook_env",
            "not the URL itself",
        ),
        ("budget_alerts: {burn_usd_per_hour: -1}", "skygreen.budget_alerts.burn_usd_per_hour", ""),
        ("budget_alerts: {at_fractions: [0.5]}", "skygreen.budget_alerts.at_fractions", "unknown key"),
    ],
)
def test_budget_fields_are_validated(tmp_path, private_home, section, field, words):
    path = tmp_path / "task.yaml"
    path.write_text(f"skygreen:\n  budget_usd: 10\n  {section}\nrun: python train.py\n")
    out = skygreen("plan", str(path), "--catalog", str(CATALOG))
    assert out.returncode == 2 and field in out.stderr and words in out.stderr
    assert "Traceback" not in out.stderr and "XYZZY" not in out.stderr  # the URL is a credential: never echoed


def test_budget_settings_reach_the_runtime_environment(tmp_path):
    from skygreen.task.settings import RuntimeSettings
    from skygreen.task.spec import parse_spec_text

    spec = parse_spec_text(
        "skygreen:\n  budget_usd: 25\n  budget_alerts: {at: [0.9, 0.5], webhook_env: HOOK, burn_usd_per_hour: 3}\nrun: x\n"
    )
    env = RuntimeSettings.from_spec(spec.green, run_id="r-1", bucket="/tmp/b").to_env()
    assert env["SKYGREEN_BUDGET_USD"] == "25" and env["SKYGREEN_BUDGET_ALERTS"] == "0.5,0.9"
    assert env["SKYGREEN_BUDGET_WEBHOOK_ENV"] == "HOOK" and env["SKYGREEN_BURN_ALERT_USD_PER_HOUR"] == "3"
    back = RuntimeSettings.from_env(env)
    assert back.budget_usd == 25.0 and back.burn_alert_usd_per_hour == 3.0


def test_cost_of_an_unknown_run_exits_2(private_home):
    out = skygreen("cost", "no-such-run")
    assert out.returncode == 2 and "no run 'no-such-run'" in out.stderr


def test_a_local_run_whose_task_file_is_gone_still_gets_its_cost(task, tmp_path):
    local = Place(cloud="local", price_usd_per_hour=0.0, price_source="local")
    add_run(
        task,
        "demo-l",
        [{"place": local, "at_h": 0, "hours": 0.5, "steps": (0, 50), "samples": (0, 1600)}],
        mode="local",
        bucket=tmp_path / "b",
    )
    task.unlink()
    out = skygreen("cost", "demo-l")
    assert out.returncode == 0, out.stderr
    assert "total $0.00" in out.stdout and "no estimate on the clouds: task file not found" in out.stdout


def test_cost_task_fits_columns_and_keeps_every_offer_whole(task):
    data = json.loads(skygreen("cost", str(task), "--catalog", str(CATALOG), "--json").stdout)
    offers = [c[kind] for c in data["clouds"] for kind in ("spot", "on_demand") if c[kind]]
    labels = [f"{o['region']} {o['instance_type']} ({o['accelerator']}x{o['accelerator_count']})" for o in offers]
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    wide = subprocess.run([sys.executable, "-m", "skygreen.cli", "cost", str(task), "--catalog", str(CATALOG)],
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    narrow = subprocess.run([sys.executable, "-m", "skygreen.cli", "cost", str(task), "--catalog", str(CATALOG)],
                            capture_output=True, text=True, timeout=120, env={**env, "COLUMNS": "80"})  # fmt: skip
    assert wide.returncode == 0 and narrow.returncode == 0, wide.stderr + narrow.stderr
    assert max(len(line) for line in wide.stdout.splitlines()) > 80  # piped: one wide table, nothing folded
    # every line fits, but for a path longer than the line, which stands alone rather than cut
    assert all(len(line) <= 80 or len(line.split()) == 1 for line in narrow.stdout.splitlines()), narrow.stdout
    for text in (wide.stdout, narrow.stdout):
        assert all(label in text for label in labels), (labels, text)  # never cut or folded mid-name
        assert "best spot offer" in text and "best on-demand offer" in text


def test_cost_of_a_run_at_80_columns_breaks_cells_only_between_words(task, tmp_path):
    sim = Place(cloud="local", simulated_gpu="T4x1", price_usd_per_hour=0.0, price_source="local")
    add_run(task, "demo-w", [
        {"place": GCP_L4, "at_h": 0, "hours": 1, "steps": (0, 100), "samples": (0, 3200), "end": "preempted"},
        {"place": sim, "at_h": 1.5, "hours": 1, "steps": (100, 200), "samples": (3200, 6400), "end": "early-stopped"},
    ], bucket=tmp_path / "bucket")  # fmt: skip
    env = {**os.environ, "COLUMNS": "80"}
    out = subprocess.run([sys.executable, "-m", "skygreen.cli", "cost", "demo-w"], capture_output=True, text=True,
                         timeout=240, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), out.stdout
    words = set(out.stdout.split())
    for whole in ("(simulated", "T4x1", "early-stopped", "g2-standard-4", "preempted", "us-central1", "05-28"):
        assert whole in words, (whole, out.stdout)


def test_an_errors_allowed_line_wraps_at_80_columns():
    from skygreen.errors import SpecError

    allowed = ", ".join(f"choice_number_{i}" for i in range(20))
    lines = str(SpecError("skygreen.x", "unknown value", value="y", allowed=allowed)).splitlines()
    assert all(len(line) <= 80 for line in lines) and lines[2].startswith("  allowed: choice_number_0,")
    assert " ".join(" ".join(lines[2:]).split()) == f"allowed: {allowed}"


def test_cost_task_shows_each_clouds_data_dollars_for_the_7b_case(shared_catalog_dir, tmp_path):
    """The 7B full fine-tune with its bucket in us-east-1: each cloud's best offer shows its
    compute, data and total; an offer beside the bucket moves its bytes free, Azure pays to send
    them to AWS. Without a bucket nothing is priced beyond compute."""
    head = "name: llama7b\nskygreen:\n  model: {params: 7B}\n  work: {gpu_hours: 200, gpu: A100-80GB}\n"
    with_bucket = tmp_path / "bucket.yaml"
    with_bucket.write_text(head + "  checkpoint: {bucket: s3://my-ckpts/llama, region: us-east-1}\nrun: python t.py\n")
    without = tmp_path / "none.yaml"
    without.write_text(head + "run: python t.py\n")
    data = json.loads(skygreen("cost", str(with_bucket), "--catalog", str(shared_catalog_dir), "--json").stdout)
    spot = {c["cloud"]: c["spot"] for c in data["clouds"]}
    for offer in spot.values():
        bill = offer["cost_usd"]
        assert bill["compute"] + bill["transfer"] + bill["storage"] + bill["requests"] == pytest.approx(bill["total"])
        assert offer["est_cost_usd"] == pytest.approx(bill["total"])
    assert (
        spot["azure"]["cost_usd"]["transfer"] > spot["azure"]["cost_usd"]["compute"] * 0.5
    )  # 80+ GB a save, cross-cloud
    if spot["aws"]["region"] == "us-east-1":
        assert spot["aws"]["cost_usd"]["transfer"] == 0.0
    assert data["bucket"] == "bucket s3://my-ckpts/llama in aws us-east-1 (as the task states)"
    text = skygreen("cost", str(with_bucket), "--catalog", str(shared_catalog_dir)).stdout
    assert "compute" in text and "data" in text and "in aws us-east-1 (as the task states)" in text
    bare = json.loads(skygreen("cost", str(without), "--catalog", str(shared_catalog_dir), "--json").stdout)
    assert all(
        c[kind]["cost_usd"]["total"] == c[kind]["cost_usd"]["compute"]
        for c in bare["clouds"]
        for kind in ("spot", "on_demand")
    )
    assert bare["bucket"].startswith("no cloud bucket")


def test_compare_at_80_columns_breaks_cells_only_between_words(task, tmp_path):
    """Too wide for 80 columns in one table, `compare` prints two that fit, every figure whole."""
    first, second = "demo-20261206-200257-4eee", "demo-20261206-210301-9f3a"  # run ids as long as real ones
    add_run(task, first, [
        {"place": GCP_L4, "at_h": 0, "hours": 1, "steps": (0, 100), "samples": (0, 3200), "end": "preempted", "losses": [(50, 2.0)]},
        {"place": AWS_T4, "at_h": 1.5, "hours": 2, "steps": (100, 300), "samples": (3200, 9600), "losses": [(300, 1.0)]},
    ], bucket=tmp_path / "bucket")  # fmt: skip
    add_run(task, second, [{"place": GCP_L4, "at_h": 0, "hours": 1, "steps": (0, 300), "samples": (0, 9600),
                            "losses": [(10, 2.0), (300, 1.5)]}], bucket=tmp_path / "bucket")  # fmt: skip
    out = subprocess.run([sys.executable, "-m", "skygreen.cli", "compare", first, second], capture_output=True,
                         text=True, timeout=240, env={**os.environ, "COLUMNS": "80"})  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert all(len(line) <= 80 for line in out.stdout.splitlines()), out.stdout
    words = set(out.stdout.split())
    for whole in (first, second, "val_loss", "(min)", "$1.96", "$0.48", "1.0000", "0.5000", "improved", "unit",
                  "kWh", "CO2e", "itemises"):  # fmt: skip
        assert whole in words, (whole, out.stdout)
    assert out.stdout.count(first) == 2, "two tables, each led by the run"
