"""`skygreen cost --all`: a team's spend over every run this machine knows and every run in the
shared buckets, each counted once, runs still going included, energy and CO2e beside the dollars.

The end-to-end test has two machines, each with its own home (its own run registry) and user:
- bob launches a cloud run through the fake launcher; its training runs as a real process
  with the rendered task's environment plus what SkyPilot gives a VM, and writes its ledger
  and checkpoints to a moto S3 bucket. alice's registry never hears of it.
- alice runs tasks/tiny.py with `up --local` three times: once into her own local bucket, once
  into the shared S3 bucket (found both in her registry and in the bucket: counted once), and
  once held at a step so that it is still running when she asks.
Only the cloud launch is fake (`skygreen.testing.FakeLauncher`); prices come from the real catalog.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from helpers import user_env, wait_for
from metadata_server import MetadataServer
from skygreen.costs.spend import SpentRun, summarise, task_of_run_id
from skygreen.ledger.pricing import run_cost
from skygreen.ledger.records import COMPLETED, Place, Segment, new_segment_key
from skygreen.plan.cost import PUE
from skygreen.runtime.hold import HOLD_ENV, RELEASE_ENV

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tasks" / "tiny.yaml"
SKYGREEN = [sys.executable, "-m", "skygreen.cli"]


def skygreen(env, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*SKYGREEN, *args], env=env, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "field", "value"),
    [
        (("--since", "soon"), "--since", "soon"),
        (("--since", "-3d"), "--since", "-3d"),
        (("--by", "colour"), "--by", "colour"),
        (("--bucket", "s3//team/ckpt"), "--bucket", "s3//team/ckpt"),
        (("--bucket", "ftp://team/ckpt"), "--bucket", "ftp://team/ckpt"),
        (("--bucket", "/no/such/team/bucket"), "--bucket", "/no/such/team/bucket"),
    ],
)
def test_bad_input_exits_2_naming_the_field_the_value_and_the_fix(private_home, args, field, value):
    out = skygreen(user_env(private_home), "cost", "--all", *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert field in out.stderr and value in out.stderr and "fix" in out.stderr.lower(), out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ("cost",),
        ("cost", "some-run", "--all"),
        ("cost", "some-run", "--by", "user"),
        ("cost", "--all", "--plot", "x.png"),
    ],
)
def test_mixed_up_arguments_are_usage_errors(private_home, args):
    out = skygreen(user_env(private_home), *args)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "--all" in out.stderr or "--plot" in out.stderr


def test_no_runs_yet_is_an_empty_spend_not_an_error(private_home):
    env = user_env(private_home)
    text = skygreen(env, "cost", "--all")
    assert text.returncode == 0, text.stderr
    assert "spend of 0 run(s), all time" in text.stdout
    data = json.loads(skygreen(env, "cost", "--all", "--json", "--by", "user").stdout)
    assert data["total"]["runs"] == 0 and data["total"]["total_usd"] == 0 and data["groups"] == []


# ---------------------------------------------------------------- grouping (pure)


def _segment(run_id: str, *, cloud: str, gpu: str | None, start: float, hours: float, price: float,
             energy_j: float | None, ended: bool = True) -> Segment:  # fmt: skip
    place = Place(cloud=cloud, region="us-east-1" if cloud == "aws" else "us-central1", gpu=gpu,
                  gpu_count=1 if gpu else 0, spot=True, price_usd_per_hour=price)  # fmt: skip
    end = start + hours * 3600
    return Segment(run_id=run_id, key=new_segment_key(start), place=place, started_at=start, updated_at=end,
                   ended_at=end if ended else None, end=COMPLETED if ended else "running", energy_j=energy_j)  # fmt: skip


def _spent(run_id: str, segments: list[Segment], *, user: str = "alice") -> SpentRun:
    cost = run_cost(run_id, segments, storage_bytes=2_000_000_000, storage_scheme="s3", managed=True)
    return SpentRun(run_id=run_id, task=task_of_run_id(run_id), user=user, state="SUCCEEDED",
                    found_in=("this machine",), cost=cost)  # fmt: skip


def test_by_cloud_splits_a_run_that_moved_and_the_groups_add_up_to_the_total():
    moved = _spent("tiny-20261201-100000-ab12", [
        _segment("tiny-20261201-100000-ab12", cloud="gcp", gpu="L4", start=1e9, hours=1.0, price=0.3, energy_j=3.6e6),
        _segment("tiny-20261201-100000-ab12", cloud="aws", gpu="L4", start=1e9 + 3700, hours=2.0, price=0.5,
                 energy_j=7.2e6),
    ])  # fmt: skip
    other = _spent("big-20261201-110000-cd34", [
        _segment("big-20261201-110000-cd34", cloud="aws", gpu="A100", start=1e9, hours=0.5, price=4.0,
                 energy_j=None, ended=False),
    ], user="bob")  # fmt: skip
    spend = summarise([moved, other], by="cloud")
    groups = {g.name: g for g in spend.groups}
    assert set(groups) == {"gcp", "aws"}
    assert groups["aws"].runs == 2 and groups["gcp"].runs == 1 and groups["aws"].running == 1
    assert groups["gcp"].total_usd == pytest.approx(0.3 + moved.cost.controller_usd + moved.cost.storage_usd)
    assert groups["aws"].total_usd == pytest.approx(1.0 + other.cost.total_usd)
    assert sum(g.total_usd for g in spend.groups) == pytest.approx(spend.total.total_usd)
    assert spend.total.total_usd == pytest.approx(moved.cost.total_usd + other.cost.total_usd)
    assert sum(g.node_hours for g in spend.groups) == pytest.approx(3.5)
    # energy where metered (PUE applied), nothing invented for the run that metered none
    assert groups["gcp"].energy_kwh == pytest.approx(moved.cost.segments[0].energy_kwh)
    assert spend.total.energy_kwh == pytest.approx(moved.cost.energy_kwh)
    assert spend.total.running == 1 and spend.groups[0].name == "aws"  # most spent first

    by_user = {g.name: g for g in summarise([moved, other], by="user").groups}
    assert by_user["bob"].total_usd == pytest.approx(other.cost.total_usd) and by_user["bob"].co2e_kg is None
    by_task = {g.name for g in summarise([moved, other], by="task").groups}
    assert by_task == {"tiny", "big"}
    assert {g.name for g in summarise([moved, other], by="gpu").groups} == {"L4", "A100"}


def test_task_of_run_id_reads_the_stem_of_a_run_id():
    assert task_of_run_id("my-task-20261201-101010-0a9f") == "my-task"
    assert task_of_run_id("handmade") == "handmade"


def test_since_keeps_the_runs_active_in_the_window_of_a_bucket(private_home, tmp_path):
    """Two runs of another machine in a local bucket, one last active 40 days ago: --since 30d
    counts the recent one alone, through the real command."""
    from skygreen.checkpoint.store_factory import open_store
    from skygreen.ledger.io import write_segment

    bucket = tmp_path / "bucket"
    now = time.time()
    for run_id, start in (("old-20261001-000000-aaaa", now - 40 * 86400), ("new-20261130-000000-bbbb", now - 3600)):
        seg = _segment(run_id, cloud="aws", gpu="L4", start=start, hours=0.5, price=0.8, energy_j=1.8e6)
        write_segment(open_store(str(bucket / run_id)), seg)
    (bucket / "not-a-run").mkdir()
    (bucket / "not-a-run" / "notes.txt").write_text("foreign file")
    env = user_env(private_home)
    every = json.loads(skygreen(env, "cost", "--all", "--bucket", str(bucket), "--json").stdout)
    assert {r["run_id"] for r in every["runs"]} == {"old-20261001-000000-aaaa", "new-20261130-000000-bbbb"}
    assert {r["user"] for r in every["runs"]} == {"unknown"}  # ledgers written before the user was kept
    recent = skygreen(env, "cost", "--all", "--bucket", str(bucket), "--since", "30d", "--json")
    assert recent.returncode == 0, recent.stderr
    data = json.loads(recent.stdout)
    assert [r["run_id"] for r in data["runs"]] == ["new-20261130-000000-bbbb"] and data["since_s"] == 30 * 86400
    (run,) = data["runs"]
    assert run["compute_usd"] == pytest.approx(0.4) and run["task"] == "new"
    assert run["energy_kwh"] == pytest.approx(0.5 * PUE["aws"]) and run["co2e_kg"] > 0


def test_an_unreadable_bucket_leaves_out_its_runs_names_itself_and_exits_1(private_home, tmp_path, s3_bucket):
    """One shared bucket is readable (a run of another machine in it), one does not exist: the
    command shows the readable one's spend, names the other with the reason and the fix, and
    exits 1, because the total is not the team's whole spend (text and --json alike)."""
    from skygreen.checkpoint.store_factory import open_store
    from skygreen.ledger.io import write_segment

    shared, gone = f"s3://{s3_bucket}/team", f"s3://{s3_bucket}-gone/team"
    run_id = "bob-20261130-000000-cccc"
    seg = _segment(run_id, cloud="gcp", gpu="L4", start=time.time() - 3600, hours=0.5, price=0.8, energy_j=1.8e6)
    write_segment(open_store(f"{shared}/{run_id}"), seg)
    env = user_env(private_home)
    out = skygreen(env, "cost", "--all", "--bucket", shared, "--bucket", gone, "--json")
    assert out.returncode == 1, out.stdout + out.stderr
    data = json.loads(out.stdout)
    (run,) = data["runs"]
    assert run["run_id"] == run_id and run["compute_usd"] == pytest.approx(0.4)
    assert data["total"]["total_usd"] == pytest.approx(run["total_usd"]) and data["complete"] is False
    (unreadable,) = data["unreadable"]
    assert unreadable["bucket"] == gone and unreadable["reason"] and gone in unreadable["fix"], unreadable
    assert "does not exist" in unreadable["reason"], unreadable  # the store's own reason
    assert f"error: cannot read bucket {gone}" in out.stderr and "fix:" in out.stderr and "Traceback" not in out.stderr
    text = skygreen(env, "cost", "--all", "--bucket", shared, "--bucket", gone)
    assert text.returncode == 1 and run_id in text.stdout, text.stdout + text.stderr
    assert "not counted: 1 bucket(s) could not be read" in " ".join(text.stdout.split()), text.stdout
    assert gone in text.stderr and "fix:" in text.stderr
    whole = skygreen(env, "cost", "--all", "--bucket", shared, "--json")
    assert whole.returncode == 0 and json.loads(whole.stdout)["complete"] is True, whole.stderr


# ---------------------------------------------------------------- end to end


def _task_into(work: Path, bucket_url: str, *, steps_every: int = 10) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "tasks" / "tiny.py", work / "tiny.py")
    path = work / "task.yaml"
    path.write_text(
        "name: tiny\nskygreen:\n  gpus: [L4]\n  clouds: [gcp]\n  work: {gpu_hours: 0.05, gpu: T4}\n"
        "  batch: {effective: 32, micro: 16}\n  precision: fp32\n"
        f"  checkpoint: {{bucket: '{bucket_url}', every: {steps_every}, keep: 3}}\n"
        "  early_stopping: {metric: val_loss, mode: min, patience: 3, min_delta: 0.001, grace: 2}\nrun: python tiny.py\n"
    )
    return path


def _bob_runs_on_the_cloud(tmp_path: Path, bucket_url: str, catalog: Path) -> str:
    """bob's machine: `up` through the fake launcher, then the job's training as a gcp VM runs it."""
    home = tmp_path / "bob"
    home.mkdir()
    task = _task_into(tmp_path / "bob-task", bucket_url)
    env = user_env(home, LOGNAME="bob", USER="bob", SKYGREEN_LAUNCHER="skygreen.testing:FakeLauncher",
                   SKYGREEN_FAKE_LAUNCHER_DIR=str(tmp_path / "fake"))  # fmt: skip
    up = skygreen(env, "up", str(task), "--no-smoke", "--catalog", str(catalog))
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.split("launched run ")[1].split()[0]
    envs = json.loads((tmp_path / "fake" / "jobs.json").read_text())["1"]["task"]["envs"]
    assert envs["SKYGREEN_USER"] == "bob"
    region = json.loads(envs["SKYGREEN_OFFERS"])[0][1]
    info = json.dumps({"cluster_name": "sky-gcp", "cloud": "GCP", "region": region, "zone": None})
    with MetadataServer("gcp") as metadata:
        vm = {**env, **envs, "SKYPILOT_CLUSTER_INFO": info, "SKYPILOT_NUM_NODES": "1", "SKYPILOT_NUM_GPUS_PER_NODE": "1",
              "SKYGREEN_GCP_METADATA_URL": metadata.url, "TINY_STEPS": "30"}  # fmt: skip
        done = subprocess.run([sys.executable, "tiny.py"], cwd=task.parent, env=vm, capture_output=True, text=True,
                              timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return run_id


@pytest.mark.slow
def test_a_teams_spend_counts_every_run_once_with_runs_still_going(s3_bucket, shared_catalog_dir, tmp_path):
    shared = f"s3://{s3_bucket}/team"
    bob_run = _bob_runs_on_the_cloud(tmp_path, shared, shared_catalog_dir)

    alice_home = tmp_path / "alice"
    alice_home.mkdir()
    alice = user_env(alice_home, LOGNAME="alice", USER="alice", TINY_STEPS="30")
    own = skygreen(alice, "up", str(TINY), "--local", "--no-smoke")
    assert own.returncode == 0, own.stdout[-2000:] + own.stderr[-2000:]
    into_shared = skygreen(alice, "up", str(_task_into(tmp_path / "alice-task", shared)), "--local", "--no-smoke")
    assert into_shared.returncode == 0, into_shared.stdout[-2000:] + into_shared.stderr[-2000:]
    release = tmp_path / "release"
    release.mkdir()
    held_env = {**alice, HOLD_ENV: "10", RELEASE_ENV: str(release)}
    held = skygreen(held_env, "up", str(TINY), "--local", "--no-smoke", "--detach")
    assert held.returncode == 0, held.stderr
    statuses = {r["run_id"]: r for r in json.loads(skygreen(alice, "status", "--json").stdout)}
    (held_run,) = [r for r, s in statuses.items() if s["state"] not in ("SUCCEEDED",)]
    shared_run = next(r for r in statuses if r != held_run and json.loads(
        (alice_home / ".local/share/skygreen/runs" / r / "run.json").read_text())["bucket"].startswith("s3://"))  # fmt: skip
    own_run = next(r for r in statuses if r not in (held_run, shared_run))
    record = json.loads((alice_home / ".local/share/skygreen/runs" / shared_run / "run.json").read_text())
    assert record["user"] == "alice"  # the launching user, kept in the run record

    def held_at_step():
        s = json.loads(skygreen(alice, "status", held_run, "--json").stdout)
        assert s["state"] in ("RUNNING", "PENDING", "STARTING"), f"the held run ended ({s['state']}) before step 10"
        return s["step"] == 10

    wait_for(held_at_step, "the held run at step 10")
    try:
        out = skygreen(alice, "cost", "--all", "--bucket", shared, "--json", "--catalog", str(shared_catalog_dir))
        assert out.returncode == 0, out.stderr
        spend = json.loads(out.stdout)
        runs = {r["run_id"]: r for r in spend["runs"]}
        assert set(runs) == {bob_run, own_run, shared_run, held_run}  # each once
        assert runs[bob_run]["found_in"] == [shared] and runs[bob_run]["user"] == "bob"
        assert runs[bob_run]["clouds"] == ["gcp"] and runs[bob_run]["total_usd"] > 0
        assert runs[shared_run]["found_in"] == ["this machine", shared]
        assert runs[own_run]["found_in"] == ["this machine"]
        assert {runs[r]["user"] for r in (own_run, shared_run, held_run)} == {"alice"}
        assert runs[held_run]["running"] and not runs[own_run]["running"]
        assert spend["total"]["runs"] == 4 and spend["total"]["running"] == 1
        # the same figure as `cost RUN` on bob's machine: the one pricing function
        bob_env = user_env(tmp_path / "bob", SKYGREEN_LAUNCHER="skygreen.testing:FakeLauncher",
                           SKYGREEN_FAKE_LAUNCHER_DIR=str(tmp_path / "fake"))  # fmt: skip
        bob_cost = json.loads(skygreen(bob_env, "cost", bob_run, "--json", "--catalog", str(shared_catalog_dir)).stdout)
        assert runs[bob_run]["total_usd"] == pytest.approx(bob_cost["total_usd"], rel=0.02)
        assert runs[bob_run]["energy_kwh"] == bob_cost["energy_kwh"]
        assert spend["total"]["total_usd"] == pytest.approx(
            sum(r["total_usd"] for r in runs.values()), abs=1e-6 * (len(runs) + 1)
        )  # each rounded to 1e-6

        by_user = json.loads(skygreen(alice, "cost", "--all", "--bucket", shared, "--by", "user", "--json",
                                      "--catalog", str(shared_catalog_dir)).stdout)  # fmt: skip
        users = {g["name"]: g for g in by_user["groups"]}
        assert set(users) == {"alice", "bob"} and users["alice"]["runs"] == 3 and users["alice"]["running"] == 1
        assert users["bob"]["total_usd"] == pytest.approx(runs[bob_run]["total_usd"], abs=1e-6)

        # a shared bucket that is not there: the rest is shown, the bucket named, and exit 1
        missing = skygreen(alice, "cost", "--all", "--bucket", f"s3://{s3_bucket}-gone/team", "--json")
        assert missing.returncode == 1 and f"{s3_bucket}-gone" in missing.stderr, missing.stderr
        assert "Traceback" not in missing.stderr
        assert {r["run_id"] for r in json.loads(missing.stdout)["runs"]} == {own_run, shared_run, held_run}

        # without the bucket: this machine's runs only
        mine = json.loads(skygreen(alice, "cost", "--all", "--json").stdout)
        assert {r["run_id"] for r in mine["runs"]} == {own_run, shared_run, held_run}

        text = skygreen({**alice, "COLUMNS": "80"}, "cost", "--all", "--bucket", shared, "--by", "cloud",
                        "--since", "30d", "--catalog", str(shared_catalog_dir))  # fmt: skip
        assert text.returncode == 0, text.stderr
        lines = text.stdout.splitlines()
        flat = " ".join(text.stdout.split())  # the headline wraps at 80 columns
        assert "spend of 4 run(s), the last 30d" in flat and "1 still running" in flat, text.stdout
        assert any(line.split()[:2] == ["gcp", "1"] for line in lines), text.stdout
        assert any(line.split()[:4] == ["local", "3", "(1", "running)"] for line in lines), text.stdout
        assert "1 run(s) known only from the buckets" in text.stdout
        assert all(len(line) <= 80 for line in lines), text.stdout
        per_run = skygreen(alice, "cost", "--all", "--bucket", shared, "--catalog", str(shared_catalog_dir))
        assert bob_run in per_run.stdout and "bob" in per_run.stdout and "kg CO2e" in per_run.stdout
        sys.stdout.write(text.stdout + per_run.stdout)  # shown with -s
    finally:
        (release / "10").touch()
    wait_for(lambda: json.loads(skygreen(alice, "status", held_run, "--json").stdout)["state"] == "SUCCEEDED",
             "the held run to finish")  # fmt: skip
