"""`skygreen up --deadline` and `skygreen watch` on cloud runs, SkyPilot's edge faked.

The launcher is `skygreen.testing.FakeLauncher` (selected by environment, as a user would);
the bucket is a real S3 server (moto_server on loopback) holding the run ledger the watcher
reads; the clock is `SKYGREEN_TEST_CLOCK_FILE`, moved by hand. Each `watch --once` is one real
poll: read the record, the job, the ledger; decide; take one step.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from helpers import cli, end_processes_of, wait_for
from skygreen.checkpoint.cancellation import CANCEL_KEY
from skygreen.checkpoint.store_factory import open_store
from skygreen.deadline.clock import CLOCK_ENV
from skygreen.deadline.watch_state import LOCK_FILE, load_state, watcher_lock, watcher_running
from skygreen.ledger.io import write_segment
from skygreen.ledger.records import Place, Segment, new_segment_key
from skygreen.testing import FakeLauncher

REPO = Path(__file__).resolve().parents[1]
CATALOG = REPO / "tests" / "data" / "catalog" / "v8"
T0 = 1_800_000_000.0
H = 3600.0


@pytest.fixture
def env(private_home, tmp_path, monkeypatch):
    fake_dir = tmp_path / "fake-sky"
    clock = tmp_path / "clock"
    clock.write_text(f"{T0}\n")
    monkeypatch.setenv("SKYGREEN_LAUNCHER", "skygreen.testing:FakeLauncher")
    monkeypatch.setenv("SKYGREEN_FAKE_LAUNCHER_DIR", str(fake_dir))
    monkeypatch.setenv(CLOCK_ENV, str(clock))
    for name in ("SKYGREEN_FAKE_LAUNCHER_FAIL", "SKYGREEN_DATA_DIR", "SKYGREEN_TEST_SPOT_TRACE"):
        monkeypatch.delenv(name, raising=False)
    return {
        "data": private_home / ".local" / "share" / "skygreen",
        "fake": fake_dir,
        "clock": clock,
        "home": private_home,
    }


def write_task(tmp_path: Path, bucket: str, **green_extra) -> Path:
    green = {"gpus": ["L4", "T4", "A100"], "work": {"gpu_hours": 4, "gpu": "A100"}, "max_candidates": 3}
    green["checkpoint"] = {"bucket": bucket}
    green.update(green_extra)
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump({"name": "dl", "skygreen": green, "run": "python train.py"}, sort_keys=False))
    (tmp_path / "train.py").write_text("print('training')\n")
    return path


def set_clock(env, hours: float) -> None:
    env["clock"].write_text(f"{T0 + hours * H}\n")


def record_of(env, run_id: str) -> dict:
    return json.loads((env["data"] / "runs" / run_id / "run.json").read_text())


def ledger_progress(url: str, *, step: int, total_steps: int) -> None:
    """The runtime's ledger segment, as a VM writes it: `step` of `total_steps`."""
    now = T0
    write_segment(
        open_store(url),
        Segment(run_id=url.rsplit("/", 1)[1], key=new_segment_key(now, token="0000aaaa"), place=Place(cloud="aws"),
                started_at=now, updated_at=now + 60, step=step, train_s=50.0, total_steps=total_steps),
    )  # fmt: skip


def behind_on_recovering_spot(capsys, env, tmp_path: Path, s3_bucket: str) -> tuple[str, FakeLauncher]:
    """A Uniform Progress run of 30 h whose spot job is recovering five hours in, nothing done:
    behind the even pace, so the next poll moves it to on-demand."""
    bucket = f"s3://{s3_bucket}/runs"
    run_id = up_deadline(capsys, env, write_task(tmp_path, bucket), "--deadline", "30h", "--policy",
                         "uniform_progress", "--no-watch")  # fmt: skip
    fake = FakeLauncher(env["fake"])
    fake.set_state("1", "RECOVERING", recovery_count=1)
    ledger_progress(f"{bucket}/{run_id}", step=0, total_steps=1000)
    set_clock(env, 5.0)
    return run_id, fake


def watcher_in_a_held_launch(run_id: str, hold: Path) -> subprocess.Popen:
    """`watch RUN --once` in its own process, stopped inside the launcher's launch call
    (`SKYGREEN_FAKE_LAUNCHER_HOLD`) until `hold/release` exists."""
    hold.mkdir()
    watcher = subprocess.Popen([sys.executable, "-m", "skygreen.cli", "watch", run_id, "--once"],
                               env={**os.environ, "SKYGREEN_FAKE_LAUNCHER_HOLD": str(hold)},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        wait_for(lambda: (hold / "launching").exists() or watcher.poll() is not None, "the watcher's relaunch")
    except BaseException:
        watcher.kill()
        raise
    assert watcher.poll() is None, watcher.communicate()[0]
    return watcher


def up_deadline(capsys, env, task: Path, *extra: str) -> str:
    code, out, err = cli(capsys, "up", str(task), "--no-smoke", "--catalog", str(CATALOG), *extra)
    assert code == 0, err
    return out.split("launched run ")[1].split()[0]


def test_up_with_a_deadline_records_the_plans_terms_and_starts_on_spot(env, tmp_path, capsys, s3_bucket):
    task = write_task(tmp_path, f"s3://{s3_bucket}/runs")
    code, out, err = cli(capsys, "up", str(task), "--no-smoke", "--catalog", str(CATALOG), "--deadline", "30h",
                         "--no-watch")  # fmt: skip
    assert code == 0, err
    assert "deadline:    30 h" in out and "starts on spot, policy skygreen" in out
    assert "watcher:     not started; run `skygreen watch" in out
    run_id = out.split("launched run ")[1].split()[0]
    record = record_of(env, run_id)
    terms, best = record["deadline"], record["plan_summary"]["offers"][0]
    assert terms["deadline_at_s"] - terms["started_at_s"] == 30 * H and terms["started_at_s"] == T0
    assert terms["compute_h"] == pytest.approx(best["compute_hours"])
    assert (terms["spot_usd_per_hour"], terms["on_demand_usd_per_hour"]) == (
        best["spot_price_usd_per_hour"],
        best["on_demand_price_usd_per_hour"],
    )
    assert 0 < terms["changeover_h"] < 1
    assert record["launches"][0]["spot"] is True
    task_sent = FakeLauncher(env["fake"]).job("1")["task"]
    assert task_sent["resources"]["use_spot"] is True and task_sent["envs"]["SKYGREEN_CAPACITY"] == "spot"


def test_the_watcher_moves_a_recovering_spot_run_to_on_demand_and_stops_for_the_user(env, tmp_path, capsys, s3_bucket):
    bucket = f"s3://{s3_bucket}/runs"
    run_id = up_deadline(capsys, env, write_task(tmp_path, bucket), "--deadline", "30h", "--policy",
                         "uniform_progress", "--no-watch")  # fmt: skip
    fake = FakeLauncher(env["fake"])
    fake.set_state("1", "RUNNING")

    code, out, err = cli(capsys, "watch", run_id, "--once")
    assert code == 0, err
    assert "waiting for its first steps in the ledger" in out  # no progress in the ledger yet

    ledger_progress(f"{bucket}/{run_id}", step=0, total_steps=1000)
    code, out, err = cli(capsys, "watch", run_id, "--once")
    assert code == 0, err
    assert fake.job("1")["state"] == "RUNNING"  # on spot and spot runs: nothing to do
    watch = json.loads((env["data"] / "runs" / run_id / "watch.json").read_text())
    assert watch["decisions"][-1]["mode"] == "spot" and watch["availability"] == [[T0, True]]

    # preempted, SkyPilot looks for spot; five hours in, nothing done: behind the even pace
    fake.set_state("1", "RECOVERING", recovery_count=1)
    set_clock(env, 5.0)
    code, out, err = cli(capsys, "watch", run_id, "--once")
    assert code == 0, err
    assert "idle -> on-demand" in out
    assert fake.job("1")["state"] == "CANCELLED"  # first half of the switch
    code, out, err = cli(capsys, "watch", run_id, "--once")
    assert code == 0, err
    assert "relaunched on on-demand as job 2" in out
    second = fake.job("2")["task"]
    assert second["resources"]["use_spot"] is False
    assert all(entry["use_spot"] is False for entry in second["resources"]["ordered"])
    assert second["envs"]["SKYGREEN_CAPACITY"] == "on-demand"
    offers = json.loads(second["envs"]["SKYGREEN_OFFERS"])
    plan_offers = record_of(env, run_id)["plan_summary"]["offers"]
    assert offers[0][5] is False and offers[0][6] == pytest.approx(plan_offers[0]["on_demand_price_usd_per_hour"])
    assert second["envs"]["SKYGREEN_RUN_ID"] == run_id
    assert [launch["spot"] for launch in record_of(env, run_id)["launches"]] == [True, False]

    fake.set_state("2", "RUNNING")
    code, out, err = cli(capsys, "status", run_id, "--json")
    deadline = json.loads(out)["deadline"]
    assert deadline["decision"] == "on_demand" and deadline["switches"] == 1
    assert deadline["left_h"] == pytest.approx(25.0) and deadline["watcher"]["running"] is False
    code, out, err = cli(capsys, "status", run_id)
    assert "deadline" in out and "30 h, by" in out and "25.00 h left" in out
    assert "not running: the run stays where it is" in out and f"skygreen watch {run_id}" in out
    code, out, err = cli(capsys, "status")
    header, row = out.splitlines()[:2]
    assert header.split()[-1] == "DEADLINE" and row.endswith("25.0h left, on-demand (no watcher)")

    code, out, err = cli(capsys, "cancel", run_id)
    assert code == 0, err
    code, out, err = cli(capsys, "watch", run_id, "--once")
    assert code == 0 and "cancelled by the user; the watcher stops" in out
    assert len(record_of(env, run_id)["launches"]) == 2  # nothing relaunched after the user's cancel

    # the user's resume holds the run to its deadline again: a watcher starts in the background
    code, out, err = cli(capsys, "resume", run_id)
    assert code == 0 and "held to its deadline by its watcher" in out, err
    run_dir = env["data"] / "runs" / run_id
    try:

        def started() -> int | None:  # earlier `watch --once` polls ran in this process and left its pid
            pid = load_state(run_dir).pid
            return pid if watcher_running(run_dir) and pid != os.getpid() else None

        watcher = wait_for(started, "the resumed run's watcher")
        assert not (run_dir / "cancelled-by-user").exists()
        assert record_of(env, run_id)["launches"][-1]["spot"] is False  # as the watcher had left it
    finally:  # the state's pid may name an ended watcher whose number is reused: end ours by their HOME
        end_processes_of(env["home"])
    assert watcher


def test_a_spot_job_coming_up_within_one_changeover_is_not_taken_for_an_outage(env, tmp_path, capsys, s3_bucket):
    bucket = f"s3://{s3_bucket}/runs"
    run_id = up_deadline(capsys, env, write_task(tmp_path, bucket), "--deadline", "30h", "--no-watch")
    d_h = record_of(env, run_id)["deadline"]["changeover_h"]
    fake = FakeLauncher(env["fake"])
    fake.set_state("1", "STARTING")
    ledger_progress(f"{bucket}/{run_id}", step=0, total_steps=1000)
    run_dir = env["data"] / "runs" / run_id
    set_clock(env, d_h / 2)  # SkyPilot still provisioning the first spot VM, half a changeover in
    assert cli(capsys, "watch", run_id, "--once")[0] == 0
    state = load_state(run_dir)
    assert state.availability.changes == () and state.latest is not None and state.latest.current == "spot"
    set_clock(env, d_h * 1.5)  # a changeover on, still no VM: that is an outage
    assert cli(capsys, "watch", run_id, "--once")[0] == 0
    state = load_state(run_dir)
    assert state.availability.changes == ((T0 + d_h * 1.5 * H, False),) and state.latest.current == "idle"

    # the watcher dates its own relaunches too (here onto on-demand), for a spot one coming up later
    (tmp_path / "second").mkdir()
    run_id, fake = behind_on_recovering_spot(capsys, env, tmp_path / "second", s3_bucket)
    for _ in range(2):  # cancel, then relaunch on on-demand
        assert cli(capsys, "watch", run_id, "--once")[0] == 0
    state = load_state(env["data"] / "runs" / run_id)
    assert state.relaunched_job == "3" and state.relaunched_at_s == pytest.approx(T0 + 5 * H)


def test_a_spot_job_the_user_resumed_is_dated_by_its_launch_and_not_taken_for_an_outage(
    env, tmp_path, capsys, s3_bucket
):
    bucket = f"s3://{s3_bucket}/runs"
    run_id = up_deadline(capsys, env, write_task(tmp_path, bucket), "--deadline", "30h", "--no-watch")
    d_h = record_of(env, run_id)["deadline"]["changeover_h"]
    run_dir = env["data"] / "runs" / run_id
    fake = FakeLauncher(env["fake"])
    ledger_progress(f"{bucket}/{run_id}", step=0, total_steps=1000)
    fake.set_state("1", "FAILED")
    set_clock(env, 2.0)  # the user relaunches it by hand, two hours in
    with watcher_lock(run_dir) as watching:
        assert watching
        code, _, err = cli(capsys, "resume", run_id)
    assert code == 0, err
    launches = record_of(env, run_id)["launches"]
    assert [launch["started_at_s"] for launch in launches] == [T0, T0 + 2 * H]  # every launch dated
    assert launches[-1]["spot"] is True
    fake.set_state("2", "STARTING")
    set_clock(env, 2.0 + d_h / 2)  # SkyPilot still provisioning the resumed spot VM
    assert cli(capsys, "watch", run_id, "--once")[0] == 0
    state = load_state(run_dir)
    assert state.availability.changes == () and state.latest is not None and state.latest.current == "spot"


def test_watch_of_a_run_without_a_deadline_is_bad_input(env, tmp_path, capsys, s3_bucket):
    run_id = up_deadline(capsys, env, write_task(tmp_path, f"s3://{s3_bucket}/runs"))
    code, _, err = cli(capsys, "watch", run_id, "--once")
    assert code == 2 and "launched without a deadline" in err and "--deadline 36h" in err
    assert "DEADLINE" not in cli(capsys, "status")[1]  # the column only when some run has one


def test_the_table_of_runs_fits_the_terminal_by_leaving_out_whole_columns(env, tmp_path, capsys, s3_bucket,
                                                                          monkeypatch):  # fmt: skip
    up_deadline(capsys, env, write_task(tmp_path, f"s3://{s3_bucket}/runs"), "--deadline", "30h", "--no-watch")
    monkeypatch.delenv("COLUMNS", raising=False)
    piped = cli(capsys, "status")[1].splitlines()  # piped without COLUMNS: every column, however wide
    assert piped[0].split() == ["RUN", "MODE", "STATE", "STEP", "MODEL", "PREEMPT", "RECOVER", "SPEND", "ENERGY",
                                "DEADLINE"]  # fmt: skip
    assert max(map(len, piped)) > 80 and not any("left out" in line for line in piped)

    monkeypatch.setenv("COLUMNS", "80")
    lines = cli(capsys, "status")[1].splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    header = lines[0].split()
    assert header[0] == "RUN" and "STATE" in header and "SPEND" in header and header[-1] == "DEADLINE"
    least_telling_first = ["MODEL", "RECOVER", "ENERGY", "PREEMPT", "MODE", "STEP"]
    left_out = [name for name in least_telling_first if name not in header]
    assert left_out and left_out == least_telling_first[: len(left_out)]
    assert set(header) | set(left_out) == set(piped[0].split())  # whole columns, nothing else
    assert lines[-1] == f"(left out to fit 80 columns: {', '.join(left_out)})"
    assert lines[1].endswith("30.0h left, spot (no watcher)") or lines[1].endswith("deciding (no watcher)"), lines


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--deadline", "30h", "--compute", "29.9h"), "--deadline: 30 h is too short for 29.9 h of compute"),
        (("--deadline", "2h"), "skygreen.deadline: no offer can finish within 2 h"),
        (("--compute", "5h"), "--compute: only used with a deadline"),
        (("--policy", "greedy"), "--policy: only used with a deadline"),
        (("--deadline", "soon"), "--deadline"),
    ],
)
def test_a_deadline_that_cannot_be_held_launches_nothing(env, tmp_path, capsys, s3_bucket, args, message):
    task = write_task(tmp_path, f"s3://{s3_bucket}/runs")
    code, out, err = cli(capsys, "up", str(task), "--no-smoke", "--catalog", str(CATALOG), "--no-watch", *args)
    assert code == 2, (out, err)
    assert message in err and "fix:" in err and "Traceback" not in err
    assert not (env["fake"] / "jobs.json").exists() or FakeLauncher(env["fake"])._jobs() == {}


def test_an_on_demand_only_task_cannot_take_a_deadline(env, tmp_path, capsys, s3_bucket):
    task = write_task(tmp_path, f"s3://{s3_bucket}/runs", spot=False)
    code, _, err = cli(capsys, "up", str(task), "--no-smoke", "--catalog", str(CATALOG), "--deadline", "30h")
    assert code == 2 and "skygreen.spot: false" in err


def test_a_launcher_that_refuses_a_switch_fails_that_poll_loudly(env, tmp_path, capsys, s3_bucket, monkeypatch):
    run_id, fake = behind_on_recovering_spot(capsys, env, tmp_path, s3_bucket)
    monkeypatch.setenv("SKYGREEN_FAKE_LAUNCHER_FAIL", "cancel:ClusterNotUpError")
    code, _, err = cli(capsys, "watch", run_id, "--once")
    assert code == 1 and "cancelling managed job 1" in err and "fix:" in err and "Traceback" not in err
    assert fake.job("1")["state"] == "RECOVERING" and len(record_of(env, run_id)["launches"]) == 1
    assert json.loads((env["data"] / "runs" / run_id / "watch.json").read_text())["switches"] == 0
    monkeypatch.delenv("SKYGREEN_FAKE_LAUNCHER_FAIL")
    code, _, err = cli(capsys, "watch", run_id, "--once")  # the next poll takes the same step
    assert code == 0 and fake.job("1")["state"] == "CANCELLED"


def test_watch_refuses_a_poll_interval_that_is_not_a_duration(env, tmp_path, capsys, s3_bucket):
    run_id = up_deadline(capsys, env, write_task(tmp_path, f"s3://{s3_bucket}/runs"), "--deadline", "30h",
                         "--no-watch")  # fmt: skip
    code, _, err = cli(capsys, "watch", run_id, "--poll", "often")
    assert code == 2 and "--poll" in err and "often" in err


def test_watch_looks_at_least_once_per_changeover_whatever_the_poll(env, tmp_path, capsys, s3_bucket):
    run_id = up_deadline(capsys, env, write_task(tmp_path, f"s3://{s3_bucket}/runs"), "--deadline", "30h",
                         "--no-watch")  # fmt: skip
    changeover_min = record_of(env, run_id)["deadline"]["changeover_h"] * 60
    FakeLauncher(env["fake"]).set_state("1", "SUCCEEDED")
    code, out, err = cli(capsys, "watch", run_id, "--poll", "99999999h")
    assert code == 0 and "unexpected" not in err, (out, err)
    assert f"polling every {changeover_min:.1f} min (the run's changeover) rather than every 6e+09 min" in out, out
    assert "finished after" in out


@pytest.mark.parametrize(
    ("state", "hours", "code", "said", "outcome"),
    [
        ("SUCCEEDED", 29.0, 0, "finished after 29.00 h of 30 h: deadline met", "deadline met"),
        ("SUCCEEDED", 31.0, 0, "deadline missed by 1.00 h", "missed by 1.00 h"),
        ("FAILED", 3.0, 1, "failed; the watcher stops", "failed"),
    ],
)
def test_the_watcher_ends_with_the_run(env, tmp_path, capsys, s3_bucket, state, hours, code, said, outcome):
    run_id = up_deadline(capsys, env, write_task(tmp_path, f"s3://{s3_bucket}/runs"), "--deadline", "30h",
                         "--no-watch")  # fmt: skip
    FakeLauncher(env["fake"]).set_state("1", state)
    set_clock(env, hours)
    got, out, err = cli(capsys, "watch", run_id)  # no --once: it returns because the run ended
    assert got == code and said in out, (out, err)
    watcher = json.loads(cli(capsys, "status", run_id, "--json")[1])["deadline"]["watcher"]
    assert said in watcher["ended"] and watcher["outcome"] == outcome
    assert watcher["ended_at_h"] == pytest.approx(hours)
    # how it ended, not the hours left to a deadline that no longer matters
    row = cli(capsys, "status")[1].splitlines()[1]
    assert row.endswith(f"  {outcome}") and "left" not in row, row
    detail = cli(capsys, "status", run_id)[1]
    assert "30 h, by " in detail and f"(ended at {hours:.2f} h: {outcome})" in detail, detail
    assert "decision       none: the run ended before the watcher decided" in detail, detail


def test_the_users_resume_between_the_watchers_cancel_and_relaunch_goes_where_the_watcher_was_moving_it(
    env, tmp_path, capsys, s3_bucket
):
    run_id, fake = behind_on_recovering_spot(capsys, env, tmp_path, s3_bucket)
    code, out, err = cli(capsys, "watch", run_id, "--once")
    assert code == 0 and "idle -> on-demand" in out, (out, err)
    assert fake.job("1")["state"] == "CANCELLED"  # half a switch: the relaunch comes at the next poll

    # the user sees a stopped run and resumes it while the watcher waits for its next poll
    with watcher_lock(env["data"] / "runs" / run_id) as watching:
        assert watching
        code, out, err = cli(capsys, "resume", run_id)
    assert code == 0, err
    assert [launch["spot"] for launch in record_of(env, run_id)["launches"]] == [True, False]
    assert fake.job("2")["task"]["resources"]["use_spot"] is False

    # the watcher finds the run where it wanted it: no second switch
    fake.set_state("2", "RUNNING")
    code, out, err = cli(capsys, "watch", run_id, "--once")
    assert code == 0 and "->" not in out, out
    assert fake.job("2")["state"] == "RUNNING" and len(record_of(env, run_id)["launches"]) == 2
    assert load_state(env["data"] / "runs" / run_id).switches == 1


@pytest.mark.parametrize("content", ["null", "[]", '{"decisions": [1]}', '{"heartbeat_at_s": "soon"}', '{"pid": "x"}'])
def test_a_watch_file_that_is_json_but_not_the_watchers_is_read_as_none(env, tmp_path, capsys, s3_bucket, content):
    run_id = up_deadline(capsys, env, write_task(tmp_path, f"s3://{s3_bucket}/runs"), "--deadline", "30h",
                         "--no-watch")  # fmt: skip
    (env["data"] / "runs" / run_id / "watch.json").write_text(content)
    code, out, err = cli(capsys, "status", run_id)
    assert code == 0 and "decision       none yet" in out, (out, err)
    code, out, err = cli(capsys, "status")
    assert code == 0 and out.splitlines()[1].startswith(run_id), (out, err)
    code, out, err = cli(capsys, "watch", run_id, "--once")
    assert code == 0, (out, err)
    assert isinstance(json.loads((env["data"] / "runs" / run_id / "watch.json").read_text())["decisions"], list)


def test_the_users_cancel_while_the_watcher_relaunches_leaves_nothing_running(env, tmp_path, capsys, s3_bucket):
    run_id, fake = behind_on_recovering_spot(capsys, env, tmp_path, s3_bucket)
    code, out, err = cli(capsys, "watch", run_id, "--once")
    assert code == 0 and fake.job("1")["state"] == "CANCELLED", (out, err)  # half a switch

    # the watcher's relaunch takes the cloud a while; the user cancels the run meanwhile
    hold = tmp_path / "hold"
    watcher = watcher_in_a_held_launch(run_id, hold)
    try:
        code, out, err = cli(capsys, "cancel", run_id)
        assert code == 0, err
        (hold / "release").touch()
        said, _ = watcher.communicate(timeout=120)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert watcher.returncode == 0, said
    jobs = FakeLauncher(env["fake"])._jobs()
    assert all(job["state"] in ("CANCELLED", "CANCELLING") for job in jobs.values()), (said, jobs)
    code, out, err = cli(capsys, "watch", run_id, "--once")
    assert code == 0 and "cancelled by the user; the watcher stops" in out


def test_the_users_resume_while_the_watcher_relaunches_launches_one_job(env, tmp_path, capsys, s3_bucket):
    run_id, fake = behind_on_recovering_spot(capsys, env, tmp_path, s3_bucket)
    code, out, err = cli(capsys, "watch", run_id, "--once")
    assert code == 0 and fake.job("1")["state"] == "CANCELLED", (out, err)  # half a switch

    hold = tmp_path / "hold"
    hold_env = {**os.environ, "SKYGREEN_FAKE_LAUNCHER_HOLD": str(hold)}
    watcher = watcher_in_a_held_launch(run_id, hold)
    user = None
    try:
        (hold / "launching").unlink()
        # the user resumes the stopped run while the watcher's launch is under way
        user = subprocess.Popen([sys.executable, "-m", "skygreen.cli", "resume", run_id], env=hold_env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        wait_for(
            lambda: (hold / "launching").exists() or user.poll() is not None,
            "the user's resume to get as far as it can",
        )
        (hold / "release").touch()
        said, _ = watcher.communicate(timeout=120)
        user_out, user_err = user.communicate(timeout=120)
    finally:
        for process in (watcher, user):
            if process is not None and process.poll() is None:
                process.kill()
        end_processes_of(env["home"])  # a resume that went through started a background watcher
    assert watcher.returncode == 0, said
    assert user.returncode == 2 and "is being relaunched right now" in user_err, (user_out, user_err)
    assert "Traceback" not in user_err
    jobs = FakeLauncher(env["fake"])._jobs()
    launched = [job_id for job_id, job in jobs.items() if job["state"] == "PENDING"]
    assert len(launched) == 1, jobs
    assert [launch["job_id"] for launch in record_of(env, run_id)["launches"]] == ["1", *launched]


@pytest.mark.parametrize(
    ("args", "value", "said", "fix"),
    [
        (("--deadline", "-5h"), "-5h", "must be greater than 0", "give a positive duration"),
        (("--deadline", "0m"), "0m", "must be greater than 0", "give a positive duration"),
        (("--deadline", "30h", "--compute", "-1h"), "-1h", "must be greater than 0", "give a positive duration"),
        (("--deadline", "2000000h"), "2000000h", "must be less than 1000000 h", "a shorter duration"),
        (("--deadline", "30h", "--compute", "1e9"), "1e9", "must be less than 1000000 h", "a shorter duration"),
        (("--deadline", "1e9h"), "1e9h", "must be less than 1000000 h", "a shorter duration"),
    ],
)
def test_a_duration_out_of_range_says_which_end_and_how_to_fix_it(env, tmp_path, capsys, s3_bucket, args, value,
                                                                  said, fix):  # fmt: skip
    task = write_task(tmp_path, f"s3://{s3_bucket}/runs")
    code, _, err = cli(capsys, "up", str(task), "--no-smoke", "--catalog", str(CATALOG), "--no-watch", *args)
    flag = args[-2]
    assert code == 2 and f"error: {flag}: the duration {said}" in err, err
    assert f"got: '{value}'" in err and f"fix: {fix}" in err and "Traceback" not in err, err
    assert not (env["fake"] / "jobs.json").exists() or FakeLauncher(env["fake"])._jobs() == {}


def test_a_deadline_run_launches_as_it_would_after_two_switches_even_when_its_plan_has_on_demand_offers(
    env, tmp_path, capsys, s3_bucket
):
    from skygreen.deadline.capacity import with_capacity

    task = write_task(tmp_path, f"s3://{s3_bucket}/runs", on_demand_fallback=True, max_candidates=10)
    run_id = up_deadline(capsys, env, task, "--deadline", "30h", "--no-watch")
    sent = FakeLauncher(env["fake"]).job("1")["task"]
    plan_offers = record_of(env, run_id)["plan_summary"]["offers"]
    assert any(not offer["spot"] for offer in plan_offers)  # the plan priced some places on-demand
    offers = json.loads(sent["envs"]["SKYGREEN_OFFERS"])
    assert offers and all(row[5] is True for row in offers)  # a spot run prices its VM as spot
    spot_prices = {(o["cloud"], o["region"], o["instance_type"]): o["spot_price_usd_per_hour"] for o in plan_offers}
    assert all(row[6] == pytest.approx(spot_prices[(row[0], row[1], row[2])]) for row in offers)
    there_and_back = with_capacity(with_capacity(sent, spot=False, offers=plan_offers), spot=True, offers=plan_offers)
    assert there_and_back == sent


def test_a_run_saving_its_last_step_on_on_demand_is_left_to_finish(env, tmp_path, capsys, s3_bucket):
    run_id, fake = behind_on_recovering_spot(capsys, env, tmp_path, s3_bucket)
    for _ in range(2):  # cancel, then relaunch on on-demand
        assert cli(capsys, "watch", run_id, "--once")[0] == 0
    fake.set_state("2", "RUNNING")

    # the runtime wrote its last step to the ledger and is uploading the final checkpoint
    ledger_progress(f"s3://{s3_bucket}/runs/{run_id}", step=1000, total_steps=1000)
    set_clock(env, 6.0)
    code, out, err = cli(capsys, "watch", run_id, "--once")
    assert code == 0 and "->" not in out, (out, err)
    assert fake.job("2")["state"] == "RUNNING"
    deadline = json.loads(cli(capsys, "status", run_id, "--json")[1])["deadline"]
    assert (deadline["decision"], deadline["reason"], deadline["switches"]) == ("on_demand", "no work left", 1)


def test_a_watcher_restarted_after_the_run_finished_dates_the_finish_from_the_ledger(env, tmp_path, capsys, s3_bucket):
    bucket = f"s3://{s3_bucket}/runs"
    run_id = up_deadline(capsys, env, write_task(tmp_path, bucket), "--deadline", "30h", "--no-watch")
    # the run completed 5 hours ago, while no watcher ran (a laptop asleep); now it is hour 31
    finished_s = time.time() - 5 * H
    write_segment(
        open_store(f"{bucket}/{run_id}"),
        Segment(run_id=run_id, key=new_segment_key(finished_s - 20 * H, token="0000aaaa"), place=Place(cloud="aws"),
                started_at=finished_s - 20 * H, updated_at=finished_s, ended_at=finished_s, end="completed",
                step=1000, train_s=70000.0, total_steps=1000),
    )  # fmt: skip
    FakeLauncher(env["fake"]).set_state("1", "SUCCEEDED")
    set_clock(env, 31.0)
    code, out, err = cli(capsys, "watch", run_id)
    assert code == 0 and "finished after 26.00 h of 30 h: deadline met" in out, (out, err)
    watcher = json.loads(cli(capsys, "status", run_id, "--json")[1])["deadline"]["watcher"]
    assert watcher["outcome"] == "deadline met" and watcher["ended_at_h"] == pytest.approx(26.0, abs=0.01)


def test_a_cancel_the_launcher_refused_leaves_the_run_watched(env, tmp_path, capsys, s3_bucket, monkeypatch):
    bucket = f"s3://{s3_bucket}/runs"
    run_id = up_deadline(capsys, env, write_task(tmp_path, bucket), "--deadline", "30h", "--no-watch")
    FakeLauncher(env["fake"]).set_state("1", "RUNNING")
    ledger_progress(f"{bucket}/{run_id}", step=10, total_steps=1000)
    monkeypatch.setenv("SKYGREEN_FAKE_LAUNCHER_FAIL", "cancel:ClusterNotUpError")
    code, _, err = cli(capsys, "cancel", run_id)
    assert code != 0 and "cancelling managed job 1" in err and "Traceback" not in err
    assert FakeLauncher(env["fake"]).job("1")["state"] == "RUNNING"  # the run goes on: so does its watcher
    # and the cancel marker is taken back: the run's next SIGTERM is a preemption, counted as one
    assert not open_store(f"{bucket}/{run_id}").exists(CANCEL_KEY)
    monkeypatch.delenv("SKYGREEN_FAKE_LAUNCHER_FAIL")
    code, out, err = cli(capsys, "watch", run_id, "--once")
    assert code == 0 and "cancelled by the user" not in out, (out, err)
    assert json.loads(cli(capsys, "status", run_id, "--json")[1])["deadline"]["watcher"]["ended"] is None


def test_a_spot_job_that_never_found_capacity_is_moved_to_on_demand(env, tmp_path, capsys, s3_bucket):
    run_id = up_deadline(capsys, env, write_task(tmp_path, f"s3://{s3_bucket}/runs"), "--deadline", "30h",
                         "--policy", "uniform_progress", "--no-watch")  # fmt: skip
    fake = FakeLauncher(env["fake"])
    fake.set_state("1", "STARTING")  # no spot anywhere: the runtime never started, the ledger is empty
    changeover_h = record_of(env, run_id)["deadline"]["changeover_h"]
    for hours in (0.0, changeover_h / 2):  # provisioning, within the changeover it was budgeted: no decision
        set_clock(env, hours)
        code, out, err = cli(capsys, "watch", run_id, "--once")
        assert code == 0 and "->" not in out and fake.job("1")["state"] == "STARTING", (out, err)
    set_clock(env, 5.0)
    code, out, err = cli(capsys, "watch", run_id, "--once")
    assert code == 0 and "idle -> on-demand" in out, (out, err)
    assert fake.job("1")["state"] == "CANCELLED"
    assert cli(capsys, "watch", run_id, "--once")[0] == 0
    assert [launch["spot"] for launch in record_of(env, run_id)["launches"]] == [True, False]


def test_a_watcher_starting_while_status_looks_is_not_turned_away(tmp_path):
    """`status` looks for a watcher with a shared lock; a watcher starting at that moment waits
    for it instead of taking the looker for a second watcher and leaving the run unguarded."""
    run_dir = tmp_path / "run"
    with watcher_lock(run_dir) as mine:
        assert mine and watcher_running(run_dir) and watcher_running(run_dir)  # any number of lookers
        with watcher_lock(run_dir, wait_s=0.0) as second:
            assert not second  # a real second watcher is still turned away
    assert not watcher_running(run_dir)

    looker = os.open(run_dir / LOCK_FILE, os.O_RDONLY)
    fcntl.flock(looker, fcntl.LOCK_SH)  # a `status` in the middle of its look
    assert not watcher_running(run_dir)  # another look at the same time: no watcher either
    took: list[bool] = []

    def start_watcher() -> None:
        with watcher_lock(run_dir, wait_s=120.0) as got:
            took.append(got)

    starting = threading.Thread(target=start_watcher)
    starting.start()
    time.sleep(0.3)  # the watcher tries while the look is under way
    os.close(looker)  # the look ends
    starting.join(timeout=300)
    assert took == [True]
