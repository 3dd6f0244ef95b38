"""A bucket per place (`checkpoint.buckets:`): the choice of the nearest bucket, the task field, the
plan's pricing against each offer's nearest bucket plus the copies moves make, a real run that
commits in one place (moto S3) and resumes in another (Azurite), and `skygreen plan` on such a task.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from skygreen.bill.bucket_places import move_copies, recovery_landing, set_places
from skygreen.bill.rates import Place, load_rates, transfer_usd
from skygreen.checkpoint.bucket_set import Member, bucket_first, members, nearest, nearest_url, set_url
from skygreen.checkpoint.bucket_url import join_url, parse_url
from skygreen.checkpoint.lease import LEASE_KEY, LeaseLostError, check_lease, read_lease
from skygreen.checkpoint.manifest import MANIFEST_NAME, committed_steps, step_prefix
from skygreen.checkpoint.store_factory import open_store
from skygreen.checkpoint.traffic import traffic_of
from skygreen.errors import SpecError
from skygreen.plan.catalog import load_catalog
from skygreen.plan.memory import checkpoint_gb
from skygreen.plan.rank import make_plan
from skygreen.runtime.checkpointer import Checkpointer
from skygreen.task.spec import parse_spec_text

ROOT = Path(__file__).resolve().parents[1]
VMS_HEADER = (
    "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone"
)
SET = {"us-west-2": "s3://ckpt-usw2/run", "aws": "s3://team-ckpt", "gcp": "gs://team-ckpt", "azure": "az://acct/ckpt"}


def task(checkpoint: str) -> str:
    return (
        "name: llama\nskygreen:\n  model: {params: 7B}\n  work: {gpu_hours: 200, gpu: A100-80GB}\n"
        f"  checkpoint: {checkpoint}\nrun: python train.py\n"
    )


def the_set(mapping: dict[str, str]) -> str:
    return set_url([Member(key=k, url=v) for k, v in mapping.items()])


# ---------------------------------------------------------------- the nearest bucket


def test_a_region_key_wins_over_its_clouds_key_then_the_cloud_then_the_home_bucket():
    found = members(the_set(SET))
    assert nearest(found, cloud="aws", region="us-west-2").url == "s3://ckpt-usw2/run"
    assert nearest(found, cloud="aws", region="eu-west-1").url == "s3://team-ckpt"
    assert nearest(found, cloud="gcp", region="europe-west4").url == "gs://team-ckpt"
    assert nearest(found, cloud="azure", region="eastus").key == "azure"
    assert nearest(found, cloud=None, region=None).key == "us-west-2"  # a laptop: the home bucket
    regions_only = members(the_set({"eu-west-1": "s3://a", "us-west-2": "s3://b", "gcp": "gs://c"}))
    assert nearest(regions_only, cloud="aws", region="us-east-1").key == "eu-west-1"  # the first of its cloud
    assert nearest(regions_only, cloud="azure", region="eastus").key == "eu-west-1"  # none of its cloud: home


def test_a_set_url_carries_the_run_folder_to_every_bucket_and_the_vm_finds_its_own():
    run = join_url(the_set({"aws": "s3://team-ckpt/x", "gcp": "gs://g"}), "run-1")
    assert parse_url(run).scheme == "buckets" and parse_url(run).text == run
    assert [m.url for m in members(run)] == ["s3://team-ckpt/x/run-1", "gs://g/run-1"]
    on_gcp = {"SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": "gcp", "region": "us-central1"})}
    assert nearest_url(run, on_gcp) == "gs://g/run-1"
    assert nearest_url(run, {}) == "s3://team-ckpt/x/run-1"
    assert nearest_url("s3://one/run-1", on_gcp) == "s3://one/run-1"
    pinned = {"SKYGREEN_PLACE": "gcp/us-central1/us-central1-a"}  # a local life a nomad watcher pinned
    assert nearest_url(run, pinned) == "gs://g/run-1"
    assert nearest_url(run, {**pinned, **on_gcp, "SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": "aws"})}) == (
        "s3://team-ckpt/x/run-1"
    )


# ---------------------------------------------------------------- the task field


def test_the_task_keeps_the_set_in_the_order_written_with_keys_normalised():
    spec = parse_spec_text(task("{buckets: {aws: s3://team-ckpt/, US-West-2: s3://w, gcp: gs://g}}"))
    assert [(m.key, m.url) for m in members(spec.green.checkpoint.bucket or "")] == [
        ("aws", "s3://team-ckpt"), ("us-west-2", "s3://w"), ("gcp", "gs://g"),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("checkpoint", "words"),
    [
        ("{bucket: s3://a, buckets: {aws: s3://a}}", "skygreen.checkpoint.buckets: and skygreen.checkpoint.bucket"),
        ("{region: us-east-1, buckets: {aws: s3://a}}", "and skygreen.checkpoint.region cannot both be set"),
        ("{buckets: {gcp: s3://a}}", "skygreen.checkpoint.buckets.gcp: is keyed gcp, but the bucket s3://a is in aws"),
        ("{buckets: {us-central1: s3://a}}", "is a region of gcp, but the bucket s3://a is in aws"),
        ("{buckets: {mars-1: s3://a}}", "is neither a cloud nor a region skygreen knows"),
        ("{buckets: {aws: /tmp/ckpt}}", "must be a cloud bucket"),
        ("{buckets: {}}", "names no bucket"),
    ],
)
def test_a_bad_set_names_the_field_and_the_fix(checkpoint, words):
    with pytest.raises(SpecError) as bad:
        parse_spec_text(task(checkpoint))
    message = str(bad.value)
    assert words in message and ("fix:" in message or "allowed:" in message)


def test_a_bucket_that_reports_another_region_than_its_key_is_an_error():
    url = the_set({"us-west-2": "s3://w", "aws": "s3://a"})
    with pytest.raises(SpecError, match=r"buckets.us-west-2: keys the bucket s3://w by us-west-2, but .* eu-west-1"):
        set_places(url, {"s3://w": "eu-west-1"})
    places = set_places(url, {"s3://a": ""})  # S3 answers no constraint for us-east-1
    assert [(p.place.region, p.how) for _, p in places.buckets] == [("us-west-2", "stated"), ("us-east-1", "read")]


# ---------------------------------------------------------------- the plan's pricing


def test_a_move_copies_the_checkpoint_to_where_eager_next_region_relaunches_by_hand():
    """SkyPilot blocks the preempted cloud and region and tries the ordered list in order: the
    job lands at the first place outside them, and copies only where another bucket is nearest.
    The launch lists the pick's bucket's places first, so a place that shares it lands first."""
    places = set_places(the_set({"aws": "s3://a", "gcp": "gs://g"}))  # assumed us-east-1, us-central1
    vm = Place(cloud="aws", region="us-east-1")
    east1 = Place(cloud="gcp", region="us-east1")
    launches = [vm, east1, Place(cloud="gcp", region="us-central1"), Place(cloud="aws", region="us-west-2")]
    assert recovery_landing(vm, launches) == east1
    assert move_copies(places, vm=vm, launches=launches, save_gb=10.0, moves=4.0) == (0.0, 0.0)  # us-west-2 next
    gb, usd = move_copies(places, vm=vm, launches=launches[:3], save_gb=10.0, moves=4.0)
    assert gb == pytest.approx(4 * 10.0)
    assert usd == pytest.approx(transfer_usd(vm, east1, 40.0, load_rates())) and usd > 0
    west = Place(cloud="aws", region="us-west-2")
    assert move_copies(places, vm=vm, launches=[west, *launches], save_gb=10.0, moves=4.0) == (0.0, 0.0)
    # the launch lists the pick's bucket's places first: us-west-2 shares the aws bucket
    assert bucket_first([m for m, _ in places.buckets], launches, lambda p: (p.cloud, p.region)) == [
        vm, west, east1, Place(cloud="gcp", region="us-central1")]  # fmt: skip
    assert move_copies(places, vm=vm, launches=launches, save_gb=10.0, moves=4.0, limit=2) == (0.0, 0.0)
    assert move_copies(places, vm=vm, launches=launches, save_gb=10.0, moves=4.0, limit=1) == (0.0, 0.0)
    assert move_copies(places, vm=vm, launches=[vm], save_gb=10.0, moves=4.0) == (0.0, 0.0)
    assert recovery_landing(vm, [vm]) is None


def _catalog(root: Path) -> Path:
    for cloud, rows in {
        "aws": ["p4de.24xlarge,A100-80GB,8,96,1152,A100-80GB,27.447,3.0,us-east-1,use1-az1",
                "p4de.24xlarge,A100-80GB,8,96,1152,A100-80GB,27.447,2.9,us-west-2,usw2-az1"],
        "azure": ["Standard_ND96amsr_A100_v4,A100-80GB,8,96,1900,A100-80GB,32.77,2.5,eastus,"],
    }.items():  # fmt: skip
        (root / cloud).mkdir(parents=True)
        (root / cloud / "vms.csv").write_text(VMS_HEADER + "\n" + "\n".join(rows) + "\n")
    return root


def test_each_offer_is_priced_against_its_nearest_bucket_plus_its_copies(tmp_path):
    """Every offer has a bucket in its own region, so its saves and restores cross nothing: its
    transfer is the copies its expected moves make, worked by hand. Under `FAILOVER` (relaunch in
    the same region first) nothing moves, and its order is the launch list `EAGER_NEXT_REGION`
    recovers through: each offer's preemptions land at the first other place of it."""
    catalog = load_catalog(_catalog(tmp_path / "v8"))
    keyed = {"us-east-1": "s3://a", "us-west-2": "s3://w", "eastus": "az://acct/ckpt"}
    buckets = "{buckets: {" + ", ".join(f"{k}: {v}" for k, v in keyed.items()) + "}}"
    spread = make_plan(parse_spec_text(task(buckets)), catalog)
    failover = make_plan(parse_spec_text(task(buckets + "\n  recovery: {strategy: FAILOVER}")), catalog)
    assert all(c.cost_usd["transfer"] == 0 for c in failover.candidates)
    places = set_places(the_set(keyed))
    launches = [Place(cloud=c.cloud, region=c.region) for c in failover.candidates]
    assert len(launches) == 3
    model = parse_spec_text(task("{bucket: s3://a}")).green.model
    assert model is not None
    one_gb = checkpoint_gb(model)
    for c in spread.candidates:
        vm = Place(cloud=c.cloud, region=c.region)
        landing = recovery_landing(vm, launches)
        assert landing is not None and landing != vm
        usd = transfer_usd(places.nearest(vm)[1].place, landing, c.expected_preemptions * one_gb, load_rates())
        assert 0 < usd == pytest.approx(c.cost_usd["transfer"])
        assert c.bytes_moved_gb >= c.expected_preemptions * one_gb
        assert c.est_cost_usd == pytest.approx(c.cost_usd["total"])
    assert any("a bucket per place (us-east-1: aws us-east-1" in line for line in spread.assumptions)


# ---------------------------------------------------------------- a real run in two places


def _state(step: int) -> dict:
    torch.manual_seed(step)
    return {"model": torch.nn.Linear(128, 256).state_dict(), "step": step}  # 132 kB: the blobs outweigh the rest


def test_a_run_commits_here_resumes_there_from_the_newest_verified_commit_and_writes_there(
    s3_bucket, azure_bucket, monkeypatch, tmp_path
):
    """moto S3 (home, us-east-1) and Azurite (eastus): life 1 on AWS commits steps 1 and 2, step 2's
    blob is then damaged; life 2 on Azure restores step 1, copies it once into its own bucket from
    the files the restore fetched (the far bucket is read once), and commits step 3 there, while
    the lease stays in the home bucket and fences life 1 out."""
    run = join_url(the_set({"aws": f"s3://{s3_bucket}/ckpt", "azure": f"az://{azure_bucket}/ckpt"}), "run-1")
    s3 = open_store(f"s3://{s3_bucket}/ckpt/run-1")
    az = open_store(f"az://{azure_bucket}/ckpt/run-1")
    monkeypatch.setenv("SKYPILOT_CLUSTER_INFO", json.dumps({"cloud": "aws", "region": "us-east-1"}))
    first = Checkpointer(run, keep=3, launch=1)
    for step in (1, 2):
        first.save(step, _state(step))
        first.wait()
    assert committed_steps(s3) == [1, 2] and az.list() == []
    damaged = [k for k in s3.list(step_prefix(2)) if not k.endswith((MANIFEST_NAME, ".json"))]
    assert damaged
    for key in damaged:
        s3.put(key, b"not the checkpoint")

    monkeypatch.setenv("SKYPILOT_CLUSTER_INFO", json.dumps({"cloud": "azure", "region": "eastus"}))
    second = Checkpointer(run, keep=3, launch=2, tmp_dir=tmp_path)
    loaded = second.load_latest()
    assert list(tmp_path.iterdir()) == []  # the restored files, uploaded, are gone
    assert loaded is not None and loaded.step == 1
    assert torch.equal(loaded.state["model"]["weight"], _state(1)["model"]["weight"])
    assert committed_steps(az) == [1]  # copied once, manifest and blobs
    assert set(az.list(step_prefix(1))) <= set(s3.list(step_prefix(1)))
    second.save(3, _state(3))
    second.wait()
    counted = traffic_of(second.store)
    assert counted is not None
    figures = counted.figures()  # each bucket's bytes under its own name, for the ledger
    step_1_bytes = sum(s3.size(k) for k in s3.list(step_prefix(1)))
    assert step_1_bytes <= figures.bytes_downloaded[f"s3://{s3_bucket}"] < 1.2 * step_1_bytes  # read once
    assert figures.bytes_uploaded[f"az://{azure_bucket}"] > step_1_bytes
    lease_bytes = len(s3.get(LEASE_KEY))
    assert figures.bytes_uploaded[f"s3://{s3_bucket}"] == lease_bytes  # the lease alone: the rest went to Azure
    assert committed_steps(az) == [1, 3] and 3 not in committed_steps(s3)
    assert not az.exists(LEASE_KEY) and (read_lease(s3) or None) is not None
    assert read_lease(open_store(run)).launch == 2  # type: ignore[union-attr]
    assert first._lease is not None
    with pytest.raises(LeaseLostError):
        check_lease(open_store(run), first._lease)  # one writer per run across the set
    monkeypatch.delenv("SKYPILOT_CLUSTER_INFO")
    laptop = open_store(run)  # status, cost and report read every bucket of the set
    assert {1, 3} <= set(committed_steps(laptop))
    first.close()
    second.close()


# ---------------------------------------------------------------- the CLI


def test_skygreen_plan_prices_a_task_with_a_bucket_per_cloud(tmp_path):
    path = tmp_path / "llama.yaml"
    path.write_text(task("{buckets: {aws: s3://a, azure: az://acct/ckpt}}"))
    catalog = _catalog(tmp_path / "v8")
    out = subprocess.run(
        [sys.executable, "-m", "skygreen.cli", "plan", str(path), "--catalog", str(catalog), "--json"],
        capture_output=True, text=True, cwd=ROOT, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    spot = {(c["cloud"], c["region"]): c for c in plan["candidates"] if c["spot"]}
    eastus, west = spot[("azure", "eastus")], spot[("aws", "us-west-2")]
    assert eastus["cost_usd"]["transfer"] < west["cost_usd"]["transfer"]  # beside its own bucket
    for c in plan["candidates"]:
        assert c["est_cost_usd"] == pytest.approx(c["cost_usd"]["total"]) and c["bytes_moved_gb"] >= 0


def test_cost_task_of_the_7b_case_with_a_bucket_per_cloud(shared_catalog_dir, tmp_path, private_home):
    """`cost TASK` per cloud (docs/costs.md): against one bucket in us-east-1, the GCP and Azure
    offers save into their own cloud's bucket and pay less transfer; every offer's total is
    its whole bill, and the bucket line names every bucket of the set."""
    from skygreen.costs.costing import estimate_task

    per_cloud = tmp_path / "llama7b-buckets.yaml"
    per_cloud.write_text(
        task("{buckets: {aws: s3://my-ckpts/llama, gcp: gs://my-ckpts/llama, azure: az://myckpts/ckpt/llama}}")
    )
    one = tmp_path / "llama7b.yaml"
    one.write_text(task("{bucket: s3://my-ckpts/llama, region: us-east-1}"))
    found = estimate_task(per_cloud, catalog_dir=shared_catalog_dir)
    single = {c.cloud: c.spot for c in estimate_task(one, catalog_dir=shared_catalog_dir).clouds}
    assert found.bucket.startswith("a bucket per place (aws: s3://my-ckpts/llama (aws us-east-1), gcp:")
    spot = {c.cloud: c.spot for c in found.clouds}
    # Azure's eastus offer is beside its bucket; GCP's europe-north1 one still sends its saves to
    # us-central1 (the GCS bucket's assumed region), at GCP's inter-continent rate, not to AWS
    assert spot["azure"].cost_usd["transfer"] < single["azure"].cost_usd["transfer"] / 5  # type: ignore[union-attr]
    assert spot["gcp"].cost_usd["transfer"] < single["gcp"].cost_usd["transfer"]  # type: ignore[union-attr]
    for offer in spot.values():
        assert offer is not None and offer.est_cost_usd == pytest.approx(offer.cost_usd["total"])
        assert offer.bytes_moved_gb > 0


# ---------------------------------------------------------------- what a save costs (status)


def test_a_saves_cost_is_its_measured_bytes_at_the_list_rates_and_its_requests_by_hand():
    from skygreen.bill.rates import requests_usd
    from skygreen.bill.save_cost import save_cost
    from skygreen.bill.traffic import SAVE_OVERHEAD_WRITES, UPLOAD_PART_BYTES, parts

    rates = load_rates()
    west, east = Place(cloud="aws", region="us-west-2"), Place(cloud="aws", region="us-east-1")
    cost = save_cost(gb=10.0, files=2, vm=west, bucket=east)
    writes = parts(10.0, UPLOAD_PART_BYTES["aws"], files=2) + SAVE_OVERHEAD_WRITES
    assert cost.transfer_usd == pytest.approx(transfer_usd(west, east, 10.0, rates)) and cost.transfer_usd > 0
    assert cost.requests_usd == pytest.approx(requests_usd("aws", writes=writes, reads=0.0, rates=rates))
    assert cost.usd == pytest.approx(cost.transfer_usd + cost.requests_usd)
    assert cost.route == "aws us-west-2 -> aws us-east-1"
    beside = save_cost(gb=10.0, files=2, vm=east, bucket=east)
    laptop = save_cost(gb=10.0, files=2, vm=None, bucket=east)
    assert beside.transfer_usd == laptop.transfer_usd == 0.0 and laptop.route == "internet -> aws us-east-1"


def test_gc_of_a_bucket_set_names_each_bucket_to_run_it_on():
    from skygreen.checkpoint.gc import gc
    from skygreen.errors import InputError

    url = join_url(the_set({"aws": "s3://a/x", "gcp": "gs://g"}), "run-1")
    with pytest.raises(InputError, match=r"run skygreen gc on each of its buckets: s3://a/x/run-1, gs://g/run-1"):
        gc(url, open_store=open_store, older_than="7d", storage_class=None, act=False, now_s=0.0)


def test_the_vm_installs_the_client_of_every_bucket_of_the_set_first():
    from skygreen.launch.render import _store_install

    wanted = ["torch>=2.4", "boto3>=1.28", "google-cloud-storage>=2.14", "azure-storage-blob>=12.19"]
    lines = _store_install(the_set({"aws": "s3://a", "azure": "az://acct/c"}), wanted)
    assert "skygreen_pip 'boto3>=1.28' 'azure-storage-blob>=12.19' 'azure-identity>=1.15'" in lines
    assert "google-cloud-storage" not in lines


def test_the_budget_prices_each_bucket_of_a_set_where_its_key_says():
    from skygreen.checkpoint.bucket_set import stated_regions
    from skygreen.ledger.pricing import default_buckets
    from skygreen.ledger.records import Place as SegmentPlace
    from skygreen.ledger.records import Segment

    url = join_url(the_set({"eu-west-1": "s3://a/x", "azure": "az://acct/c/p"}), "run-1")
    assert stated_regions(url) == {"s3://a": "eu-west-1", "az://acct/c": None}
    assert stated_regions("s3://one/run-1") == {}
    segment = Segment(
        run_id="run-1", key="ledger/1.json", started_at=0.0, updated_at=1.0, place=SegmentPlace(cloud="aws"),
        bytes_uploaded={"s3://a": 10, "az://acct/c": 5},
    )  # fmt: skip
    places = default_buckets([segment], region=stated_regions(url))
    assert places["s3://a"] == Place(cloud="aws", region="eu-west-1")
    assert places["az://acct/c"] == Place(cloud="azure", region="eastus")


def test_the_set_writes_near_keeps_the_lease_home_reads_the_nearest_copy_and_deletes_everywhere(tmp_path):
    from skygreen.checkpoint.set_store import SetStore

    home, there = Member(key="aws", url="s3://a"), Member(key="gcp", url="gs://g")
    a, g = open_store(str(tmp_path / "a")), open_store(str(tmp_path / "g"))
    store = SetStore(the_set({"aws": "s3://a", "gcp": "gs://g"}), [(home, a), (there, g)], near=there)
    store.put("ckpt/1/blob", b"near")
    store.put(LEASE_KEY, b"{}")
    assert g.list() == ["ckpt/1/blob"] and a.list() == [LEASE_KEY]
    a.put("ckpt/1/blob", b"far")
    a.put("ckpt/0/old", b"far only")
    assert store.get("ckpt/1/blob") == b"near" and store.get("ckpt/0/old") == b"far only"
    assert store.list("ckpt/") == ["ckpt/0/old", "ckpt/1/blob"] and store.size("ckpt/0/old") == 8
    assert store.get_range("ckpt/0/old", 4, 8) == b"only"
    a.put("ckpt/0/manifest.json", b"m")
    assert store.settle(["ckpt/0/old", "ckpt/0/manifest.json"], "ckpt/0/manifest.json") == len(b"far only") + 1
    assert g.get("ckpt/0/old") == b"far only" and g.exists("ckpt/0/manifest.json")
    assert store.settle(["ckpt/0/old"], "ckpt/0/manifest.json") == 0  # copied once
    store.delete("ckpt/1/blob")
    assert not a.exists("ckpt/1/blob") and not g.exists("ckpt/1/blob")


def test_cost_prices_each_bucket_of_the_set_where_its_key_says_and_storage_at_home(monkeypatch):
    from skygreen.costs.costing import data_places

    for name in ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "STORAGE_EMULATOR_HOST",
                 "GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)  # no bucket is asked: each is where its key says
    url = join_url(the_set({"eu-west-1": "s3://a/x", "gcp": "gs://g"}), "run-1")
    found = data_places(url, [], {"skygreen": {"checkpoint": {"keep": 4}}})
    assert found["buckets"] == {
        "s3://a": Place(cloud="aws", region="eu-west-1"), "gs://g": Place(cloud="gcp", region="us-central1"),
    }  # fmt: skip
    assert found["store"] == Place(cloud="aws", region="eu-west-1") and found["keep"] == 4
