"""A run's data dollars from a hand-made ledger: transfer from the bytes each segment counted,
priced between its VM's place and the bucket's by `skygreen.bill`'s table; storage measured or
estimated; requests estimated; and `cost RUN`'s lines, each marked measured or estimated."""

from __future__ import annotations

from dataclasses import replace

import pytest

from skygreen.bill.rates import Place as BillPlace
from skygreen.bill.rates import internet_egress_usd, load_rates, requests_usd, storage_usd, transfer_usd
from skygreen.bill.traffic import HOURS_PER_MONTH, SAVE_OVERHEAD_WRITES, UPLOAD_PART_BYTES, parts
from skygreen.costs.report import bill_lines
from skygreen.ledger import Place, Segment
from skygreen.ledger.data_bill import ESTIMATED, LEDGER_WRITE_S, MEASURED, UNKNOWN, data_bill
from skygreen.ledger.pricing import run_cost
from skygreen.ledger.records import new_segment_key, settle

T0 = 1_780_000_000.0
GB = 10**9
BUCKET = "s3://team-ckpt"
US_EAST = BillPlace(cloud="aws", region="us-east-1")
GCP = Place(cloud="gcp", region="us-central1", gpu="L4", gpu_count=1, spot=True, price_usd_per_hour=0.28)
AWS = Place(cloud="aws", region="us-east-1", gpu="T4", gpu_count=1, spot=True, price_usd_per_hour=0.16)
AWS_WEST = Place(cloud="aws", region="us-west-2", gpu="T4", gpu_count=1, spot=True, price_usd_per_hour=0.16)


def seg(start_s: float, place: Place, *, dur_s: float = 3600.0, end: str = "completed", **kw) -> Segment:
    return Segment(
        run_id="r-1", key=new_segment_key(start_s, token="0000abcd"), place=place, started_at=start_s,
        updated_at=start_s + dur_s, ended_at=start_s + dur_s, end=end, step=100, **kw,
    )  # fmt: skip


def gcp_then_aws() -> list[Segment]:
    """Preempted on GCP after 10 GB of saves, resumed on AWS next to the bucket: 2 GB restored, 8 GB saved."""
    first = seg(T0, GCP, end="preempted", bytes_uploaded={BUCKET: 10 * GB}, checkpoint_bytes=2 * GB)
    second = seg(
        T0 + 4000,
        AWS,
        bytes_uploaded={BUCKET: 8 * GB},
        bytes_downloaded={BUCKET: 2 * GB},
        restore_bytes=2 * GB,
        checkpoint_bytes=2 * GB,
    )
    return settle([first, second])


def test_transfer_is_the_counted_bytes_at_the_rate_between_the_vm_and_the_bucket():
    segments = gcp_then_aws()
    bill = data_bill(segments, buckets={BUCKET: US_EAST}, store=US_EAST, span_s=7600, keep=3)
    # GCP -> S3 crosses clouds (GCP's internet egress); AWS us-east-1 <-> S3 us-east-1 is free
    assert bill.transfer_usd == pytest.approx(internet_egress_usd("gcp", 10.0)) and bill.transfer_usd > 0.5
    assert (bill.uploaded_bytes, bill.downloaded_bytes) == (18 * GB, 2 * GB)
    assert bill.transfer_basis == MEASURED
    west = settle([seg(T0, AWS_WEST, bytes_uploaded={BUCKET: 10 * GB}, checkpoint_bytes=2 * GB)])
    moved = data_bill(west, buckets={BUCKET: US_EAST}, store=US_EAST, span_s=3600)
    rate = load_rates().within[("aws", "same_continent")]
    assert moved.transfer_usd == pytest.approx(10 * rate) and moved.transfer_usd > 0


def test_a_local_machine_receives_at_the_buckets_internet_egress_and_sends_for_free():
    local = Place(cloud="local")
    segments = settle([seg(T0, local, bytes_uploaded={BUCKET: 50 * GB}, bytes_downloaded={BUCKET: 20 * GB})])
    bill = data_bill(segments, buckets={BUCKET: US_EAST}, store=US_EAST, span_s=3600)
    assert bill.transfer_usd == pytest.approx(internet_egress_usd("aws", 20.0)) and bill.transfer_usd > 0
    # a local directory as the bucket costs nothing at all
    folder = data_bill(segments, buckets={BUCKET: None}, store=None, span_s=3600)
    assert folder.total_usd == 0.0


def test_storage_is_measured_from_the_bucket_else_estimated_from_the_checkpoint_and_keep():
    segments = gcp_then_aws()
    measured = data_bill(segments, buckets={BUCKET: US_EAST}, store=US_EAST, stored_bytes=5 * GB, span_s=7300)
    assert measured.storage_basis == MEASURED
    assert measured.storage_usd == pytest.approx(storage_usd("aws", 5 * 7300 / 3600 / HOURS_PER_MONTH))
    estimated = data_bill(segments, buckets={BUCKET: US_EAST}, store=US_EAST, keep=3, span_s=7300)
    assert estimated.storage_basis == ESTIMATED
    assert estimated.storage_usd == pytest.approx(storage_usd("aws", 3 * 2 * 7300 / 3600 / HOURS_PER_MONTH))


def test_requests_are_estimated_from_the_counted_saves_restores_and_ledger_writes():
    segments = gcp_then_aws()
    bill = data_bill(segments, buckets={BUCKET: US_EAST}, store=US_EAST, span_s=7600)
    per_save = parts(2.0, UPLOAD_PART_BYTES["aws"]) + SAVE_OVERHEAD_WRITES
    writes = (5 + 4) * per_save + 2 * 3600 / LEDGER_WRITE_S  # 10 GB / 2 GB saves, then 8 GB / 2 GB
    assert bill.writes == pytest.approx(writes) and bill.reads > parts(2.0, 16 * 1024 * 1024)
    assert bill.requests_basis == ESTIMATED
    assert bill.requests_usd == pytest.approx(requests_usd("aws", writes=bill.writes, reads=bill.reads))


def test_a_ledger_that_counted_no_bytes_says_transfer_was_not_counted():
    old = settle([seg(T0, GCP)])
    bill = data_bill(old, buckets={BUCKET: US_EAST}, store=US_EAST, span_s=3600)
    assert bill.transfer_basis == UNKNOWN and bill.total_usd == 0.0
    assert any("counted no bytes" in note for note in bill.notes)


def test_run_cost_totals_every_line_and_says_how_each_was_known():
    segments = gcp_then_aws()
    cost = run_cost("r-1", segments, buckets={BUCKET: US_EAST}, store=US_EAST, keep=3, storage_bytes=6 * GB)
    data = cost.data
    assert cost.transfer_usd == pytest.approx(transfer_usd(BillPlace(cloud="gcp", region="us-central1"), US_EAST, 10))
    assert cost.total_usd == pytest.approx(
        cost.compute_usd + cost.controller_usd + data.transfer_usd + data.storage_usd + data.requests_usd
    )
    j = cost.to_json()
    assert j["total_usd"] == pytest.approx(cost.total_usd, abs=1e-6)
    assert {k: j[k] for k in ("transfer_usd", "storage_usd", "requests_usd")} == {
        "transfer_usd": round(data.transfer_usd, 6),
        "storage_usd": round(data.storage_usd, 6),
        "requests_usd": round(data.requests_usd, 6),
    }
    assert j["measured"] == {
        "compute": True,
        "controller": False,
        "transfer": True,
        "storage": True,
        "requests": False,
    }
    assert (j["bytes_uploaded"], j["bytes_downloaded"]) == (18 * GB, 2 * GB)
    lines = {row[0]: row for row in bill_lines(cost)}
    assert list(lines) == ["compute", "controller", "transfer", "storage", "requests"]
    assert lines["transfer"][2] == "measured" and lines["requests"][2] == "estimated"
    assert lines["transfer"][1] == f"${data.transfer_usd:,.2f}"
    assert any(a.startswith("transfer (measured)") for a in cost.assumptions)


def test_without_bucket_places_each_counted_bucket_is_at_its_clouds_default_region():
    """The runtime's budget knows only the URLs: an S3 bucket is taken to be in us-east-1."""
    segments = gcp_then_aws()
    assert run_cost("r-1", segments).transfer_usd == pytest.approx(
        run_cost("r-1", segments, buckets={BUCKET: US_EAST}).transfer_usd
    )


def test_the_budget_counts_the_bytes_moved_so_far_and_stops_on_data_alone():
    """A cheap VM ($0.01/h) on GCP saving to an S3 bucket: ten minutes of compute cost $0.0017,
    but 100 GB sent across clouds cost about $12, so a $1 budget stops the run on its data."""
    from skygreen.ledger.budget import BudgetPolicy, BudgetTracker

    cheap = Place(cloud="gcp", region="us-central1", gpu="L4", gpu_count=1, price_usd_per_hour=0.01)
    live = Segment(run_id="r-1", key=new_segment_key(T0, token="0000abcd"), place=cheap, started_at=T0,
                   updated_at=T0, bytes_uploaded={BUCKET: 100 * GB}, checkpoint_bytes=10 * GB)  # fmt: skip
    tracker = BudgetTracker(BudgetPolicy(budget_usd=1.0), earlier=[], managed=False)
    spent = tracker.spent_usd(live, T0 + 600)
    compute = 0.01 * 600 / 3600
    ten_minutes = replace(live, updated_at=T0 + 600)
    data = run_cost("r-1", [ten_minutes], buckets={BUCKET: US_EAST}).data  # the budget's: S3's default region
    assert data.transfer_usd == pytest.approx(internet_egress_usd("gcp", 100.0))
    assert spent == pytest.approx(compute + data.total_usd) and compute < 1.0 < spent
    _, stop = tracker.check(live, T0 + 600)
    assert stop
    without_bytes = BudgetTracker(BudgetPolicy(budget_usd=1.0), earlier=[], managed=False)
    assert not without_bytes.check(replace(live, bytes_uploaded={}), T0 + 600)[1]


def test_the_report_page_states_each_part_of_the_bill_and_how_it_was_known():
    from skygreen.costs.costing import RunCostReport
    from skygreen.costs.page import _run_section
    from skygreen.launch.registry import RunRecord

    segments = gcp_then_aws()
    cost = run_cost("demo-a", segments, buckets={BUCKET: US_EAST}, store=US_EAST, keep=3, storage_bytes=6 * GB)
    record = RunRecord(run_id="demo-a", task_path="t.yaml", task_name="demo", mode="cloud", launcher="skypilot",
                       bucket="s3://team-ckpt/runs", task_yaml="t.yaml", spec_snapshot={}, created_at="", state="SUCCEEDED")  # fmt: skip
    page = "\n".join(_run_section(RunCostReport(record=record, cost=cost, segments=tuple(segments))))
    assert f"transfer ${cost.transfer_usd:,.2f} (measured)" in page and "requests $" in page
    assert "controller $" in page and "(estimated)" in page


def test_the_budget_prices_transfer_to_the_region_the_task_states():
    """The same bytes from AWS us-west-2: free to a bucket the task says is in us-west-2, at the
    inter-region rate to one taken to be in us-east-1 (S3's default)."""
    from skygreen.ledger.budget import BudgetPolicy, BudgetTracker
    from skygreen.task.settings import RuntimeSettings
    from skygreen.task.spec import parse_spec

    live = Segment(run_id="r-1", key=new_segment_key(T0, token="0000abcd"), place=AWS_WEST, started_at=T0,
                   updated_at=T0, bytes_uploaded={BUCKET: 100 * GB}, checkpoint_bytes=10 * GB)  # fmt: skip
    policy = BudgetPolicy(budget_usd=100.0)
    assumed = BudgetTracker(policy, earlier=[], managed=False).spent_usd(live, T0 + 600)
    stated = BudgetTracker(policy, earlier=[], managed=False, bucket_region="us-west-2").spent_usd(live, T0 + 600)
    rate = load_rates().within[("aws", "same_continent")]
    assert assumed - stated == pytest.approx(100 * rate) and stated < 0.1
    spec = parse_spec({"skygreen": {"checkpoint": {"bucket": "s3://team-ckpt/runs", "region": "us-west-2"}}})
    settings = RuntimeSettings.from_spec(spec.green, run_id="r-1", bucket="s3://team-ckpt/runs")
    assert settings.checkpoint_region == "us-west-2"
    assert RuntimeSettings.from_env(settings.to_env()).checkpoint_region == "us-west-2"  # as the VM reads it
