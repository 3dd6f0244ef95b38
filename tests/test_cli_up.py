"""CLI flows of up/status/resume/cancel/logs with a fake launcher in place of SkyPilot.

Only the cloud edge is fake: `SKYGREEN_LAUNCHER=skygreen.testing:FakeLauncher` (selected by
environment, as a user would), which keeps its jobs in a file and fails exactly as the
SkyPilot adapter does. Everything else is real: the planner on a small catalog, the CPU smoke
test, the bucket preflight against a real S3 server (moto_server on loopback), rendering,
the registry, and checkpoints written with the checkpoint protocol.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from helpers import cli
from skygreen.testing import FakeLauncher

REPO = Path(__file__).resolve().parents[1]
CATALOG = REPO / "tests" / "data" / "catalog" / "v8"


@pytest.fixture
def env(private_home, tmp_path, monkeypatch):
    fake_dir = tmp_path / "fake-sky"
    monkeypatch.setenv("SKYGREEN_LAUNCHER", "skygreen.testing:FakeLauncher")
    monkeypatch.setenv("SKYGREEN_FAKE_LAUNCHER_DIR", str(fake_dir))
    monkeypatch.delenv("SKYGREEN_FAKE_LAUNCHER_FAIL", raising=False)
    monkeypatch.delenv("SKYGREEN_DATA_DIR", raising=False)
    return {"data": private_home / ".local" / "share" / "skygreen", "fake": fake_dir}


def write_task(
    tmp_path: Path, *, bucket: str | None, run: str = "python train.py", extra: dict | None = None, name: str = "demo"
) -> Path:
    green = {"gpus": ["L4", "T4", "A100"], "work": {"gpu_hours": 1, "gpu": "A100"}, "max_candidates": 3}
    if bucket is not None:
        green["checkpoint"] = {"bucket": bucket}
    task = {"name": name, "skygreen": green, "run": run, **(extra or {})}
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(task, sort_keys=False))
    (tmp_path / "train.py").write_text("print('training')\n")
    return path


def up_json(capsys, *args: str) -> dict:
    code, out, err = cli(capsys, "up", *args, "--catalog", str(CATALOG))
    assert code == 0, err
    run_id = out.split("launched run ")[1].split()[0]
    code, out, err = cli(capsys, "status", run_id, "--json")
    assert code == 0, err
    return json.loads(out)


def commit_checkpoint(url: str, step: int, *, meta: dict) -> str:
    """A checkpoint as the runtime commits it: blob first, then the manifest."""
    from skygreen.checkpoint.manifest import SHARED_BLOB, Manifest, blob_info, blob_key, manifest_key
    from skygreen.checkpoint.store_factory import open_store
    from skygreen.timestamps import utc_now_iso

    store = open_store(url)
    blob = f"weights at step {step}".encode()
    store.put(blob_key(step, SHARED_BLOB), blob)
    digest = hashlib.sha256(blob).hexdigest()
    manifest = Manifest(
        step=step,
        created_at=utc_now_iso(microseconds=True),
        blobs={SHARED_BLOB: blob_info(blob)},
        model_sha256=digest,
        meta=meta,
    )
    store.put(manifest_key(step), manifest.dumps())
    return digest


# ---------------------------------------------------------------- the happy path


def test_up_launches_a_managed_job_and_status_joins_it_with_the_bucket(env, tmp_path, capsys, s3_bucket):
    task = write_task(tmp_path, bucket=f"s3://{s3_bucket}/runs")
    status = up_json(capsys, str(task), "--no-smoke")
    run_id = status["run_id"]
    assert (status["state"], status["step"], status["model_sha256"], status["job_id"]) == ("PENDING", None, None, "1")

    fake = FakeLauncher(env["fake"])
    launched = fake.job("1")
    record = json.loads((env["data"] / "runs" / run_id / "run.json").read_text())
    rendered = yaml.safe_load(Path(record["task_yaml"]).read_text())
    # the rendered task, plus the launch's number for the runtime's writer lease; the job named for both
    assert launched["task"] == {**rendered, "envs": {**rendered["envs"], "SKYGREEN_LAUNCH": "1"}}
    assert launched["name"] == f"{run_id}-1"
    assert rendered["envs"]["SKYGREEN_RUN_ID"] == run_id
    assert rendered["resources"]["use_spot"] is True and len(rendered["resources"]["ordered"]) <= 3
    offers = record["plan_summary"]["offers"]
    landed = offers[1]

    fake.set_state(
        "1",
        "RUNNING",
        recovery_count=1,
        duration_s=1800.0,
        cloud=landed["cloud"],
        region=landed["region"],
        accelerators={landed["accelerator"]: 1},
    )
    digest = commit_checkpoint(
        f"s3://{s3_bucket}/runs/{run_id}",
        120,
        meta={"energy_j": 7.2e6, "preemptions": 1, "wall_s": 1700.0, "checkpoint_interval_s": 412.0},
    )
    code, out, _ = cli(capsys, "status", run_id, "--json")
    status = json.loads(out)
    assert (status["state"], status["step"], status["model_sha256"]) == ("RUNNING", 120, digest)
    assert (status["preemptions"], status["recoveries"]) == (1, 1)
    assert status["spend_usd"] == pytest.approx(0.5 * landed["price_usd_per_hour"])
    assert status["spend_estimated"] is False
    from skygreen.ledger.energy import pue_of

    assert status["gpu_energy_kwh"] == pytest.approx(2.0)  # the boards; energy_kwh is the facility's
    assert status["energy_kwh"] == pytest.approx(2.0 * pue_of(landed["cloud"]))
    assert status["checkpoint_interval_s"] == 412.0
    code, out, _ = cli(capsys, "status", run_id)
    assert "every 412 s" in out
    assert status["where"] == f"{landed['cloud']}/{landed['region']}"

    code, out, _ = cli(capsys, "status")
    assert code == 0 and run_id in out and "RUNNING" in out and "120" in out


def test_up_runs_the_cpu_smoke_test_of_the_real_task_first(env, tmp_path, capsys, s3_bucket):
    text = (REPO / "tasks" / "tiny.yaml").read_text()
    assert "checkpoint: {" in text
    text = text.replace("checkpoint: {", f"checkpoint: {{bucket: s3://{s3_bucket}/runs, ", 1)
    path = tmp_path / "tiny.yaml"
    path.write_text(text + f"workdir: {REPO / 'tasks'}\n")
    code, out, err = cli(capsys, "up", str(path), "--catalog", str(CATALOG))
    assert code == 0, err
    assert "launched run tiny-" in out
    assert FakeLauncher(env["fake"]).job("1")["state"] == "PENDING"


def test_cancel_then_resume_relaunches_the_same_run_id(env, tmp_path, capsys, s3_bucket):
    task = write_task(tmp_path, bucket=f"s3://{s3_bucket}/runs")
    run_id = up_json(capsys, str(task), "--no-smoke")["run_id"]
    fake = FakeLauncher(env["fake"])
    fake.set_state("1", "RUNNING")

    code, _, err = cli(capsys, "resume", run_id)
    assert code == 2 and "is RUNNING" in err and f"skygreen cancel {run_id}" in err

    code, out, _ = cli(capsys, "cancel", run_id)
    assert code == 0 and "CANCELLED" in out
    code, out, err = cli(capsys, "resume", run_id)
    assert code == 0, err
    assert "job 2" in out
    assert fake.job("2")["task"]["envs"]["SKYGREEN_RUN_ID"] == run_id
    first, second = fake.job("1")["task"], fake.job("2")["task"]
    assert (first["envs"].pop("SKYGREEN_LAUNCH"), second["envs"].pop("SKYGREEN_LAUNCH")) == ("1", "2")
    assert second == first  # the same task, one launch later
    status = json.loads(cli(capsys, "status", run_id, "--json")[1])
    assert (status["job_id"], status["launches"], status["state"]) == ("2", 2, "PENDING")


def test_spend_adds_up_every_launch_of_a_resumed_run(env, tmp_path, capsys, s3_bucket):
    task = write_task(tmp_path, bucket=f"s3://{s3_bucket}/runs")
    run_id = up_json(capsys, str(task), "--no-smoke")["run_id"]
    record = json.loads((env["data"] / "runs" / run_id / "run.json").read_text())
    first, second = record["plan_summary"]["offers"][:2]
    fake = FakeLauncher(env["fake"])
    where = lambda o: {"cloud": o["cloud"], "region": o["region"], "accelerators": {o["accelerator"]: 1}}  # noqa: E731
    fake.set_state("1", "FAILED", duration_s=3600.0, **where(first))
    assert cli(capsys, "resume", run_id)[0] == 0
    fake.set_state("2", "RUNNING", duration_s=1800.0, **where(second))

    status = json.loads(cli(capsys, "status", run_id, "--json")[1])
    expected = 1.0 * first["price_usd_per_hour"] + 0.5 * second["price_usd_per_hour"]
    assert status["spend_usd"] == pytest.approx(expected)
    assert status["spend_estimated"] is False


@pytest.mark.parametrize("job_state", ["SUCCEEDED", "STOPPED", "CANCELLED"])
def test_a_completed_run_reads_succeeded_and_is_not_resumed(env, tmp_path, capsys, s3_bucket, job_state):
    """Whatever ended the job (here its wrapper, killed after the trainer's last commit), a run
    whose final checkpoint is committed has SUCCEEDED: STOPPED would promise a resume."""
    task = write_task(tmp_path, bucket=f"s3://{s3_bucket}/runs")
    run_id = up_json(capsys, str(task), "--no-smoke")["run_id"]
    FakeLauncher(env["fake"]).set_state("1", job_state)
    commit_checkpoint(f"s3://{s3_bucket}/runs/{run_id}", 500, meta={"state": "completed"})
    status = json.loads(cli(capsys, "status", run_id, "--json")[1])
    assert (status["state"], status["completed"], status["step"]) == ("SUCCEEDED", True, 500)
    if job_state != "SUCCEEDED":
        assert status["detail"].startswith("finished: its final checkpoint, step 500, is committed (the job: ")
    code, _, err = cli(capsys, "resume", run_id)
    assert code == 2 and f"run {run_id} finished (SUCCEEDED): its final checkpoint, step 500, is committed" in err
    assert "fix: start a new run with `skygreen up`" in err and "Traceback" not in err


def test_a_run_settles_as_succeeded_only_once_its_job_ended_with_the_final_commit():
    from skygreen.launch.launcher import settled_state

    for ended in ("STOPPED", "CANCELLED", "FAILED", "UNKNOWN", "SUCCEEDED"):
        assert settled_state(ended, completed=True) == "SUCCEEDED"
        assert settled_state(ended, completed=False) == ended
    for going in ("RUNNING", "PENDING", "RECOVERING", "CANCELLING", "BUDGET"):
        assert settled_state(going, completed=True) == going


def test_logs_prints_the_jobs_output(env, tmp_path, capsys, s3_bucket):
    run_id = up_json(capsys, str(write_task(tmp_path, bucket=f"s3://{s3_bucket}/runs")), "--no-smoke")["run_id"]
    code, out, _ = cli(capsys, "logs", run_id)
    assert code == 0 and f"managed job 1 ({run_id}-1) submitted" in out


def test_dryrun_prints_the_plan_and_writes_the_yaml_only(env, tmp_path, capsys, s3_bucket):
    task = write_task(tmp_path, bucket=f"s3://{s3_bucket}/runs")
    output = tmp_path / "out" / "sky.yaml"
    code, out, err = cli(
        capsys, "up", str(task), "--dryrun", "--no-smoke", "--output", str(output), "--catalog", str(CATALOG)
    )
    assert code == 0, err
    assert f"wrote {output}" in out and "dry run" in out
    rendered = yaml.safe_load(output.read_text())
    assert rendered["resources"]["ordered"] and "skygreen" not in rendered
    assert not (env["fake"] / "jobs.json").exists()
    assert not (env["data"] / "runs").exists()


# ---------------------------------------------------------------- failures: clear, and nothing launched


def nothing_launched(env) -> bool:
    return not (env["fake"] / "jobs.json").exists() or json.loads((env["fake"] / "jobs.json").read_text()) == {}


def test_a_cloud_run_without_a_bucket_is_refused_before_anything(env, tmp_path, capsys):
    code, _, err = cli(capsys, "up", str(write_task(tmp_path, bucket=None)), "--no-smoke", "--catalog", str(CATALOG))
    assert code == 2
    assert "skygreen.checkpoint.bucket" in err and "--local" in err and "Traceback" not in err
    assert nothing_launched(env) and not (env["data"] / "runs").exists()


def test_a_missing_bucket_fails_the_preflight_before_any_vm(env, tmp_path, capsys, s3_bucket):
    code, _, err = cli(
        capsys,
        "up",
        str(write_task(tmp_path, bucket="s3://no-such-bucket-here/runs")),
        "--no-smoke",
        "--catalog",
        str(CATALOG),
    )
    assert code == 1
    assert "checkpoint bucket s3://no-such-bucket-here/runs is not usable" in err and err.count("fix:") == 1, err
    assert nothing_launched(env)


def test_a_failing_smoke_test_stops_the_launch(env, tmp_path, capsys, s3_bucket):
    task = write_task(tmp_path, bucket=f"s3://{s3_bucket}/runs", run="python -c 'raise SystemExit(3)'")
    code, _, err = cli(capsys, "up", str(task), "--catalog", str(CATALOG))
    assert code == 1 and "smoke test" in err
    assert nothing_launched(env)


def test_skypilot_without_cloud_access_says_sky_check_or_local(env, tmp_path, capsys, s3_bucket, monkeypatch):
    monkeypatch.setenv("SKYGREEN_FAKE_LAUNCHER_FAIL", "launch:NoCloudAccessError")
    task = write_task(tmp_path, bucket=f"s3://{s3_bucket}/runs")
    code, _, err = cli(capsys, "up", str(task), "--no-smoke", "--catalog", str(CATALOG))
    assert code == 1
    assert "no cloud enabled" in err and "sky check" in err and "--local" in err and "Traceback" not in err
    (record,) = (env["data"] / "runs").glob("*/run.json")
    assert json.loads(record.read_text())["state"] == "LAUNCH_FAILED"


def test_status_survives_a_stopped_jobs_controller(env, tmp_path, capsys, s3_bucket, monkeypatch):
    run_id = up_json(capsys, str(write_task(tmp_path, bucket=f"s3://{s3_bucket}/runs")), "--no-smoke")["run_id"]
    commit_checkpoint(f"s3://{s3_bucket}/runs/{run_id}", 40, meta={})
    monkeypatch.setenv("SKYGREEN_FAKE_LAUNCHER_FAIL", "status:ClusterNotUpError")
    code, out, err = cli(capsys, "status", run_id, "--json")
    assert code == 0, err
    status = json.loads(out)
    assert status["state"] == "PENDING" and status["step"] == 40  # last known state; progress from the bucket
    assert "jobs controller is not up" in status["detail"]
    monkeypatch.setenv("SKYGREEN_FAKE_LAUNCHER_FAIL", "cancel:ClusterNotUpError")
    code, _, err = cli(capsys, "cancel", run_id)
    assert code == 1 and "sky jobs queue --refresh" in err


def test_an_unknown_run_is_bad_input(env, capsys):
    code, _, err = cli(capsys, "status", "no-such-run")
    assert code == 2 and "no run 'no-such-run'" in err
    code, _, err = cli(capsys, "resume", "Not A Run!")
    assert code == 2 and "not a run id" in err


def test_a_broken_launcher_setting_is_bad_input(env, tmp_path, capsys, s3_bucket, monkeypatch):
    monkeypatch.setenv("SKYGREEN_LAUNCHER", "skygreen.testing")
    code, _, err = cli(
        capsys,
        "up",
        str(write_task(tmp_path, bucket=f"s3://{s3_bucket}/runs")),
        "--no-smoke",
        "--catalog",
        str(CATALOG),
    )
    assert code == 2 and "module:factory" in err


# ---------------------------------------------------------------- secrets


SECRET_ENV = "sekrit-env-value-6b1f0c"
SECRET_FILE = "sekrit-file-value-93ad2e"


def all_text_under(root: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())


def test_secret_values_appear_nowhere_skygreen_writes(env, tmp_path, capsys, s3_bucket, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", SECRET_ENV)
    extra = {"secrets": {"WANDB_API_KEY": None, "HF_TOKEN": SECRET_FILE}}
    (tmp_path / "cloud").mkdir()
    cloud_task = write_task(tmp_path / "cloud", bucket=f"s3://{s3_bucket}/runs", extra=extra)
    run_id = up_json(capsys, str(cloud_task), "--no-smoke")["run_id"]
    output = tmp_path / "dry.yaml"
    printed = [cli(capsys, "up", str(cloud_task), "--dryrun", "--no-smoke", "--output", str(output), "--catalog", str(CATALOG)),
               cli(capsys, "status"), cli(capsys, "status", run_id, "--json"), cli(capsys, "logs", run_id)]  # fmt: skip
    assert FakeLauncher(env["fake"]).job("1")["secrets_given"] == ["HF_TOKEN", "WANDB_API_KEY"]  # values went in memory

    # A local run: the training process gets the values, and prints only that it did.
    (tmp_path / "local").mkdir()

    def digest_check(name: str, value: str) -> str:  # compares digests: the command holds no value
        return f'test "$(printf %s "${name}" | sha256sum | cut -c1-16)" = {hashlib.sha256(value.encode()).hexdigest()[:16]}'

    check = f"{digest_check('WANDB_API_KEY', SECRET_ENV)} && {digest_check('HF_TOKEN', SECRET_FILE)} && echo secrets-arrived"
    local_task = write_task(tmp_path / "local", bucket=None, run=check, extra=extra)
    code, out, err = cli(capsys, "up", str(local_task), "--local", "--no-smoke")
    assert code == 0, err
    assert "secrets-arrived" in out
    printed.append((code, out, err))

    written = all_text_under(env["data"]) + all_text_under(env["fake"]) + output.read_text()
    shown = "\n".join(out + err for _, out, err in printed)
    for value in (SECRET_ENV, SECRET_FILE):
        assert value not in written
        assert value not in shown
