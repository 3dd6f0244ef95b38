"""`skygreen watch` of a cloud run whose task names several regions: the nomad moves it between
the regions of its plan, SkyPilot's edge faked (`skygreen.testing.FakeLauncher`), its ledger in
a real S3 server (moto on loopback), the clock moved by hand. Each `watch --once` is one poll."""

from __future__ import annotations

import json

from helpers import cli
from skygreen.checkpoint.store_factory import open_store
from skygreen.testing import FakeLauncher
from test_deadline_watch import CATALOG, env, ledger_progress, record_of, set_clock, write_task  # noqa: F401


def test_a_run_whose_region_finds_no_spot_moves_to_the_next_region_pinned_there(env, tmp_path, capsys, s3_bucket):  # noqa: F811
    bucket = f"s3://{s3_bucket}/runs"
    task = write_task(tmp_path, bucket, regions=["us-central1", "us-east-1"], max_candidates=6)
    code, out, err = cli(capsys, "up", str(task), "--no-smoke", "--catalog", str(CATALOG), "--deadline", "30h",
                         "--no-watch")  # fmt: skip
    assert code == 0, err
    assert "starts on spot, policy nomad" in out
    assert "places:      the nomad moves it between gcp us-central1, aws us-east-1" in out, out
    run_id = out.split("launched run ")[1].split()[0]
    fake = FakeLauncher(env["fake"])
    first = fake.job("1")["task"]
    assert {e["infra"] for e in first["resources"]["ordered"]} == {"gcp/us-central1", "aws/us-east-1"}  # not pinned
    fake.set_state("1", "RUNNING", cloud="gcp", region="us-central1")
    ledger_progress(f"{bucket}/{run_id}", step=100, total_steps=1000)

    code, out, err = cli(capsys, "watch", run_id, "--once")
    assert code == 0, err
    journey = json.loads((env["data"] / "runs" / run_id / "journey.json").read_text())
    assert journey["place"] == {"cloud": "gcp", "region": "us-central1", "zone": None, "name": "us-central1"}
    assert fake.job("1")["state"] == "RUNNING"  # the cheapest region, on spot: it stays

    # Preempted; an hour later SkyPilot still finds no spot there: the run has seen a short life
    # there, and the next region within the price the deadline allows is us-east-1.
    fake.set_state("1", "RECOVERING", recovery_count=1)
    set_clock(env, 1.0)
    code, out, err = cli(capsys, "watch", run_id, "--once")
    assert code == 0, err
    assert "spot at us-central1 -> spot at us-east-1 (availability: preempted; us-east-1 at $" in out, out
    assert fake.job("1")["state"] == "CANCELLED"  # the first half of the move
    code, out, err = cli(capsys, "status", run_id, "--json")
    shown = json.loads(out)["deadline"]
    assert shown["place"]["region"] == "us-central1" and shown["moving_to"]["region"] == "us-east-1"
    assert shown["policy"] == "nomad"

    code, out, err = cli(capsys, "watch", run_id, "--once")
    assert code == 0, err
    assert "relaunched spot at us-east-1 as job 2" in out, out
    second = fake.job("2")["task"]
    assert second["resources"]["ordered"] and all(
        (e["infra"], e["use_spot"]) == ("aws/us-east-1", True) for e in second["resources"]["ordered"]
    )
    assert second["envs"]["SKYGREEN_PLACE"] == "aws/us-east-1" and second["envs"]["SKYGREEN_LAUNCH"] == "2"
    assert second["envs"]["SKYGREEN_BUCKET"] == bucket

    move = json.loads(open_store(f"{bucket}/{run_id}").get("ledger/moves/0001.json"))
    assert (move["src"]["region"], move["dst"]["region"], move["launch"], move["job_id"]) == (
        "us-central1",
        "us-east-1",
        2,
        "2",
    )
    assert move["changeover_s"] is None  # measured once the new life's first step is in the ledger
    code, out, err = cli(capsys, "status", run_id)
    assert "place" in out and "aws us-east-1, spot" in out and "move 1" in out and "us-central1 -> us-east-1" in out
    assert [launch["spot"] for launch in record_of(env, run_id)["launches"]] == [True, True]
    code, out, err = cli(capsys, "status")
    assert out.splitlines()[1].endswith("29.0h left, spot at us-east-1 (no watcher)"), out
