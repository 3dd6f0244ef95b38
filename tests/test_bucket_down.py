"""A checkpoint bucket that does not answer: `up`, `resume`, `status` and `gc` fail with one
line that names the bucket, the error and the fix, exit 1, and print no traceback; `resume`
starts no training process.

Two ways a bucket goes away, both on loopback: an endpoint where nothing listens (a closed
port), and a real `moto_server` that held the run's checkpoints and was then stopped.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import user_env
from servers import FAKE_AWS_ENV, moto_process

REPO = Path(__file__).resolve().parents[1]
SKYGREEN = [sys.executable, "-m", "skygreen.cli"]


def s3_env(private_home: Path, endpoint: str) -> dict[str, str]:
    return user_env(private_home, drop=("AWS_", "SKYGREEN_"), **FAKE_AWS_ENV, AWS_ENDPOINT_URL_S3=endpoint)


def skygreen(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SKYGREEN, *args], env=env, capture_output=True, text=True, timeout=300, cwd=REPO)


def task(tmp_path: Path, bucket: str, run: str) -> Path:
    path = tmp_path / "task.yaml"
    path.write_text(f"name: down\nskygreen:\n  checkpoint: {{bucket: {bucket}}}\nrun: {json.dumps(run)}\n")
    return path


def assert_one_line_failure(out: subprocess.CompletedProcess, bucket: str) -> None:
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    errors = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, out.stderr
    (line,) = errors
    assert line.startswith(f"error: checkpoint bucket {bucket}") and "unreachable" in line and "fix:" in line, line


def test_up_against_a_closed_port_fails_in_one_line_and_launches_nothing(private_home, tmp_path):
    """The port is bound here and never listened on, so it stays closed (connections are
    refused) and no other process can take it while the test runs."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        env = s3_env(private_home, f"http://127.0.0.1:{closed.getsockname()[1]}")
        out = skygreen(
            env, "up", str(task(tmp_path, "s3://nowhere/runs", "python -c 'print(1)'")), "--local", "--no-smoke"
        )
    assert_one_line_failure(out, "s3://nowhere/runs")
    assert "Could not connect" in out.stderr
    assert json.loads(skygreen(env, "status", "--json").stdout) == []


def test_a_server_that_never_answers_is_given_up_at_the_deadline(private_home, tmp_path):
    """Connections are accepted (by the kernel's backlog) and never answered: the client
    library alone would wait minutes; skygreen gives up at SKYGREEN_BUCKET_DEADLINE_S."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        env = s3_env(private_home, f"http://127.0.0.1:{silent.getsockname()[1]}")
        env["SKYGREEN_BUCKET_DEADLINE_S"] = "3"
        out = skygreen(
            env, "up", str(task(tmp_path, "s3://silent/runs", "python -c 'print(1)'")), "--local", "--no-smoke"
        )
    assert_one_line_failure(out, "s3://silent/runs")
    assert "no answer within 3 s" in out.stderr


@pytest.fixture
def stopped_moto(tmp_path):
    server = moto_process().start(log_dir=tmp_path)
    yield server
    server.stop()


def test_a_stopped_server_fails_resume_status_and_gc_in_one_line(private_home, tmp_path, stopped_moto):
    env = s3_env(private_home, stopped_moto.url)
    subprocess.run(
        [sys.executable, "-c", "import boto3; boto3.client('s3').create_bucket(Bucket='held')"], env=env, check=True
    )
    bucket = "s3://held/runs"
    failed = skygreen(
        env, "up", str(task(tmp_path, bucket, 'python -c "import sys; sys.exit(3)"')), "--local", "--no-smoke"
    )
    assert failed.returncode == 1 and "FAILED" in failed.stdout, failed.stdout + failed.stderr
    (row,) = json.loads(skygreen(env, "status", "--json").stdout)
    run_id = row["run_id"]
    record = Path(env["XDG_DATA_HOME"]) / "skygreen" / "runs" / run_id / "run.json"

    stopped_moto.stop()

    resumed = skygreen(env, "resume", run_id)
    assert_one_line_failure(resumed, bucket)
    assert len(json.loads(record.read_text())["launches"]) == 1  # no training process was started

    one = skygreen(env, "status", run_id)
    assert_one_line_failure(one, bucket)
    assert "FAILED" in one.stdout  # what is known locally is still shown
    every = skygreen(env, "status", "--json")
    assert_one_line_failure(every, bucket)
    assert json.loads(every.stdout)[0]["unreachable_bucket"] == f"{bucket}/{run_id}"

    gc = skygreen(env, "gc", run_id)
    assert_one_line_failure(gc, f"{bucket}/{run_id}")


def test_a_cloud_run_resumes_from_a_laptop_without_the_buckets_credentials(
    private_home, tmp_path, moto_server, s3_bucket
):
    """Only the VMs can write the bucket: resume has nothing to check here and relaunches."""
    from skygreen.testing import FakeLauncher

    env = s3_env(private_home, moto_server.url)
    env.update(SKYGREEN_LAUNCHER="skygreen.testing:FakeLauncher", SKYGREEN_FAKE_LAUNCHER_DIR=str(tmp_path / "fake"))
    path = tmp_path / "cloud.yaml"
    path.write_text(
        f"name: cloud\nskygreen: {{gpus: [L4], checkpoint: {{bucket: s3://{s3_bucket}/runs}}}}\nrun: python train.py\n"
    )
    up = skygreen(env, "up", str(path), "--no-smoke", "--catalog", str(REPO / "tests" / "data" / "catalog" / "v8"))
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.split("launched run ")[1].split()[0]
    FakeLauncher(tmp_path / "fake").set_state("1", "FAILED")

    no_credentials = {
        k: v for k, v in env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
    }
    no_credentials.update(
        AWS_EC2_METADATA_DISABLED="true",
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_CONFIG_FILE=str(tmp_path / "none"),
    )
    resumed = skygreen(no_credentials, "resume", run_id)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed run {run_id}" in resumed.stdout
