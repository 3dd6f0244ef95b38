"""The whole bill: the sourced rate table, where the bucket is, the bytes a run moves, the
dollar-optimal interval, and a plan that ranks offers by compute plus data."""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path

import pytest

from skygreen.bill.bucket import bucket_cloud, bucket_place
from skygreen.bill.interval import dollar_optimal_interval_s
from skygreen.bill.rates import (
    DATA,
    Place,
    internet_egress_usd,
    load_rates,
    path_between,
    requests_usd,
    storage_usd,
    transfer_usd,
    usd_per_gb,
)
from skygreen.bill.run_bill import bill_run
from skygreen.bill.traffic import HOURS_PER_MONTH, READ_PART_BYTES, UPLOAD_PART_BYTES, run_traffic, save_gb
from skygreen.checkpoint.interval import optimal_interval_s
from skygreen.errors import SpecError
from skygreen.plan.catalog import load_catalog
from skygreen.plan.data_cost import price_offer
from skygreen.plan.rank import make_plan, run_model
from skygreen.task.spec import parse_spec_text

US_EAST = Place(cloud="aws", region="us-east-1")
SKYPILOT_CLOUD = {"aws": "AWS", "gcp": "GCP", "azure": "Azure"}
TASK_7B = """
name: llama
skygreen:
  model: {{params: 7B}}
  work: {{gpu_hours: 200, gpu: A100-80GB}}
  checkpoint: {{bucket: {bucket}{region}}}
run: python train.py
"""


def task_7b(bucket: str = "s3://my-ckpts/llama", region: str | None = "us-east-1"):
    return parse_spec_text(TASK_7B.format(bucket=bucket, region=f", region: {region}" if region else ""))


# ---------------------------------------------------------------- rates


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_internet_egress_equals_skypilots_get_egress_cost_below_10_tb(cloud):
    from sky import clouds  # only here: the table is held to SkyPilot's own figures

    sky_cloud = getattr(clouds, SKYPILOT_CLOUD[cloud])()
    for gb in (0.0, 0.5, 1.0, 1.5, 84.0, 999.0, 1000.0, 1024.0, 1024.5, 5000.0, 10_000.0, 10_239.0):
        assert internet_egress_usd(cloud, gb) == pytest.approx(sky_cloud.get_egress_cost(gb), abs=1e-9), gb


def test_above_10_tb_the_providers_tiers_apply_not_skypilots_arithmetic():
    """SkyPilot charges 28,700 GB from Azure about $3,150 (gigabytes counted twice); the tiers ~$2,430."""
    from sky import clouds

    tiers = (10_240 - 1) * 0.0875 + (28_700 - 10_240) * 0.083
    assert internet_egress_usd("azure", 28_700) == pytest.approx(tiers)
    assert internet_egress_usd("azure", 28_700) == pytest.approx(2_428.5, abs=1)
    assert clouds.Azure().get_egress_cost(28_700) > 1.25 * tiers  # about $3,150
    # Tier by tier the price only grows with the volume; SkyPilot's falls past 50 TB.
    assert internet_egress_usd("aws", 59_500) > internet_egress_usd("aws", 28_700)
    assert internet_egress_usd("aws", 200_000) == pytest.approx(
        (10_240 - 1) * 0.09 + 40_960 * 0.085 + 102_400 * 0.07 + (200_000 - 153_600) * 0.05
    )


def test_every_rate_row_names_its_source_page_and_date():
    for path in sorted(DATA.glob("*.csv")):
        with path.open() as f:
            rows = list(csv.DictReader(f))
        assert rows, path.name
        if path.name == "regions.csv":
            continue
        for row in rows:
            assert row["source"].startswith("https://"), (path.name, row)
            assert len(row["as_of"]) == 10 and row["as_of"][4] == "-", (path.name, row)


def test_a_table_row_without_its_source_is_refused(tmp_path):
    for path in DATA.glob("*.csv"):
        (tmp_path / path.name).write_text(path.read_text())
    text = (tmp_path / "storage.csv").read_text().replace("https://aws.amazon.com/s3/pricing/", "")
    (tmp_path / "storage.csv").write_text(text)
    with pytest.raises(ValueError, match=r"storage.csv line 2: source is empty"):
        load_rates(tmp_path)


def test_transfer_is_free_in_region_priced_between_regions_and_paid_by_the_sender_between_clouds():
    rates = load_rates()
    assert transfer_usd(US_EAST, US_EAST, 1000) == 0.0
    ohio = Place(cloud="aws", region="us-east-2")
    frankfurt = Place(cloud="aws", region="eu-central-1")
    assert path_between(US_EAST, ohio) == "same_continent"
    assert transfer_usd(US_EAST, ohio, 100) == pytest.approx(100 * rates.within[("aws", "same_continent")])
    assert path_between(US_EAST, frankfurt) == "other_continent"
    assert path_between(Place(cloud="gcp", region="us-central1"), Place(cloud="gcp", region="europe-west4")) == (
        "other_continent"
    )
    azure = Place(cloud="azure", region="westus3")
    assert transfer_usd(azure, US_EAST, 500) == pytest.approx(internet_egress_usd("azure", 500))
    assert transfer_usd(US_EAST, azure, 500) == pytest.approx(internet_egress_usd("aws", 500))
    assert rates.within[("aws", "inter_zone")] > 0  # the table carries zones too (VM to VM)


def test_storage_and_requests_are_priced_per_gb_month_and_per_thousand():
    rates = load_rates()
    assert storage_usd("aws", 100) == pytest.approx(100 * rates.storage_usd_per_gb_month["aws"])
    assert requests_usd("aws", writes=2000, reads=10_000) == pytest.approx(2 * 0.005 + 10 * 0.0004)


# ---------------------------------------------------------------- where the bucket is


def test_the_bucket_is_where_it_says_where_the_task_says_or_the_clouds_default():
    assert bucket_cloud("s3://b/p") == "aws" and bucket_cloud("gs://b") == "gcp"
    assert bucket_cloud("az://acct/ckpt") == "azure"
    assert bucket_cloud("https://acct.blob.core.windows.net/ckpt/run") == "azure"
    assert bucket_cloud("/tmp/ckpt") is None and bucket_place("file:///tmp/x") is None
    read = bucket_place("s3://b", read_region="")
    assert read is not None  # GetBucketLocation answers nothing for us-east-1
    assert (read.place, read.how) == (US_EAST, "read")
    stated = bucket_place("gs://b", stated_region="europe-west4")
    assert stated is not None
    assert (stated.place.region, stated.how, stated.note) == ("europe-west4", "stated", "")
    assumed = bucket_place("az://acct/ckpt")
    assert assumed is not None
    assert (assumed.place, assumed.how) == (Place(cloud="azure", region="eastus"), "assumed")
    assert "assumed eastus" in assumed.note and "skygreen.checkpoint.region" in assumed.note


def test_a_stated_region_that_contradicts_the_bucket_is_an_error():
    with pytest.raises(SpecError, match=r"skygreen.checkpoint.region: says the bucket s3://b is in us-west-2, but"):
        bucket_place("s3://b", stated_region="us-west-2", read_region="us-east-1")
    with pytest.raises(SpecError, match=r"skygreen.checkpoint.region: is a region of gcp, but the bucket"):
        task_7b(region="us-central1")
    with pytest.raises(SpecError, match=r"only means something for a cloud bucket"):
        task_7b(bucket="/tmp/ckpts")
    assert task_7b().green.checkpoint.region == "us-east-1"


# ---------------------------------------------------------------- bytes and dollars


def test_a_run_saves_restores_keeps_and_asks_what_its_interval_and_preemptions_say():
    size = save_gb(84.0, trainable_fraction=0.5)
    t = run_traffic(
        save_gb=size,
        interval_s=600.0,
        training_hours=10.0,
        expected_preemptions=3.0,
        keep=3,
        span_hours=12.0,
        bucket_cloud="aws",
        files_per_save=4,
    )
    assert (t.saves, t.restores) == (60.0, 3.0)
    assert t.uploaded_gb == pytest.approx(60 * 42) and t.downloaded_gb == pytest.approx(3 * 42)
    assert t.moved_gb == pytest.approx(63 * 42)
    assert t.gb_months == pytest.approx(3 * 42 * 12 / HOURS_PER_MONTH)
    parts_up = 4 * math.ceil(42e9 / 4 / UPLOAD_PART_BYTES["aws"])
    parts_down = 4 * math.ceil(42e9 / 4 / READ_PART_BYTES)
    assert t.writes > 60 * parts_up and t.reads > 3 * parts_down
    bill = bill_run(compute_usd=50.0, traffic=t, vm=US_EAST, bucket=US_EAST)
    assert bill.transfer == 0.0 and bill.total == pytest.approx(50 + bill.storage + bill.requests)
    away = bill_run(compute_usd=50.0, traffic=t, vm=Place(cloud="gcp", region="us-central1"), bucket=US_EAST)
    assert away.transfer == pytest.approx(
        internet_egress_usd("gcp", t.uploaded_gb) + internet_egress_usd("aws", t.downloaded_gb)
    )


def test_with_free_bytes_the_dollar_optimal_interval_is_dalys_and_dear_bytes_stretch_it():
    for stall_s, mtbf_s in ((7.0, 15_000.0), (1.0, 7_660.0), (120.0, 3_600.0)):
        free = dollar_optimal_interval_s(stall_s=stall_s, save_usd=0.0, price_usd_per_hour=2.5, mtbf_s=mtbf_s)
        assert free == optimal_interval_s(stall_s, mtbf_s)
        dear = dollar_optimal_interval_s(stall_s=stall_s, save_usd=7.0, price_usd_per_hour=2.5, mtbf_s=mtbf_s)
        assert dear > free
    assert math.isinf(dollar_optimal_interval_s(stall_s=7, save_usd=1, price_usd_per_hour=1, mtbf_s=math.inf))


# ---------------------------------------------------------------- the plan


def _check_bill(plan, model) -> None:
    """Every candidate's total is its est_cost_usd, an offer in the bucket's region moves bytes for
    free, and transfer is the rate table applied to the bytes its run moves."""
    for c in plan.candidates:
        bill = c.cost_usd
        assert set(bill) == {"compute", "transfer", "storage", "requests", "total"}
        assert bill["total"] == pytest.approx(c.est_cost_usd)
        assert bill["total"] == pytest.approx(bill["compute"] + bill["transfer"] + bill["storage"] + bill["requests"])
        assert c.bytes_moved_gb > 0
        if (c.cloud, c.region) == ("aws", "us-east-1"):
            assert bill["transfer"] == 0.0
        else:
            assert bill["transfer"] > 0
    for c in plan.candidates[:40]:
        priced = price_offer(
            replace(model, num_nodes=c.num_nodes), cloud=c.cloud, region=c.region, gpu=c.accelerator,
            gpus_per_node=c.accelerator_count, spot=c.spot, price_usd_per_hour=c.price_usd_per_hour,
            efficiency=None if c.step is None else c.step["efficiency"],
        )  # fmt: skip
        assert priced is not None and priced.traffic is not None
        vm = Place(cloud=c.cloud, region=c.region)
        table = transfer_usd(vm, US_EAST, priced.traffic.uploaded_gb) + transfer_usd(
            US_EAST, vm, priced.traffic.downloaded_gb
        )
        # the step's efficiency comes back rounded to 4 places in `step`: hence rel=1e-3
        assert c.bytes_moved_gb == pytest.approx(priced.traffic.moved_gb, rel=1e-3)
        assert c.cost_usd["transfer"] == pytest.approx(table, rel=1e-3)


def _no_cross_cloud_offer_ahead_of_a_cheaper_aws_one(plan) -> None:
    cheapest_aws = min(c.est_cost_usd for c in plan.candidates if c.cloud == "aws")
    for c in plan.candidates:
        if c.cloud == "aws":
            break
        assert c.est_cost_usd <= cheapest_aws
    assert plan.best_per_cloud["aws"].est_cost_usd == cheapest_aws
    assert plan.best.est_cost_usd == min(c.est_cost_usd for c in plan.candidates)


def test_the_7b_case_ranks_by_the_whole_bill_on_the_real_catalog(shared_catalog_dir):
    spec = task_7b()
    plan = make_plan(spec, load_catalog(shared_catalog_dir))
    _no_cross_cloud_offer_ahead_of_a_cheaper_aws_one(plan)
    _check_bill(plan, run_model(spec, bucket=bucket_place("s3://my-ckpts/llama", stated_region="us-east-1")))
    azure = [c for c in plan.candidates if c.cloud == "azure"]
    assert azure and all(c.cost_usd["transfer"] > 0 for c in azure)
    assert plan.best.cloud == "aws" and plan.best.region == "us-east-1"


VMS_HEADER = (
    "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone"
)


def _fixture_catalog(root: Path) -> Path:
    (root / "aws").mkdir(parents=True)
    (root / "azure").mkdir()
    (root / "aws" / "vms.csv").write_text(
        f"{VMS_HEADER}\n"
        "p4de.24xlarge,A100-80GB,8,96,1152,A100-80GB,27.447,3.0,us-east-1,use1-az1\n"
        "p4de.24xlarge,A100-80GB,8,96,1152,A100-80GB,27.447,2.9,us-west-2,usw2-az1\n"
    )
    (root / "azure" / "vms.csv").write_text(
        f"{VMS_HEADER}\nStandard_ND96amsr_A100_v4,A100-80GB,8,96,1900,A100-80GB,32.77,2.5,eastus,\n"
    )
    return root


def test_the_7b_case_on_a_small_catalog_puts_the_bucket_region_first(tmp_path):
    """Azure's spot hour is the cheapest and us-west-2's undercuts us-east-1's, but both pay to
    move every save: the offer beside the bucket wins on the whole bill."""
    spec = task_7b()
    plan = make_plan(spec, load_catalog(_fixture_catalog(tmp_path / "v8")))
    assert [(c.cloud, c.region) for c in plan.candidates if c.spot] == [
        ("aws", "us-east-1"), ("aws", "us-west-2"), ("azure", "eastus"),
    ]  # fmt: skip
    assert min(c.price_usd_per_hour for c in plan.candidates) < plan.best.price_usd_per_hour
    _no_cross_cloud_offer_ahead_of_a_cheaper_aws_one(plan)
    _check_bill(plan, run_model(spec, bucket=bucket_place("s3://my-ckpts/llama", stated_region="us-east-1")))
    best = plan.best
    assert best.checkpoint_save_usd > 0 and best.checkpoint_interval_s
    data_line = next(line for line in plan.assumptions if line.startswith("data: bucket s3://my-ckpts/llama"))
    assert "a save in transfer and requests" in data_line
    assert not any("assumed us-east-1" in n for n in plan.notices)


def test_an_on_demand_offer_pays_for_its_final_commit(tmp_path):
    """No preemption, so no save along the way; the run still ends with one commit, which crosses
    to the bucket's region and is kept for the run's span."""
    spec = parse_spec_text(TASK_7B.format(bucket="s3://my-ckpts/llama", region=", region: us-east-1").replace(
        "skygreen:\n", "skygreen:\n  spot: false\n"))  # fmt: skip
    plan = make_plan(spec, load_catalog(_fixture_catalog(tmp_path / "v8")))
    west = next(c for c in plan.candidates if c.region == "us-west-2")
    one_gb = save_gb(run_model(spec).checkpoint_gb or 0.0)
    rate = usd_per_gb(Place(cloud="aws", region="us-west-2"), Place(cloud="aws", region="us-east-1"), one_gb)
    assert not west.spot and west.checkpoint_interval_s is None
    assert west.bytes_moved_gb == pytest.approx(one_gb)
    assert west.cost_usd["transfer"] == pytest.approx(one_gb * rate) and rate > 0
    assert west.cost_usd["storage"] > 0 and west.cost_usd["requests"] > 0
    traffic = run_traffic(save_gb=10.0, interval_s=None, training_hours=5.0, expected_preemptions=0.0, keep=3,
                          span_hours=5.0, bucket_cloud="aws")  # fmt: skip
    assert traffic.saves == 1 and traffic.gb_months == pytest.approx(10.0 * 5.0 / HOURS_PER_MONTH)


def test_an_unknown_bucket_region_is_assumed_and_said_and_no_model_prices_no_bytes(tmp_path):
    catalog = load_catalog(_fixture_catalog(tmp_path / "v8"))
    plan = make_plan(task_7b(region=None), catalog)
    assert any("assumed us-east-1, aws's default" in n for n in plan.notices)
    bare = parse_spec_text(
        "name: t\nskygreen:\n  gpu_count: 8\n  work: {gpu_hours: 10, gpu: A100-80GB}\n  checkpoint: {bucket: s3://b/p}\nrun: x\n"
    )
    plan = make_plan(bare, catalog)
    assert any("checkpoint's size is unknown" in n for n in plan.notices)
    assert all(c.cost_usd["compute"] == c.est_cost_usd and c.bytes_moved_gb == 0 for c in plan.candidates)


# ---------------------------------------------------------------- the bucket's own answer


def test_an_s3_bucket_reports_its_region_and_the_plan_reads_it(s3_bucket, tmp_path):
    import boto3

    from skygreen.checkpoint.bucket_region import read_bucket_region

    assert read_bucket_region(f"s3://{s3_bucket}/llama") == ""  # created without a constraint: us-east-1
    west = s3_bucket + "-w"
    boto3.client("s3").create_bucket(Bucket=west, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    assert read_bucket_region(f"s3://{west}/llama") == "us-west-2"
    assert read_bucket_region(f"s3://{west}/llama", env={}) is None  # no credentials: not asked
    assert read_bucket_region(f"s3://{s3_bucket}-missing/x") is None
    place = bucket_place(f"s3://{west}", read_region=read_bucket_region(f"s3://{west}"))
    assert place is not None and (place.place.region, place.how) == ("us-west-2", "read")
    with pytest.raises(SpecError, match="but the bucket reports us-west-2"):
        bucket_place(f"s3://{west}", stated_region="us-east-1", read_region="us-west-2")


def test_a_gcs_bucket_reports_its_location(gcs_bucket):
    from skygreen.checkpoint.bucket_region import read_bucket_region

    location = read_bucket_region(f"gs://{gcs_bucket}/llama")
    assert location is not None and location.strip()
    assert read_bucket_region(f"gs://{gcs_bucket}-missing/x") is None
