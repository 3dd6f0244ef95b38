"""Energy and CO2e, segment by segment (`skygreen.ledger.energy`): one computation for `status`,
`cost` and the energy statement, checked on a run that moved from AWS eu-south-2 to GCP
asia-northeast3, whose two regions differ in PUE and in grid intensity."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skygreen.checkpoint.local_store import LocalStore
from skygreen.launch.registry import Registry, RunRecord
from skygreen.ledger import Place, Segment, write_segment
from skygreen.ledger.energy import run_energy, segment_energy
from skygreen.ledger.records import new_segment_key
from skygreen.plan import carbon
from skygreen.plan.cost import PUE

T0 = 1_780_000_000.0
AWS = Place(cloud="aws", region="eu-south-2", instance_type="g5.xlarge", spot=True, gpu="A10G", gpu_count=1,
            price_usd_per_hour=0.5, price_source="plan")  # fmt: skip
GCP = Place(cloud="gcp", region="asia-northeast3", instance_type="g2-standard-4", spot=True, gpu="L4", gpu_count=1,
            price_usd_per_hour=0.25, price_source="plan")  # fmt: skip
AWS_J, GCP_J = 3.6e6, 1.8e6  # 1 kWh and 0.5 kWh on the boards


def expected_co2e_kg() -> float:
    aws = 1.0 * PUE["aws"] * carbon.intensity("aws", "eu-south-2").g_co2e_per_kwh / 1000
    gcp = 0.5 * PUE["gcp"] * carbon.intensity("gcp", "asia-northeast3").g_co2e_per_kwh / 1000
    return aws + gcp


def test_each_segment_is_counted_at_its_own_clouds_pue_and_regions_intensity():
    energy = run_energy([segment_energy(AWS, AWS_J), segment_energy(GCP, GCP_J), segment_energy(GCP, None)])
    facility = 1.0 * PUE["aws"] + 0.5 * PUE["gcp"]
    assert energy.gpu_energy_kwh == pytest.approx(1.5) and energy.energy_kwh == pytest.approx(facility)
    assert energy.co2e_kg == pytest.approx(expected_co2e_kg())
    assert [r.label for r in energy.regions] == ["aws eu-south-2", "gcp asia-northeast3"]
    assert [r.share for r in energy.regions] == pytest.approx([PUE["aws"] / facility, 0.5 * PUE["gcp"] / facility])
    nothing = run_energy([segment_energy(Place(cloud="local"), None)])
    assert (nothing.energy_kwh, nothing.co2e_kg, nothing.regions) == (None, None, ())


def skygreen(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skygreen.cli", *args], capture_output=True, text=True,
                          timeout=240, env=dict(os.environ))  # fmt: skip


def moved_run(tmp_path: Path, run_id: str) -> None:
    """A run record, its ledger (1 h on AWS then 1 h on GCP) and its final checkpoint's manifest."""
    from skygreen.checkpoint.manifest import SHARED_BLOB, Manifest, blob_info, blob_key, manifest_key

    bucket = tmp_path / "bucket"
    task = tmp_path / "task.yaml"
    task.write_text("name: moved\nskygreen: {gpus: [L4]}\nrun: python train.py\n")
    Registry().save(RunRecord(run_id=run_id, task_path=str(task), task_name="moved", mode="cloud", launcher="local",
                              bucket=str(bucket), task_yaml=str(task), spec_snapshot={"skygreen": {}},
                              created_at="2026-01-01T00:00:00Z", state="SUCCEEDED"))  # fmt: skip
    store = LocalStore(str(bucket / run_id))
    for i, (place, energy_j, end) in enumerate([(AWS, AWS_J, "preempted"), (GCP, GCP_J, "completed")]):
        start = T0 + i * 3600
        write_segment(store, Segment(run_id=run_id, key=new_segment_key(start), place=place, started_at=start,
                                     updated_at=start + 3600, ended_at=start + 3600, end=end, start_step=100 * i,
                                     step=100 * (i + 1), first_step_at=start, train_s=3600.0, energy_j=energy_j))  # fmt: skip
    blob = b"weights at step 200"
    store.put(blob_key(200, SHARED_BLOB), blob)
    meta = {"energy_j": AWS_J + GCP_J, "wall_s": 7200.0, "state": "completed",
            "power": {"method": "nvml-counter", "gpus": 1}}  # fmt: skip
    manifest = Manifest(step=200, created_at="2026-01-01T02:00:00.000000Z", blobs={SHARED_BLOB: blob_info(blob)},
                        model_sha256=hashlib.sha256(blob).hexdigest(), meta=meta)  # fmt: skip
    store.put(manifest_key(200), manifest.dumps())


def test_status_cost_and_the_statement_agree_on_a_run_that_moved_between_clouds(private_home, tmp_path):
    moved_run(tmp_path, "moved-a")
    status = skygreen("status", "moved-a", "--json")
    cost = skygreen("cost", "moved-a", "--json")
    text = skygreen("status", "moved-a", "--statement")
    assert status.returncode == cost.returncode == text.returncode == 0, status.stderr + cost.stderr + text.stderr
    s, c = json.loads(status.stdout), json.loads(cost.stdout)
    for key in ("energy_kwh", "gpu_energy_kwh", "co2e_kg"):
        assert s[key] == c[key], key
    assert c["gpu_energy_kwh"] == pytest.approx(1.5) and c["co2e_kg"] == pytest.approx(expected_co2e_kg())
    assert c["energy_kwh"] == pytest.approx(1.0 * PUE["aws"] + 0.5 * PUE["gcp"])
    assert s["energy"]["facility_kwh"] == c["energy_kwh"] and s["energy"]["co2e_kg"] == c["co2e_kg"]
    assert [r["label"] for r in c["energy_regions"]] == ["aws eu-south-2", "gcp asia-northeast3"]
    compute = f"${c['compute_usd']:.2f}"  # $0.75: the two GPU hours, not the total with the controller
    assert c["total_usd"] > c["compute_usd"] and f"The compute cost {compute}." in text.stdout, text.stdout
    share = 100 * c["energy_regions"][0]["share"]
    assert f"aws eu-south-2 ({share:.0f}% of the energy) and gcp asia-northeast3" in text.stdout, text.stdout
