"""A cloud run's ledger written by the real runtime into moto S3, one VM killed with SIGKILL
and the run finished on another cloud; `status`, `cost` and `compare` (the real `skygreen`
command) agree on its total, which is also computed here by hand from the raw ledger objects.

Only the cloud launch is fake (`skygreen.testing.FakeLauncher`): the training runs as real
processes with the rendered task's environment plus what SkyPilot gives a VM
(`SKYPILOT_CLUSTER_INFO`, node variables). Prices come from the real catalog in `../shared`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from metadata_server import MetadataServer
from skygreen.bill.rates import Place as BillPlace
from skygreen.bill.rates import transfer_usd
from skygreen.ledger.pricing import (
    CONTROLLER_AUTOSTOP_S,
    CONTROLLER_USD_PER_HOUR,
    STORAGE_USD_PER_GB_MONTH,
    catalog_lookup,
)
from skygreen.ledger.records import Place
from skygreen.plan.catalog import load_catalog
from skygreen.runtime.hold import HOLD_ENV

REPO = Path(__file__).resolve().parents[1]
SKYGREEN = [sys.executable, "-m", "skygreen.cli"]

pytestmark = pytest.mark.slow


def skygreen(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SKYGREEN, *args], env=env, capture_output=True, text=True, timeout=300)


def wait_for(predicate, what: str, timeout_s: float = 240, process: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the run ended (exit {process.returncode}) before {what}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def raw_segments(bucket: str, run_id: str) -> list[dict]:
    import boto3

    s3 = boto3.client("s3")
    keys = sorted(
        o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"runs/{run_id}/ledger/").get("Contents", [])
    )
    return [json.loads(s3.get_object(Bucket=bucket, Key=k)["Body"].read()) for k in keys]


def checkpoint_bytes(bucket: str, run_id: str) -> int:
    import boto3

    s3 = boto3.client("s3")
    manifests = [
        o["Key"]
        for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"runs/{run_id}/ckpt/").get("Contents", [])
        if o["Key"].endswith("manifest.json")
    ]
    return sum(
        b["size"]
        for k in manifests
        for b in json.loads(s3.get_object(Bucket=bucket, Key=k)["Body"].read())["blobs"].values()
    )


def step_bytes(bucket: str, run_id: str, step: int) -> int:
    """The size of one committed checkpoint, from its manifest."""
    import boto3

    body = boto3.client("s3").get_object(Bucket=bucket, Key=f"runs/{run_id}/ckpt/{step:012d}/manifest.json")["Body"]
    return sum(b["size"] for b in json.loads(body.read())["blobs"].values())


@pytest.fixture
def catalog_dir(request) -> Path:
    """The real catalog in ../shared when present, else the small fixture catalog (same code)."""
    for shared in (REPO.parent / "shared" / "catalog" / "v8", REPO.parent.parent / "shared" / "catalog" / "v8"):
        if (shared / "aws" / "vms.csv").exists():
            return shared
    return REPO / "tests" / "data" / "catalog" / "v8"


def test_killed_vm_then_another_cloud_priced_the_same_by_status_cost_and_compare(
    s3_bucket, catalog_dir, private_home, tmp_path
):
    shared_catalog_dir = catalog_dir
    work = tmp_path / "task"
    work.mkdir()
    shutil.copy(REPO / "tasks" / "tiny.py", work / "tiny.py")
    (work / "task.yaml").write_text(
        "name: tiny\nskygreen:\n  gpus: [L4]\n  clouds: [gcp, aws]\n  work: {gpu_hours: 0.05, gpu: T4}\n"
        "  batch: {effective: 32, micro: 16}\n  precision: fp32\n"
        f"  checkpoint: {{bucket: 's3://{s3_bucket}/runs', every: 10, keep: 3}}\n"
        "  early_stopping: {metric: val_loss, mode: min, patience: 3, min_delta: 0.001, grace: 2}\nrun: python tiny.py\n"
    )
    env = dict(
        os.environ, SKYGREEN_LAUNCHER="skygreen.testing:FakeLauncher", SKYGREEN_FAKE_LAUNCHER_DIR=str(tmp_path / "fake")
    )
    up = skygreen(env, "up", str(work / "task.yaml"), "--no-smoke", "--catalog", str(shared_catalog_dir))
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.split("launched run ")[1].split()[0]
    envs = json.loads((tmp_path / "fake" / "jobs.json").read_text())["1"]["task"]["envs"]
    offers = json.loads(envs["SKYGREEN_OFFERS"])
    gcp, aws = (next(o for o in offers if o[0] == cloud) for cloud in ("gcp", "aws"))
    # The rendered prices are the real catalog's, offer for offer.
    lookup = catalog_lookup(load_catalog(shared_catalog_dir))
    for cloud, region, itype, gpu, count, spot, price in (gcp, aws):
        assert price == pytest.approx(
            lookup(Place(cloud=cloud, region=region, instance_type=itype, gpu=gpu, gpu_count=count, spot=spot))
        )

    def vm(offer, metadata) -> dict:
        cloud, region = offer[0], offer[1]
        info = {
            "cluster_name": f"sky-{cloud}",
            "cloud": {"gcp": "GCP", "aws": "AWS"}[cloud],
            "region": region,
            "zone": None,
        }
        return {**env, **envs, "SKYPILOT_CLUSTER_INFO": json.dumps(info), "SKYPILOT_NUM_NODES": "1", "SKYPILOT_NUM_GPUS_PER_NODE": "1",
                f"SKYGREEN_{cloud.upper()}_METADATA_URL": metadata.url, "TINY_STEPS": "60", "OMP_NUM_THREADS": "1"}  # fmt: skip

    with MetadataServer("gcp") as gcp_md, MetadataServer("aws") as aws_md:
        # held at step 10 after its checkpoint: the kill lands mid-run however slow this machine is
        first = subprocess.Popen([sys.executable, "tiny.py"], cwd=work, env={**vm(gcp, gcp_md), HOLD_ENV: "10"},
                                 start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            # gate: a checkpoint at step 10 (every: 10) and the ledger updated with it
            wait_for(lambda: checkpoint_bytes(s3_bucket, run_id) and (s := raw_segments(s3_bucket, run_id)) and s[-1]["step"] >= 10,
                     "a committed checkpoint and the ledger updated with it", process=first)  # fmt: skip
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
        second = subprocess.run(
            [sys.executable, "tiny.py"], cwd=work, env=vm(aws, aws_md), capture_output=True, text=True, timeout=300
        )
    assert second.returncode == 0, second.stderr[-2000:]
    from skygreen.testing import FakeLauncher

    FakeLauncher(tmp_path / "fake").set_state("1", "SUCCEEDED", duration_s=60.0, cloud="aws", region=aws[1])

    # By hand, from the raw objects.
    s1, s2 = raw_segments(s3_bucket, run_id)
    assert s1["end"] == "running" and s1["ended_at"] is None  # killed: never wrote its end
    assert s2["end"] == "completed" and s2["step"] == 60 and s2["start_step"] == 10
    # The bytes each VM moved, counted at the store: the second restored step 10's checkpoint and
    # committed up to step 60, whose real size the segment records.
    bucket = f"s3://{s3_bucket}"
    assert set(s1["bytes_uploaded"]) == {bucket} and s1["bytes_uploaded"][bucket] > 0
    assert s2["bytes_downloaded"][bucket] >= s2["restore_bytes"] > 0
    assert s2["checkpoint_bytes"] == step_bytes(s3_bucket, run_id, 60)
    assert s2["bytes_uploaded"][bucket] >= 5 * s2["checkpoint_bytes"]  # steps 20 to 60, each one saved
    assert (s1["place"]["cloud"], s1["place"]["price_usd_per_hour"]) == ("gcp", gcp[6])
    assert (s2["place"]["cloud"], s2["place"]["instance_type"], s2["place"]["price_usd_per_hour"]) == (
        "aws",
        aws[2],
        aws[6],
    )
    compute = (
        gcp[6] * (s1["updated_at"] - s1["started_at"]) / 3600 + aws[6] * (s2["ended_at"] - s2["started_at"]) / 3600
    )
    span_s = s2["ended_at"] - s1["started_at"]
    controller = CONTROLLER_USD_PER_HOUR["gcp"] * (span_s + CONTROLLER_AUTOSTOP_S) / 3600
    storage = checkpoint_bytes(s3_bucket, run_id) / 1e9 * STORAGE_USD_PER_GB_MONTH["s3"] * span_s / 3600 / 730
    # transfer: each VM's counted bytes at the rate between its region and the bucket's (moto's
    # GetBucketLocation: us-east-1), each direction of each pair on its own volume
    s3_place = BillPlace(cloud="aws", region="us-east-1")
    transfer = 0.0
    for raw in (s1, s2):
        vm_place = BillPlace(cloud=raw["place"]["cloud"], region=raw["place"]["region"])
        transfer += transfer_usd(vm_place, s3_place, raw["bytes_uploaded"].get(bucket, 0) / 1e9)
        transfer += transfer_usd(s3_place, vm_place, raw["bytes_downloaded"].get(bucket, 0) / 1e9)
    by_hand = compute + controller + storage + transfer

    status = json.loads(skygreen(env, "status", run_id, "--json").stdout)
    cost_out = skygreen(env, "cost", run_id, "--json", "--catalog", str(shared_catalog_dir))
    assert cost_out.returncode == 0, cost_out.stderr
    cost = json.loads(cost_out.stdout)
    compare = json.loads(skygreen(env, "compare", run_id, "--json", "--catalog", str(shared_catalog_dir)).stdout)
    assert cost["transfer_usd"] == pytest.approx(transfer, abs=1e-6) and transfer > 0  # GCP -> S3 crosses clouds
    assert cost["requests_usd"] > 0 and cost["storage_usd"] == pytest.approx(storage, abs=1e-6)
    assert cost["measured"] == {
        "compute": True,
        "controller": False,
        "transfer": True,
        "storage": True,
        "requests": False,
    }
    by_hand += cost["requests_usd"]  # estimated from the counted saves (`test_data_bill` checks the formula)
    assert cost["total_usd"] == pytest.approx(by_hand, abs=1e-6)
    assert (
        round(status["spend_usd"], 2)
        == round(cost["total_usd"], 2)
        == round(compare[0]["total_usd"], 2)
        == round(by_hand, 2)
    )
    assert (
        status["spend_usd"] == pytest.approx(cost["total_usd"], abs=1e-6)
        and compare[0]["total_usd"] == cost["total_usd"]
    )
    assert [s["end"] for s in cost["segments"]] == ["killed", "completed"]
    assert cost["preemptions"] == 1 and cost["steps"] == 60 and cost["lost_s"] > 0
    assert status["preemptions"] == cost["preemptions"]  # the kill -9 the runtime never saw, from the ledger
    save, last = status["checkpoint_save"], BillPlace(cloud=s2["place"]["cloud"], region=s2["place"]["region"])
    assert save["gb"] > 0 and save["route"] == f"{last.cloud} {last.region} -> aws us-east-1"  # what a save costs
    assert save["transfer_usd"] == pytest.approx(transfer_usd(last, s3_place, save["gb"]))
    assert save["usd"] == pytest.approx(save["transfer_usd"] + save["requests_usd"]) and save["requests_usd"] > 0
    detail = skygreen(env, "status", run_id).stdout
    assert "save cost" in detail and f"{last.cloud} {last.region} -> aws us-east-1" in detail
    assert cost["clouds_node_hours"].keys() == {"gcp", "aws"}
    text = skygreen(env, "cost", run_id, "--catalog", str(shared_catalog_dir)).stdout
    assert f"total ${cost['total_usd']:,.2f}" in text and "controller" in text and "killed" in text
    lines = {line.split()[0]: line.split() for line in text.splitlines() if line.strip()}
    for part, how in (("compute", "measured"), ("controller", "estimated"), ("transfer", "measured"),
                      ("storage", "measured"), ("requests", "estimated")):  # fmt: skip
        assert lines[part][2] == how, text
    assert compare[0]["transfer_usd"] == cost["transfer_usd"] and compare[0]["measured"] == cost["measured"]


def test_a_run_stops_at_its_budget_and_resumes_with_a_higher_one(s3_bucket, catalog_dir, private_home, tmp_path):
    """A budget of $0.0005 (the L4 offer plus the controller burn about $0.47/h: a few seconds).
    The real runtime stops with a checkpoint; status says BUDGET; resume without a higher
    budget is refused (exit 2); with one, the relaunched job gets it and finishes."""
    work = tmp_path / "task"
    work.mkdir()
    shutil.copy(REPO / "tasks" / "tiny.py", work / "tiny.py")
    (work / "task.yaml").write_text(
        "name: tiny\nskygreen:\n  gpus: [L4]\n  clouds: [gcp]\n  work: {gpu_hours: 0.0001, gpu: L4}\n  budget_usd: 0.0005\n"
        "  batch: {effective: 32, micro: 16}\n  precision: fp32\n"
        f"  checkpoint: {{bucket: 's3://{s3_bucket}/runs', every: 20, keep: 3}}\nrun: python tiny.py\n"
    )
    env = dict(
        os.environ, SKYGREEN_LAUNCHER="skygreen.testing:FakeLauncher", SKYGREEN_FAKE_LAUNCHER_DIR=str(tmp_path / "fake")
    )
    up = skygreen(env, "up", str(work / "task.yaml"), "--no-smoke", "--catalog", str(catalog_dir))
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.split("launched run ")[1].split()[0]
    from skygreen.testing import FakeLauncher

    fake = FakeLauncher(tmp_path / "fake")

    def train(job_id: str, metadata) -> subprocess.CompletedProcess:
        envs = json.loads((tmp_path / "fake" / "jobs.json").read_text())[job_id]["task"]["envs"]
        offer = json.loads(envs["SKYGREEN_OFFERS"])[0]
        info = {"cluster_name": "sky-1", "cloud": "GCP", "region": offer[1], "zone": None}
        vm = {**env, **envs, "SKYPILOT_CLUSTER_INFO": json.dumps(info), "SKYGREEN_GCP_METADATA_URL": metadata.url,
              "TINY_STEPS": "300", "TINY_EVAL_EVERY": "100", "OMP_NUM_THREADS": "1"}  # fmt: skip
        return subprocess.run(
            [sys.executable, "tiny.py"], cwd=work, env=vm, capture_output=True, text=True, timeout=300
        )

    with MetadataServer("gcp") as metadata:
        stopped = train("1", metadata)
        assert stopped.returncode == 0, stopped.stderr[-2000:]
        assert "reached its budget" in stopped.stderr and f"skygreen resume {run_id} --budget-usd" in stopped.stderr
        assert "budget alert" in stopped.stderr
        fake.set_state("1", "SUCCEEDED", duration_s=5.0, cloud="gcp")
        status = json.loads(skygreen(env, "status", run_id, "--json").stdout)
        assert status["state"] == "BUDGET" and not status["completed"] and status["step"] < 300
        assert status["spend_usd"] >= 0.0005
        refused = skygreen(env, "resume", run_id)
        assert refused.returncode == 2 and "--budget-usd" in refused.stderr
        resumed = skygreen(env, "resume", run_id, "--budget-usd", "5")
        assert resumed.returncode == 0, resumed.stderr
        envs2 = json.loads((tmp_path / "fake" / "jobs.json").read_text())["2"]["task"]["envs"]
        assert envs2["SKYGREEN_BUDGET_USD"] == "5"
        finished = train("2", metadata)
    assert finished.returncode == 0, finished.stderr[-2000:]
    fake.set_state("2", "SUCCEEDED", duration_s=30.0, cloud="gcp")
    done = json.loads(skygreen(env, "status", run_id, "--json").stdout)
    assert done["completed"] and done["step"] == 300
    cost = json.loads(skygreen(env, "cost", run_id, "--json", "--catalog", str(catalog_dir)).stdout)
    assert [s["end"] for s in cost["segments"]] == ["budget", "completed"]
    assert cost["segments"][1]["start_step"] == status["step"]  # continued from the budget checkpoint
