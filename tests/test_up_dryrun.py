"""`skygreen up --dryrun` makes every check `up` makes (the CPU smoke test, the bucket
preflight against a real S3 server), then writes the YAML; only the launch is left out. What
it cannot check from this machine (a bucket without credentials here) it names in one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from helpers import user_env
from servers import FAKE_AWS_ENV

REPO = Path(__file__).resolve().parents[1]
CATALOG = REPO / "tests" / "data" / "catalog" / "v8"
SKYGREEN = [sys.executable, "-m", "skygreen.cli"]


def base_env(private_home: Path) -> dict[str, str]:
    return user_env(private_home, drop=("AWS_", "SKYGREEN_"))


def s3_env(private_home: Path, endpoint: str) -> dict[str, str]:
    return {**base_env(private_home), **FAKE_AWS_ENV, "AWS_ENDPOINT_URL_S3": endpoint}


def dryrun(env, task: Path, *flags: str) -> subprocess.CompletedProcess:
    args = [
        *SKYGREEN,
        "up",
        str(task),
        "--dryrun",
        "-o",
        str(task.parent / "sky.yaml"),
        "--catalog",
        str(CATALOG),
        *flags,
    ]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=600, cwd=REPO)


def write_task(tmp_path: Path, bucket: str, run: str = "python train.py") -> Path:
    task = {"name": "dry", "skygreen": {"gpus": ["L4", "T4"], "checkpoint": {"bucket": bucket}}, "run": run}
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(task, sort_keys=False))
    return path


def tiny_task(tmp_path: Path, bucket: str) -> Path:
    text = (REPO / "tasks" / "tiny.yaml").read_text().replace("checkpoint: {", f"checkpoint: {{bucket: {bucket}, ", 1)
    path = tmp_path / "tiny.yaml"
    path.write_text(text + f"workdir: {REPO / 'tasks'}\n")
    return path


def test_dryrun_runs_the_smoke_test_and_the_bucket_preflight(private_home, tmp_path, moto_server, s3_bucket):
    out = dryrun(s3_env(private_home, moto_server.url), tiny_task(tmp_path, f"s3://{s3_bucket}/runs"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "skygreen smoke: ok" in out.stdout
    assert f"checkpoint bucket s3://{s3_bucket}/runs: writable" in out.stdout
    assert "dry run: nothing launched" in out.stdout and (tmp_path / "sky.yaml").exists()
    assert not (private_home / ".local" / "share" / "skygreen" / "runs").exists()


def test_dryrun_fails_on_a_missing_bucket_and_writes_nothing(private_home, tmp_path, moto_server, s3_bucket):
    out = dryrun(
        s3_env(private_home, moto_server.url), write_task(tmp_path, "s3://no-such-bucket-here/runs"), "--no-smoke"
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert (
        "checkpoint bucket s3://no-such-bucket-here/runs is not usable" in out.stderr and "Traceback" not in out.stderr
    )
    assert not (tmp_path / "sky.yaml").exists()


def test_dryrun_fails_when_the_smoke_test_fails(private_home, tmp_path, moto_server, s3_bucket):
    task = write_task(tmp_path, f"s3://{s3_bucket}/runs", run="python -c 'raise SystemExit(3)'")
    out = dryrun(s3_env(private_home, moto_server.url), task)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "smoke" in out.stderr and not (tmp_path / "sky.yaml").exists()


def test_dryrun_without_credentials_says_in_one_line_what_it_did_not_check(private_home, tmp_path, moto_server):
    env = {**base_env(private_home), "AWS_ENDPOINT_URL_S3": moto_server.url, "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}  # fmt: skip
    out = dryrun(env, write_task(tmp_path, "s3://somebody-elses/runs"), "--no-smoke")
    assert out.returncode == 0, out.stdout + out.stderr
    notes = [line for line in out.stderr.splitlines() if line.startswith("note: dry run did not")]
    assert len(notes) == 2, out.stderr
    assert "checkpoint bucket s3://somebody-elses/runs" in notes[0] and "credentials" in notes[0]
    assert "smoke test (--no-smoke)" in notes[1]
    assert "Traceback" not in out.stderr and (tmp_path / "sky.yaml").exists()
    assert json.loads(json.dumps(yaml.safe_load((tmp_path / "sky.yaml").read_text())))["run"]
