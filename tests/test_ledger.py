"""The run ledger's core: records, keys, places from SkyPilot's variables, pricing by hand."""

from __future__ import annotations

import json

import pytest

from skygreen.checkpoint.local_store import LocalStore
from skygreen.ledger import Place, Segment, read_ledger, write_segment
from skygreen.ledger.budget import Alert, BudgetPolicy, BudgetTracker, StoredCheckpoints
from skygreen.ledger.io import LedgerWriter
from skygreen.ledger.place import current_place, gpu_catalog_name, offers_env, parse_offers
from skygreen.ledger.pricing import (
    CONTROLLER_AUTOSTOP_S,
    CONTROLLER_USD_PER_HOUR,
    HOURS_PER_MONTH,
    STORAGE_USD_PER_GB_MONTH,
    run_cost,
)
from skygreen.ledger.records import (
    KILLED,
    MAX_SERIES_POINTS,
    PREEMPTED,
    add_point,
    at_checkpoint,
    is_segment_key,
    new_segment_key,
    settle,
)

T0 = 1_780_000_000.0


def seg(
    key_s: float,
    *,
    place: Place,
    dur_s: float,
    end: str = "completed",
    start_step=0,
    step=100,
    first_s=0.0,
    ended=True,
    **kw,
) -> Segment:
    return Segment(
        run_id="r-1", key=new_segment_key(key_s, token="0000abcd"), place=place, started_at=key_s, updated_at=key_s + dur_s,
        ended_at=key_s + dur_s if ended else None, end=end, start_step=start_step, step=step,
        first_step_at=key_s + first_s, train_s=dur_s - first_s, **kw,
    )  # fmt: skip


L4 = Place(
    cloud="gcp",
    region="us-central1",
    instance_type="g2-standard-4",
    spot=True,
    gpu="L4",
    gpu_count=1,
    price_usd_per_hour=0.28,
    price_source="plan",
)
T4 = Place(
    cloud="aws",
    region="us-east-1",
    instance_type="g4dn.xlarge",
    spot=True,
    gpu="T4",
    gpu_count=1,
    nodes=2,
    price_usd_per_hour=0.21,
    price_source="plan",
)


def test_keys_sort_by_start_and_are_recognised():
    a, b = new_segment_key(T0), new_segment_key(T0 + 0.001)
    assert is_segment_key(a) and is_segment_key(b) and a < b
    assert new_segment_key(T0, token="deadbeef").endswith("-deadbeef.json")
    assert not is_segment_key("ledger/notes.txt")
    assert not is_segment_key(a + "\n")  # `$` would match before a final newline


def test_round_trip_and_settle_numbers_segments_and_marks_the_replaced_running_one_killed(tmp_path):
    store = LocalStore(tmp_path)
    later = seg(T0 + 4000, place=L4, dur_s=100, ended=False, end="running")
    first = seg(T0, place=T4, dur_s=3600, ended=False, end="running", metrics={"val_loss": ((50, T0 + 10, 2.5),)})
    for s in (later, first):
        write_segment(store, s)
    store.put("ledger/README", b"not a segment")
    got = read_ledger(store)
    assert [s.segment for s in got] == [1, 2]
    assert got[0].end == KILLED and got[1].end == "running"  # the newest may still be running
    assert got[0].metrics["val_loss"] == ((50, T0 + 10, 2.5),)
    assert got[0].place == T4
    # rooted at the bucket: the run id is the prefix
    bucket = LocalStore(tmp_path.parent)
    assert [s.key for s in read_ledger(bucket, tmp_path.name)] == [s.key for s in got]


def test_place_from_skypilot_cluster_info_and_rendered_offers():
    class C:  # a plan candidate's fields
        def __init__(self, cloud, region, itype, acc, spot, price):
            self.cloud, self.region, self.instance_type, self.accelerator = cloud, region, itype, acc
            self.accelerator_count, self.spot, self.price_usd_per_hour = 1, spot, price

    offers = offers_env(
        [
            C("gcp", "us-central1", "g2-standard-4", "L4", True, 0.28),
            C("aws", "us-east-1", "g6.xlarge", "L4", True, 0.29),
        ]
    )
    env = {
        "SKYPILOT_CLUSTER_INFO": json.dumps({"cluster_name": "c", "cloud": "AWS", "region": "us-east-1", "zone": "us-east-1a"}),
        "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NUM_GPUS_PER_NODE": "1", "SKYGREEN_OFFERS": offers,
    }  # fmt: skip
    place = current_place(env, gpu="L4")
    assert place == Place(cloud="aws", region="us-east-1", zone="us-east-1a", instance_type="g6.xlarge", spot=True, gpu="L4",
                          gpu_count=1, nodes=2, price_usd_per_hour=0.29, price_source="plan")  # fmt: skip
    assert parse_offers("not json") == []
    unknown = current_place({**env, "SKYGREEN_OFFERS": ""}, gpu="L4")
    assert unknown.price_usd_per_hour is None and unknown.instance_type is None and unknown.cloud == "aws"
    local = current_place({}, gpu=None)
    assert local.cloud == "local" and local.price_usd_per_hour == 0.0


@pytest.mark.parametrize(
    ("device", "memory", "name"),
    [("NVIDIA A100-SXM4-80GB", 80, "A100-80GB"), ("NVIDIA A100-SXM4-40GB", 40, "A100"), ("Tesla T4", 15, "T4"),
     ("NVIDIA L4", 22, "L4"), ("NVIDIA A10G", 22, "A10G"), ("NVIDIA H100 80GB HBM3", 80, "H100"), ("NVIDIA H200", 141, "H200"),
     ("Tesla V100-SXM2-16GB", 16, "V100"), ("cpu", None, None)],
)  # fmt: skip
def test_gpu_names_map_to_the_catalog(device, memory, name):
    assert gpu_catalog_name(device, memory) == name


def test_run_cost_by_hand():
    """Segment 1: 2 nodes of aws T4 spot at $0.21 for 3600 s, preempted at step 100 (its last
    update). Segment 2: gcp L4 spot at $0.28 for 1800 s, resumed from step 80 (20 steps redone),
    first step 60 s after start, completed at step 300."""
    s1 = seg(T0, place=T4, dur_s=3600, end=PREEMPTED, step=100, first_s=0.0)
    s2 = seg(
        T0 + 3700, place=L4, dur_s=1800, start_step=80, step=300, first_s=60.0, samples=9600, samples_per_epoch=3200
    )
    cost = run_cost("r-1", settle([s1, s2]), storage_bytes=2_000_000_000, storage_scheme="s3")
    compute = 0.21 * 1.0 * 2 + 0.28 * 0.5
    span_s = 3700 + 1800
    controller = CONTROLLER_USD_PER_HOUR["aws"] * (span_s + CONTROLLER_AUTOSTOP_S) / 3600
    storage = 2.0 * 0.023 * span_s / 3600 / 730
    assert cost.compute_usd == pytest.approx(compute)  # 0.56
    assert cost.controller_usd == pytest.approx(controller)
    assert cost.storage_usd == pytest.approx(storage)
    assert cost.total_usd == pytest.approx(compute + controller + storage)
    assert cost.steps == 300 and cost.epochs == pytest.approx(3.0)
    assert cost.cost_per_step_usd == pytest.approx(cost.total_usd / 300)
    assert cost.preemptions == 1
    # restart 60 s + 20 steps redone at segment 1's 100 steps / 3600 s
    lost_s = 60 + 20 / (100 / 3600)
    assert cost.lost_s == pytest.approx(lost_s)
    assert cost.lost_usd == pytest.approx(0.28 * lost_s / 3600)
    assert cost.node_hours == pytest.approx(2.5)
    assert cost.clouds == pytest.approx({"aws": 2.0, "gcp": 0.5})
    assert any("controller" in a for a in cost.assumptions)


def test_a_local_run_is_free_and_pays_no_controller():
    local = Place(cloud="local", price_usd_per_hour=0.0, price_source="local")
    cost = run_cost("r-1", settle([seg(T0, place=local, dur_s=600)]), storage_bytes=10**9, storage_scheme="file")
    assert cost.local and cost.total_usd == 0.0 and cost.controller_usd == 0.0


def test_a_run_is_completed_when_its_last_segment_finished_training():
    done = run_cost("r", settle([seg(T0, place=L4, dur_s=60, end=PREEMPTED), seg(T0 + 90, place=L4, dur_s=60)]))
    assert done.completed and done.to_json()["completed"] is True
    stopped = run_cost("r", settle([seg(T0, place=L4, dur_s=60), seg(T0 + 90, place=L4, dur_s=60, end=PREEMPTED)]))
    assert not stopped.completed and stopped.to_json()["completed"] is False
    assert run_cost("r", settle([seg(T0, place=L4, dur_s=60, end="early-stopped")])).completed


def test_unknown_price_is_looked_up_or_counted_unpriced():
    place = Place(cloud="aws", region="us-east-1", instance_type="g6.xlarge", spot=True, gpu="L4", gpu_count=1)
    segments = settle([seg(T0, place=place, dur_s=7200)])
    assert run_cost("r", segments, lookup=lambda p: 0.29, managed=False).compute_usd == pytest.approx(0.58)
    missing = run_cost("r", segments, lookup=lambda p: None, managed=False)
    assert missing.unpriced_segments == 1 and missing.compute_usd == 0.0


def test_series_are_thinned_to_a_bounded_size():
    series: dict = {}
    for i in range(3 * MAX_SERIES_POINTS):
        series = add_point(series, "loss", (i, T0 + i, 1.0 / (i + 1)))
    points = series["loss"]
    assert len(points) <= MAX_SERIES_POINTS
    assert points[-1][0] == 3 * MAX_SERIES_POINTS - 1 and points[0][0] == 0
    assert [p[0] for p in points] == sorted(p[0] for p in points)


def test_writer_overwrites_only_its_own_segment(tmp_path):
    store = LocalStore(tmp_path)
    old = seg(T0, place=L4, dur_s=100, ended=False, end="running")
    write_segment(store, old)
    clock = iter([T0 + 500 + i for i in range(100)])
    writer = LedgerWriter(store, run_id="r-1", place=L4, started_at=T0 + 400, clock=lambda: next(clock))
    writer.begin(step=10, samples=320, samples_per_epoch=3200, energy_j_total=1000.0)
    assert writer.earlier == read_ledger(store)[:1]
    writer.first_step()
    writer.report("val_loss", 20, 1.5)
    writer.update(step=20, samples=640, train_s=50.0, energy_j_total=4600.0)
    writer.update(step=30, samples=960, train_s=90.0, energy_j_total=8200.0, end="completed")
    got = read_ledger(store)
    assert len(got) == 2 and got[0] == settle([old, writer.segment])[0]  # the old VM's object untouched
    mine = got[1]
    assert (mine.start_step, mine.step, mine.end, mine.energy_j) == (10, 30, "completed", 7200.0)
    assert mine.samples_per_s == pytest.approx(640 / 90.0)
    assert mine.metrics["val_loss"][0][0] == 20 and mine.metrics["val_loss"][0][2] == 1.5


def test_budget_alerts_fire_once_each_and_stop_at_100_percent():
    place = Place(
        cloud="aws", region="us-east-1", spot=True, gpu="L4", gpu_count=1, price_usd_per_hour=1.0, price_source="plan"
    )
    current = Segment(run_id="r", key=new_segment_key(T0), place=place, started_at=T0, updated_at=T0)
    tracker = BudgetTracker(BudgetPolicy(budget_usd=2.0, burn_usd_per_hour=1.1), earlier=[], managed=False)
    alerts, stop = tracker.check(current, T0)
    assert [a.kind for a in alerts] == [] and not stop  # $1/h is below $1.1/h
    alerts, stop = tracker.check(current, T0 + 3600)  # $1.00 spent: 50%
    assert [(a.kind, a.fraction) for a in alerts] == [("budget", 0.5)] and not stop
    assert tracker.check(current, T0 + 3700) == ([], False)
    alerts, stop = tracker.check(current, T0 + 7200)  # $2.00: 80% and 100% at once
    assert [a.fraction for a in alerts] == [0.8, 1.0] and stop
    managed = BudgetTracker(BudgetPolicy(burn_usd_per_hour=1.1), earlier=[], managed=True)
    (burn,), _ = managed.check(current, T0)
    assert (
        isinstance(burn, Alert)
        and burn.kind == "burn"
        and burn.burn_usd_per_hour == pytest.approx(1.0 + CONTROLLER_USD_PER_HOUR["aws"])
    )


def test_budget_fractions_passed_by_earlier_vms_are_not_sent_again():
    place = Place(
        cloud="aws", region="us-east-1", spot=True, gpu="L4", gpu_count=1, price_usd_per_hour=1.0, price_source="plan"
    )
    earlier = settle([seg(T0, place=place, dur_s=3600 * 1.7, end=PREEMPTED)])
    current = Segment(
        run_id="r-1", key=new_segment_key(T0 + 7000), place=place, started_at=T0 + 7000, updated_at=T0 + 7000
    )
    tracker = BudgetTracker(BudgetPolicy(budget_usd=2.0), earlier=earlier, managed=False)
    assert tracker.check(current, T0 + 7000) == ([], False)  # 85% already: 50% and 80% were sent before
    alerts, stop = tracker.check(current, T0 + 7000 + 0.3 * 3600)
    assert [a.fraction for a in alerts] == [1.0] and stop


def test_a_vm_killed_between_checkpoints_is_billed_to_its_heartbeat_and_its_redone_steps_count(tmp_path):
    store = LocalStore(str(tmp_path / "run"))
    clock = [T0]
    writer = LedgerWriter(store, run_id="r-1", place=T4, started_at=T0, clock=lambda: clock[0])
    writer.begin(step=0, samples=0, samples_per_epoch=None, energy_j_total=None)
    writer.first_step()
    clock[0] = T0 + 100
    writer.update(step=100, samples=3200, train_s=100.0, energy_j_total=None)  # a checkpoint at step 100
    clock[0] = T0 + 140
    writer.heartbeat(step=140)  # 40 more steps, then kill -9: no checkpoint, no end
    resumed = seg(T0 + 200, place=T4, dur_s=400, start_step=100, step=300, first_s=20.0)
    write_segment(store, resumed)
    killed, _ = read_ledger(store)
    assert (killed.end, killed.step, killed.reached_step, killed.duration_s) == ("killed", 100, 140, 140.0)
    cost = run_cost("r-1", read_ledger(store))
    assert cost.preemptions == 1
    assert cost.lost_s == pytest.approx(20.0 + 40 / (100 / 100.0))  # restart + 40 redone steps at 1 step/s
    assert cost.segments[0].cost_usd == pytest.approx(T4.price_usd_per_hour * T4.nodes * 140 / 3600)  # 140 s, not 100


def test_the_step_reached_never_lags_the_committed_step(tmp_path):
    """Each checkpoint's update raises the step reached, not only the heartbeat between them."""
    store = LocalStore(str(tmp_path / "run"))
    writer = LedgerWriter(store, run_id="r-1", place=T4, started_at=T0, clock=lambda: T0 + 10)
    writer.begin(step=0, samples=0, samples_per_epoch=None, energy_j_total=None)
    writer.heartbeat(step=126)
    writer.update(step=150, samples=4800, train_s=10.0, energy_j_total=None)  # a checkpoint at step 150
    assert read_ledger(store)[-1].reached_step == 150


def test_a_killed_segment_says_the_step_its_successor_resumed_from(tmp_path):
    """Killed after the ledger wrote step 60 for a save that never committed: the next VM resumed
    from the checkpoint at 40. Ledger and bucket (status) then say the same step, 40, and the 20
    steps trained past it count as redone."""
    store = LocalStore(str(tmp_path / "run"))
    write_segment(store, seg(T0, place=T4, dur_s=600, ended=False, end="running", step=60))
    writer = LedgerWriter(store, run_id="r-1", place=T4, started_at=T0 + 700, clock=lambda: T0 + 720)
    writer.begin(step=40, samples=0, samples_per_epoch=None, energy_j_total=None)
    killed, resumed = read_ledger(store)
    assert (killed.end, killed.step, killed.reached_step) == ("killed", 40, 60)
    assert writer.earlier == [killed]  # the budget sees the same settled past
    assert run_cost("r-1", [killed, resumed]).lost_s == pytest.approx(resumed.startup_s + 20 / killed.steps_per_s)


def test_the_last_segment_reads_the_step_of_the_newest_checkpoint_either_way(tmp_path):
    """Written at a save before its commit (the runtime), or after it (the trainer callbacks):
    killed in between, the ledger is one save off the bucket. Readers say the checkpoint's step;
    the rate stays the one measured at the written step."""
    ahead = seg(T0, place=T4, dur_s=600, ended=False, end="running", step=60)  # train_s at step 60
    (read,) = at_checkpoint([ahead], 40)
    assert (read.step, read.reached_step, read.steps_done) == (40, 60, 40)
    assert read.steps_per_s == ahead.steps_per_s == pytest.approx(60 / 600)
    behind = seg(T0, place=T4, dur_s=600, ended=False, end="running", step=30)
    (read,) = at_checkpoint([behind], 40)
    assert (read.step, read.reached_step) == (40, None) and read.steps_per_s == pytest.approx(30 / 600)
    assert at_checkpoint([ahead], None) == [ahead]  # no checkpoint: nothing to go by
    old = seg(T0 + 700, place=T4, dur_s=600, ended=False, end="running", start_step=60, step=80)
    assert at_checkpoint([ahead, old], 40)[-1] == old  # a checkpoint from before this segment is not its own
    assert "timed_step" not in read.to_json()  # read side only: never written back

    store = LocalStore(str(tmp_path / "run"))
    write_segment(store, ahead)
    from skygreen.checkpoint.manifest import Manifest, blob_info, blob_key, manifest_key
    from skygreen.ledger.io import read_run_ledger

    store.put(blob_key(40, "shared.pt"), b"weights")
    manifest = Manifest(step=40, created_at="2026-01-01T00:00:00Z", blobs={"shared.pt": blob_info(b"weights")})
    store.put(manifest_key(40), manifest.dumps())
    assert [s.step for s in read_run_ledger(store)] == [40]  # what `cost` reads: the bucket's step
    assert [s.step for s in read_ledger(store)] == [60]  # the ledger as written


def test_a_cloud_vm_is_billed_from_its_first_setup_line(tmp_path):
    import string
    import subprocess
    from importlib import resources

    from skygreen.runtime.run_book import vm_started_at

    template = resources.files("skygreen").joinpath("templates").joinpath("setup.sh.tmpl").read_text(encoding="utf-8")
    code_lines = [line for line in template.splitlines() if line.strip() and not line.startswith("#")]
    first = "\n".join(code_lines[:2])  # the VM's first setup lines: where the stamps go, and the start
    assert ".started" in code_lines[1]
    home = tmp_path / "home"
    home.mkdir()
    first = string.Template(first).substitute({"run_id": "r1"})
    subprocess.run(["bash", "-c", first], env={"HOME": str(home), "PATH": "/usr/bin:/bin"}, check=True)
    noted = float((home / ".skygreen" / "changeover" / "r1.started").read_text())
    cloud = {"HOME": str(home), "SKYPILOT_CLUSTER_INFO": '{"cloud": "aws"}'}
    assert vm_started_at(cloud, run_id="r1", now_s=noted + 240) == noted  # setup and restore, paid
    assert vm_started_at(cloud, run_id="r1", now_s=noted + 7 * 3600) == noted + 7 * 3600  # another life's
    assert vm_started_at(cloud, run_id="r2", now_s=noted + 240) == noted + 240  # another run's stamp
    assert vm_started_at({"HOME": str(home)}, run_id="r1", now_s=noted + 240) == noted + 240  # local: no setup


def test_a_local_run_on_a_simulated_gpu_names_the_board_and_claims_no_gpu(tmp_path):
    place = current_place({"SKYGREEN_SIMULATED_GPU": "V100:2"}, gpu=None)
    assert place.label == "local (simulated V100x2 on CPU)" and place.gpu is None and place.gpu_count == 0
    assert current_place({"SKYGREEN_SIMULATED_GPU": "T4"}, gpu=None).label == "local (simulated T4x1 on CPU)"
    assert current_place({}, gpu=None).label == "local (CPU)"
    store = LocalStore(str(tmp_path / "run"))
    writer = LedgerWriter(store, run_id="r", place=place, started_at=T0)
    writer.begin(step=0, samples=0, samples_per_epoch=None, energy_j_total=None)
    (read,) = read_ledger(store)
    assert read.place == place  # kept in the ledger, so `cost` shows it too


def test_the_budget_counts_checkpoint_storage_as_cost_does(tmp_path):
    place = Place(
        cloud="aws", region="us-east-1", spot=True, gpu="L4", gpu_count=1, price_usd_per_hour=1.0, price_source="plan"
    )
    current = Segment(run_id="r", key=new_segment_key(T0), place=place, started_at=T0, updated_at=T0)
    stored = 50_000 * 10**9  # 50 TB of checkpoints kept in S3
    storage_usd = stored / 1e9 * STORAGE_USD_PER_GB_MONTH["s3"] * 1.0 / HOURS_PER_MONTH  # one hour of it
    without = BudgetTracker(BudgetPolicy(budget_usd=2.0), earlier=[], managed=False)
    counted = BudgetTracker(BudgetPolicy(budget_usd=2.0), earlier=[], managed=False, storage=lambda: (stored, "s3"))
    assert without.spent_usd(current, T0 + 3600) == pytest.approx(1.0)
    assert counted.spent_usd(current, T0 + 3600) == pytest.approx(1.0 + storage_usd)
    live = Segment(run_id="r", key=current.key, place=place, started_at=T0, updated_at=T0 + 3600)
    assert counted.spent_usd(current, T0 + 3600) == pytest.approx(
        run_cost("r", [live], managed=False, storage_bytes=stored, storage_scheme="s3").total_usd
    )
    assert without.check(current, T0 + 3600)[1] is False  # compute alone: $1 of $2
    assert counted.check(current, T0 + 3600)[1] is True  # with the storage it charges: over $2


def test_the_budget_reads_the_stored_checkpoints_from_the_manifests_at_most_once_a_minute(tmp_path):
    import torch

    from skygreen.checkpoint.manifest import iter_manifests
    from skygreen.runtime.checkpointer import Checkpointer

    with Checkpointer(str(tmp_path / "run"), keep=2) as ck:
        ck.save(1, {"model": torch.nn.Linear(64, 64).state_dict()})
    store = LocalStore(str(tmp_path / "run"))
    now = [0.0]
    meter = StoredCheckpoints(store, refresh_s=60.0, clock=lambda: now[0])
    first = sum(b.size for m in iter_manifests(store) for b in m.blobs.values())
    assert meter() == (first, "file") and first > 64 * 64 * 4
    with Checkpointer(str(tmp_path / "run"), keep=2) as ck:
        ck.save(2, {"model": torch.nn.Linear(64, 64).state_dict()})
    now[0] = 30.0
    assert meter() == (first, "file")  # not read again within the minute
    now[0] = 61.0
    assert meter()[0] == sum(b.size for m in iter_manifests(store) for b in m.blobs.values()) > first


def test_ledger_and_cost_modules_import_no_outside_library():
    import subprocess
    import sys

    probe = (
        "import skygreen.ledger, skygreen.ledger.pricing, skygreen.ledger.budget, skygreen.ledger.io, "
        "skygreen.costs.costing, skygreen.costs.report, skygreen.costs.page, skygreen.runtime.run_book\n"
        "import sys\nprint(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = set(out.stdout.split())
    assert not loaded & {
        "sky",
        "torch",
        "boto3",
        "botocore",
        "google",
        "pynvml",
        "numpy",
        "matplotlib",
        "click",
        "rich",
    }
