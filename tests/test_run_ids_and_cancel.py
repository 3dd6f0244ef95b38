"""Run ids by any unique prefix (as git and docker take them), in every command that takes a
RUN, `cancel` on a run that already ended: it says so and changes nothing, and a damaged run
record: `status` names it and says how to get past it.

The cloud edge is `skygreen.testing.FakeLauncher` (selected by environment, as in
test_cli_up.py); the registry, the commands and local runs are real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from skygreen.checkpoint.cancellation import CANCEL_KEY
from skygreen.errors import InputError
from skygreen.launch.launcher import JobState
from skygreen.launch.registry import Registry, RunRecord, check_run_id
from skygreen.testing import FakeLauncher


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SKY_", "SKYPILOT_", "SKYGREEN_"))}
    environ.update(
        HOME=str(home),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        SKYGREEN_LAUNCHER="skygreen.testing:FakeLauncher",
        SKYGREEN_FAKE_LAUNCHER_DIR=str(tmp_path / "fake-sky"),
        OMP_NUM_THREADS="1",
    )
    return environ


def skygreen(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "skygreen.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )


def registry(env) -> Registry:
    return Registry(root=Path(env["XDG_DATA_HOME"]) / "skygreen" / "runs")


def cloud_run(env, tmp_path: Path, run_id: str) -> RunRecord:
    """A launched cloud run as `skygreen up` records it (its job in the fake SkyPilot queue)."""
    job_id = FakeLauncher(env["SKYGREEN_FAKE_LAUNCHER_DIR"]).launch({"run": "python train.py"}, name=run_id)
    bucket = tmp_path / "bucket"
    bucket.mkdir(exist_ok=True)
    (tmp_path / "rendered.yaml").write_text("run: python train.py\n")
    record = RunRecord(
        run_id=run_id, task_path=str(tmp_path / "task.yaml"), task_name="demo", mode="cloud", launcher="fake",
        bucket=str(bucket), task_yaml=str(tmp_path / "rendered.yaml"), spec_snapshot={}, created_at="2026-12-01T00:00:00Z",
        state="PENDING",
    ).with_launch(job_id)  # fmt: skip
    return registry(env).save(record)


A = "demo-20261201-060000-1a2b"
B = "demo-20261201-060000-9f8e"
C = "other-20261201-070000-0c0c"


@pytest.fixture
def three_runs(env, tmp_path):
    for run_id in (A, B, C):
        cloud_run(env, tmp_path, run_id)


@pytest.mark.parametrize(
    "prefix, full", [(C, C), ("other", C), ("demo-20261201-060000-1", A), ("demo-20261201-060000-9f", B)]
)
def test_status_takes_any_unique_prefix(env, three_runs, prefix, full):
    out = skygreen(env, "status", prefix, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["run_id"] == full


@pytest.mark.parametrize("command", [["status"], ["logs"], ["cancel"], ["resume"], ["gc"]])
def test_an_ambiguous_prefix_lists_the_matches_and_exits_2(env, three_runs, command):
    out = skygreen(env, *command, "demo-2026")
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "run id prefix 'demo-2026' matches 2 runs" in out.stderr
    assert A in out.stderr and B in out.stderr and C not in out.stderr
    assert "Traceback" not in out.stderr


def test_every_command_that_takes_a_run_resolves_a_prefix(env, three_runs, tmp_path):
    logs = skygreen(env, "logs", "other")
    assert logs.returncode == 0 and f"({C}) submitted" in logs.stdout
    gc = skygreen(env, "gc", "other")
    assert gc.returncode == 0, gc.stderr
    assert f"{tmp_path / 'bucket'}/{C} is a local directory" in gc.stdout
    cancelled = skygreen(env, "cancel", "other")
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith(f"cancelled run {C}: CANCELLED")
    resumed = skygreen(env, "resume", "other")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.startswith(f"resumed run {C} ")


def test_an_unknown_prefix_is_still_no_such_run(env, three_runs):
    out = skygreen(env, "status", "nothing-like-it")
    assert out.returncode == 2 and "no run 'nothing-like-it'" in out.stderr


def test_a_run_id_with_a_trailing_newline_is_not_a_run_id(env, three_runs):
    """`$` would match before a final newline: the id must end where the text ends."""
    with pytest.raises(InputError, match="not a run id"):
        check_run_id("abc\n")
    out = skygreen(env, "status", A + "\n")
    assert out.returncode == 2 and "not a run id" in out.stderr, out.stderr


@pytest.mark.parametrize("ended", [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED])
def test_cancel_of_an_ended_cloud_run_says_so_and_changes_nothing(env, tmp_path, ended):
    record = cloud_run(env, tmp_path, A)
    assert record.job_id is not None
    fake = FakeLauncher(env["SKYGREEN_FAKE_LAUNCHER_DIR"])
    fake.set_state(record.job_id, ended)
    assert skygreen(env, "status", A).returncode == 0  # the record learns the end, as any status would
    run_json = registry(env).run_dir(A) / "run.json"
    before = (run_json.read_bytes(), json.dumps(fake.job(record.job_id)))
    out = skygreen(env, "cancel", A)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"run {A} already ended ({ended.value}, last checkpoint at step -); nothing to cancel\n"
    assert (run_json.read_bytes(), json.dumps(fake.job(record.job_id))) == before
    assert not (tmp_path / "bucket" / A / CANCEL_KEY).exists()


def test_cancel_of_a_stopped_local_run_leaves_it_stopped(env, tmp_path):
    """A local run that stopped (exit 75: preempted after a checkpoint) must stay resumable as
    STOPPED; a cancel used to mark it cancelled after the fact."""
    task = tmp_path / "task.yaml"
    task.write_text("name: stops\nrun: python -c 'import sys; sys.exit(75)'\n")
    env = {k: v for k, v in env.items() if k != "SKYGREEN_LAUNCHER"}
    up = skygreen(env, "up", str(task), "--local", "--no-smoke", "--detach")
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.split("launched run ")[1].split()[0]
    deadline = time.monotonic() + 240  # each poll starts a `skygreen status`: slow on a loaded machine
    while (state := json.loads(skygreen(env, "status", run_id, "--json").stdout)["state"]) != "STOPPED":
        assert time.monotonic() < deadline, state
        time.sleep(0.3)
    out = skygreen(env, "cancel", run_id[:-2])
    assert out.returncode == 0, out.stderr
    assert "already ended (STOPPED" in out.stdout and "nothing to cancel" in out.stdout
    assert json.loads(skygreen(env, "status", run_id, "--json").stdout)["state"] == "STOPPED"
    assert registry(env).load(run_id).cancelled is False


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "Expecting property name"),
        ("[1, 2]", "it holds a JSON list, not an object"),
        ("42", "it holds a JSON int, not an object"),
        ('"text"', "it holds a JSON str, not an object"),
        (json.dumps({"run_id": A, "task_path": "t.yaml"}), "missing"),
        (None, "launches must be a list of objects, got 3"),
    ],
)
def test_a_damaged_run_record_reads_as_unreadable_not_as_an_internal_error(env, tmp_path, content, problem):
    """Whatever is wrong with run.json (not JSON, not an object, a field missing or of the wrong
    kind), `status RUN` says which record and how to get past it, and `status` lists the others."""
    cloud_run(env, tmp_path, A)
    cloud_run(env, tmp_path, C)
    run_json = registry(env).run_dir(A) / "run.json"
    if content is None:  # a field of the wrong kind: launches as a number
        content = json.dumps({**json.loads(run_json.read_text()), "launches": 3})
    run_json.write_text(content)
    out = skygreen(env, "status", A)
    assert out.returncode == 1, out.stderr
    lines = out.stderr.splitlines()
    assert lines[0].startswith(f"error: run record {run_json} is unreadable: ") and problem in lines[0], out.stderr
    assert (
        lines[1] == f"  fix: repair the file, or delete {run_json.parent} to forget this run (its bucket is left as is)"
    )
    assert "Traceback" not in out.stderr and "unexpected" not in out.stderr
    listing = skygreen(env, "status")
    assert listing.returncode == 0, listing.stderr
    assert C in listing.stdout and A not in listing.stdout


def test_runs_started_in_the_same_second_with_the_same_draw_get_different_ids(tmp_path, monkeypatch):
    """Ids differ only in 4 hex digits within a second: a second `up` drawing the digits of the
    first must not take its id (it would overwrite the first's record and share its bucket)."""
    import secrets

    draws = iter(["d1f6", "d1f6", "6e7b"])
    monkeypatch.setattr(secrets, "token_hex", lambda nbytes: next(draws))  # the random edge, forced
    registry = Registry(root=tmp_path / "runs")
    now_s = 1_780_000_000.0
    first = registry.claim_run_id("tiny", now_s=now_s)
    second = registry.claim_run_id("tiny", now_s=now_s)
    assert first.endswith("-d1f6") and second.endswith("-6e7b") and first[:-4] == second[:-4]
    assert registry.run_dir(first).is_dir() and registry.run_dir(second).is_dir()


def test_an_up_that_fails_leaves_no_run_folder(env, tmp_path):
    task = tmp_path / "task.yaml"
    task.write_text("name: demo\nskygreen:\n  checkpoint: {bucket: /proc/no/such/bucket}\nrun: python train.py\n")
    (tmp_path / "train.py").write_text("print('hi')\n")
    out = subprocess.run([sys.executable, "-m", "skygreen.cli", "up", str(task), "--local", "--no-smoke"],
                         env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode != 0 and "Traceback" not in out.stderr
    runs = Path(env["XDG_DATA_HOME"]) / "skygreen" / "runs"
    assert not runs.exists() or not list(runs.iterdir()), list(runs.iterdir())
